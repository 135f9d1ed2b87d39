// value_counts in AVX2, for a wide range: the 64 bytes are sorted in two
// registers by the bitonic network of the AVX-512 variant (in-lane byte
// shuffles up to distance 8, a 128-bit swap at 16, the two registers against
// each other at 32), and the runs of equal values are read off the sorted
// bytes by their start mask, one per distinct value. A narrow range keeps the
// SSE2 compares.
#include "common/arch.h"
#if KVCORE_X86
#include <immintrin.h>

#include "frame/value_counts_internal.h"

#define KV_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))

namespace kvcore::frame::detail {
namespace {

static_assert(kValueCountBytes == 64, "the bytes are two AVX2 registers");

// keep_min[b][j][i]: 0xff where lane i keeps the smaller byte of its pair at
// step (k = 2^b, 2^j) of the network (lane i against lane i ^ 2^j; blocks of k
// lanes sort up where i & k is 0, down elsewhere; k = 64 sorts all of them up).
// partner[j]: lane i ^ 2^j within 16-byte lanes, for j < 4.
struct Tables {
    alignas(32) uint8_t keep_min[7][6][64];
    alignas(32) uint8_t partner[4][32];
    constexpr Tables() : keep_min(), partner() {
        for (unsigned b = 1; b <= 6; ++b)
            for (unsigned j = 0; j < b; ++j)
                for (unsigned i = 0; i < 64; ++i)
                    keep_min[b][j][i] = ((i & (1u << j)) == 0) == ((i & (1u << b)) == 0) ? 0xff : 0;
        for (unsigned j = 0; j < 4; ++j)
            for (unsigned i = 0; i < 32; ++i) partner[j][i] = uint8_t((i ^ (1u << j)) & 15);
    }
};
constexpr Tables kTables{};

KV_AVX2 inline __m256i load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }

// One register's step at distance 2^J < 32: half of lanes `first`.. of keep_min[B][J].
template <unsigned B, unsigned J>
KV_AVX2 inline __m256i step(__m256i v, unsigned first) {
    __m256i p;
    if constexpr (J == 4) p = _mm256_permute2x128_si256(v, v, 0x01);  // swap the 128-bit halves
    else p = _mm256_shuffle_epi8(v, load(kTables.partner[J]));
    return _mm256_blendv_epi8(_mm256_max_epu8(v, p), _mm256_min_epu8(v, p), load(kTables.keep_min[B][J] + first));
}

template <unsigned B, unsigned J>
KV_AVX2 inline void merge_steps(__m256i& a, __m256i& b) {
    if constexpr (J == 5) {  // lanes i and i + 32: only at k = 64, where all sort up
        const __m256i lo = _mm256_min_epu8(a, b);
        b = _mm256_max_epu8(a, b);
        a = lo;
    } else {
        a = step<B, J>(a, 0);
        b = step<B, J>(b, 32);
    }
    if constexpr (J > 0) merge_steps<B, J - 1>(a, b);
}

template <unsigned B>
KV_AVX2 inline void sort_up(__m256i& a, __m256i& b) {
    if constexpr (B > 1) sort_up<B - 1>(a, b);
    merge_steps<B, B - 1>(a, b);
}

// Lane i of the 64 bytes (a, b) moved up to lane i + 1, with `in` entering lane 0 of each half.
KV_AVX2 inline __m256i shift_up(__m256i v, __m256i in) {
    return _mm256_alignr_epi8(v, _mm256_permute2x128_si256(in, v, 0x21), 15);
}

}  // namespace

KV_AVX2 ValueCounts value_counts_avx2(const uint8_t* bytes, uint8_t* value, uint8_t* count) {
    unsigned lo, hi;
    byte_range(bytes, &lo, &hi);
    if (hi - lo < kCompareRange) return count_by_compare(bytes, lo, hi, value, count);
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes + 32));
    sort_up<6>(a, b);
    alignas(32) uint8_t sorted[64];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sorted), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sorted + 32), b);
    // Lane 0 starts run 0 (shift_up(a, a) puts a[31] before it): set by hand.
    const uint32_t same_a = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a, shift_up(a, a))));
    const uint32_t same_b = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(b, shift_up(b, a))));
    uint64_t starts = ~(uint64_t(same_b) << 32 | same_a) | 1;
    unsigned distinct = 0, mode = 0, at = 0;
    starts &= starts - 1;  // run 0 starts at lane 0
    for (; starts; starts &= starts - 1) {
        const unsigned next = unsigned(__builtin_ctzll(starts));
        value[distinct] = sorted[at];
        count[distinct] = uint8_t(next - at);
        mode = count[distinct] > count[mode] ? distinct : mode;
        ++distinct;
        at = next;
    }
    value[distinct] = sorted[at];
    count[distinct] = uint8_t(kValueCountBytes - at);
    mode = count[distinct] > count[mode] ? distinct : mode;
    return {distinct + 1, mode};
}

}  // namespace kvcore::frame::detail
#endif  // KVCORE_X86
