// value_counts in AVX-512 (BW, VBMI, VBMI2): the 64 bytes are sorted in one
// register by a bitonic network (21 compare-exchange steps), so equal values sit
// in runs: the run starts give the distinct values (compressed to the front) and
// the distances between starts their counts. No memory is touched but the
// input and the two lists, whatever the range of the values (the SSE2 variant
// counts a wide range in tables). A range of fewer than 16 values costs less
// by one mask compare per value, and is counted so.
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
#include "frame/value_counts_internal.h"

namespace kvcore::frame::detail {
namespace {

static_assert(kValueCountBytes == 64, "the bytes are one AVX-512 register");

// Lanes that keep the smaller byte of their pair at step (k, j) of the network:
// lane i and lane i ^ j are compared; blocks of k lanes sort up where i & k is 0
// (the last stage, k = 64, sorts all 64 up), down elsewhere.
constexpr uint64_t keeps_min(unsigned k, unsigned j) {
    uint64_t m = 0;
    for (unsigned i = 0; i < 64; ++i)
        if (((i & j) == 0) == ((i & k) == 0)) m |= uint64_t(1) << i;
    return m;
}

// Byte-index vectors for the permutes: lane i ^ j within 16-byte lanes (j < 16),
// lane i - 1 and lane i + 1 (clamped at the ends, lanes the callers mask) and i.
struct LaneIndex {
    alignas(64) uint8_t partner[4][64];  // j = 1, 2, 4, 8
    alignas(64) uint8_t before[64];
    alignas(64) uint8_t after[64];
    alignas(64) uint8_t lane[64];
    constexpr LaneIndex() : partner(), before(), after(), lane() {
        for (unsigned i = 0; i < 64; ++i) {
            for (unsigned b = 0; b < 4; ++b) partner[b][i] = uint8_t((i ^ (1u << b)) & 15);
            before[i] = uint8_t(i ? i - 1 : 0);
            after[i] = uint8_t(i < 63 ? i + 1 : 63);
            lane[i] = uint8_t(i);
        }
    }
};
constexpr LaneIndex kIndex{};

KV_AVX512 inline __m512i load(const uint8_t* index) { return _mm512_load_si512(index); }

// Lane i ^ j of v: in-lane byte shuffles up to j = 8, 128-bit lane swaps above.
template <unsigned J>
KV_AVX512 inline __m512i partner(__m512i v) {
    if constexpr (J == 16) return _mm512_shuffle_i64x2(v, v, 0xb1);  // 128-bit lanes 1, 0, 3, 2
    if constexpr (J == 32) return _mm512_shuffle_i64x2(v, v, 0x4e);  // 128-bit lanes 2, 3, 0, 1
    if constexpr (J < 16) return _mm512_shuffle_epi8(v, load(kIndex.partner[__builtin_ctz(J)]));
}

template <unsigned K, unsigned J>
KV_AVX512 inline __m512i merge_steps(__m512i v) {
    const __m512i p = partner<J>(v);
    v = _mm512_mask_min_epu8(_mm512_max_epu8(v, p), keeps_min(K, J), v, p);
    if constexpr (J > 1) return merge_steps<K, J / 2>(v);
    return v;
}

template <unsigned K>
KV_AVX512 inline __m512i sort_up(__m512i v) {
    if constexpr (K > 2) v = sort_up<K / 2>(v);
    return merge_steps<K, K / 2>(v);
}

// The largest byte of v: the four 128-bit lanes folded into one, then its bytes
// (the result in byte 0).
KV_AVX512 inline __m128i max_byte(__m512i v) {
    v = _mm512_max_epu8(v, _mm512_shuffle_i64x2(v, v, 0x4e));
    __m128i x = _mm512_castsi512_si128(_mm512_max_epu8(v, _mm512_shuffle_i64x2(v, v, 0xb1)));
    x = _mm_max_epu8(x, _mm_srli_si128(x, 8));
    x = _mm_max_epu8(x, _mm_srli_si128(x, 4));
    x = _mm_max_epu8(x, _mm_srli_si128(x, 2));
    return _mm_max_epu8(x, _mm_srli_si128(x, 1));
}

// A narrow range: one compare per value of it (as the SSE2 variant, a quarter of the work).
KV_AVX512 inline ValueCounts count_by_mask_compare(__m512i v, unsigned lo, unsigned hi, uint8_t* value, uint8_t* count) {
    unsigned distinct = 0, mode = 0;
    for (unsigned t = lo; t <= hi; ++t) {
        const unsigned n = unsigned(__builtin_popcountll(_mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(char(t)))));
        value[distinct] = uint8_t(t);  // stored either way and kept by moving on, as in the SSE2 variant
        count[distinct] = uint8_t(n);
        mode = n > count[mode] ? distinct : mode;
        distinct += n != 0;
    }
    return {distinct, mode};
}

// Ranges up to this many values are counted by compare, wider ones sorted.
constexpr unsigned kMaskCompareRange = 16;

}  // namespace

KV_AVX512 ValueCounts value_counts_avx512(const uint8_t* bytes, uint8_t* value, uint8_t* count) {
    const __m512i v = _mm512_loadu_si512(bytes);
    unsigned lo, hi;
    byte_range(bytes, &lo, &hi);
    if (hi - lo < kMaskCompareRange) return count_by_mask_compare(v, lo, hi, value, count);
    const __m512i sorted = sort_up<64>(v);
    const __m512i before = _mm512_permutexvar_epi8(load(kIndex.before), sorted);
    const uint64_t starts = ~_mm512_cmpeq_epi8_mask(sorted, before) | 1;  // lane 0 always starts a run
    const unsigned distinct = unsigned(__builtin_popcountll(starts));
    // Run j starts at start[j] and ends where run j + 1 starts (the last one at 64).
    const __m512i start = _mm512_maskz_compress_epi8(starts, load(kIndex.lane));
    const __m512i end = _mm512_mask_mov_epi8(_mm512_permutexvar_epi8(load(kIndex.after), start),
                                             uint64_t(1) << (distinct - 1), _mm512_set1_epi8(64));
    const __m512i counts = _mm512_sub_epi8(end, start);  // 0 past the last run
    const __m512i top = _mm512_broadcastb_epi8(max_byte(counts));
    const uint64_t at_top = _mm512_cmpeq_epi8_mask(counts, top);
    _mm512_storeu_si512(value, _mm512_maskz_compress_epi8(starts, sorted));
    _mm512_storeu_si512(count, counts);
    return {distinct, unsigned(__builtin_ctzll(at_top))};  // the first run of the top count: the smallest value
}

}  // namespace kvcore::frame::detail
#endif  // KVCORE_X86
