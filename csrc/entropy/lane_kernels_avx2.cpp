// The lane decoder, AVX2 (see lane_kernels.h): eight lanes a register in 32-bit
// words. AVX2 has no byte permute over 128 entries nor an expand, so the code
// lookup is a gather from a table of (symbol, length) words and a refill puts
// the next stream bytes into the lanes that take one with a permute from a table
// of the 256 lane masks.
#include <immintrin.h>

#include "entropy/lane_kernels.h"

#define KV_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))

namespace kvcore::entropy::lanes::detail {
namespace {

// kExpand[m][i]: the stream byte lane i takes under mask m (its rank among m's lanes).
struct ExpandTable {
    alignas(32) uint32_t index[256][8]{};
    constexpr ExpandTable() {
        for (unsigned m = 0; m < 256; ++m)
            for (unsigned i = 0, k = 0; i < 8; ++i) index[m][i] = (m >> i) & 1 ? k++ : 0;
    }
};
constexpr ExpandTable kExpand;

constexpr unsigned kVectors = kLanes / 8;

template <bool kEscapes>
KV_AVX2 size_t decode_steps(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                            size_t step, size_t whole, uint8_t* dst, const Escapes& esc) {
    alignas(32) uint32_t entry[kCodeSpace];  // symbol | length << 8
    for (unsigned i = 0; i < kCodeSpace; ++i) entry[i] = t.sym[i] | uint32_t(t.len[i]) << 8;
    alignas(32) uint32_t window[kLanes], bits[kLanes];
    for (unsigned l = 0; l < kLanes; ++l) {
        window[l] = s.window[l];
        bits[l] = s.bits[l];
    }
    const __m256i eight = _mm256_set1_epi32(8), low7 = _mm256_set1_epi32(kCodeSpace - 1);
    const __m256i low8 = _mm256_set1_epi32(0xff), low16 = _mm256_set1_epi32(0xffff);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
    const __m256i mark = _mm256_set1_epi8(char(esc.placeholder));
    const uint8_t* p = *pos;
    // Each register reads 8 bytes at p and takes at most 8: a step reads below p + kLanes.
    for (; step < whole && size_t(end - p) >= kLanes; ++step) {
        uint8_t* out = dst + step * kLanes;
        for (unsigned g = 0; g < kVectors; g += 4) {
            __m256i sym[4];
            for (unsigned u = 0; u < 4; ++u) {
                __m256i* wp = reinterpret_cast<__m256i*>(window + 8 * (g + u));
                __m256i* bp = reinterpret_cast<__m256i*>(bits + 8 * (g + u));
                __m256i w = _mm256_load_si256(wp), b = _mm256_load_si256(bp);
                const __m256i take = _mm256_cmpgt_epi32(eight, b);
                const unsigned m = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(take)));
                const __m256i next = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
                const __m256i fill = _mm256_and_si256(
                    take, _mm256_permutevar8x32_epi32(
                              next, _mm256_load_si256(reinterpret_cast<const __m256i*>(kExpand.index[m]))));
                w = _mm256_or_si256(w, _mm256_sllv_epi32(fill, _mm256_sub_epi32(eight, b)));
                b = _mm256_add_epi32(b, _mm256_and_si256(take, eight));
                p += _mm_popcnt_u32(m);
                const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(entry),
                                                         _mm256_and_si256(_mm256_srli_epi32(w, 16 - kMaxLen), low7), 4);
                const __m256i len = _mm256_srli_epi32(e, 8);
                _mm256_store_si256(wp, _mm256_and_si256(_mm256_sllv_epi32(w, len), low16));
                _mm256_store_si256(bp, _mm256_sub_epi32(b, len));
                sym[u] = _mm256_and_si256(e, low8);
            }
            const __m256i bytes = _mm256_permutevar8x32_epi32(
                _mm256_packus_epi16(_mm256_packus_epi32(sym[0], sym[1]), _mm256_packus_epi32(sym[2], sym[3])), order);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * g), bytes);
            if (kEscapes) {
                const uint64_t hits = uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(bytes, mark)));
                uint64_t& word = esc.hits[(out - dst + 8 * g) / 64];
                word = (8 * g) % 64 ? word | hits << 32 : hits;
            }
        }
    }
    for (unsigned l = 0; l < kLanes; ++l) {
        s.window[l] = uint16_t(window[l]);
        s.bits[l] = uint16_t(bits[l]);
    }
    *pos = p;
    return step;
}

}  // namespace

KV_AVX2 size_t decode_steps_avx2(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                                 size_t step, size_t n, uint8_t* dst, const Escapes& esc) {
    return esc.count ? decode_steps<true>(pos, end, t, s, step, n / kLanes, dst, esc)
                     : decode_steps<false>(pos, end, t, s, step, n / kLanes, dst, esc);
}

}  // namespace kvcore::entropy::lanes::detail
