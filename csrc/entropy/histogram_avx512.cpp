// AVX-512 (F, BW, VBMI) parts of entropy/histogram.
//
// Presence of rare byte values: each 64-byte vector is looked up in a 256-entry
// table of the values still wanted (two 128-entry permutes and a blend on the
// top bit); the rare vectors holding one are looked at byte by byte, and a value
// found leaves the table. One pass whatever the number of values, stopping once
// all have turned up.
//
// Exact counts of a plane whose values lie in a narrow window (a KV block's
// bfloat16 exponents: 14-24 values): each vector is compared with 8 of the
// window's values at a time, and each comparison's mask adds 1 to that value's
// byte counters (64 lanes), which are summed into the counts every 255 vectors.
#include "common/arch.h"
#if KVCORE_X86
#include <algorithm>

#include "common/avx512_target.h"
#include "entropy/histogram_internal.h"

namespace kvcore::entropy::detail {

KV_AVX512 void find_values_avx512(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found) {
    alignas(64) uint8_t wanted[256] = {};
    unsigned left = 0;
    for (unsigned j = 0; j < k; ++j) {
        found[j] = false;
        left += wanted[cand[j]] == 0;
        wanted[cand[j]] = 1;
    }
    __m512i T[4];
    for (unsigned t = 0; t < 4; ++t) T[t] = _mm512_load_si512(wanted + 64 * t);
    size_t i = 0;
    for (; left != 0 && i + 64 <= n; i += 64) {
        const __m512i x = _mm512_loadu_si512(src + i);
        const __m512i lo = _mm512_permutex2var_epi8(T[0], x, T[1]);
        const __m512i hi = _mm512_permutex2var_epi8(T[2], x, T[3]);
        const __m512i hit = _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
        if (_mm512_test_epi8_mask(hit, hit) == 0) continue;
        for (unsigned b = 0; b < 64; ++b) {
            const uint8_t v = src[i + b];
            if (wanted[v]) {
                wanted[v] = 0;
                --left;
            }
        }
        for (unsigned t = 0; t < 4; ++t) T[t] = _mm512_load_si512(wanted + 64 * t);
    }
    for (; left != 0 && i < n; ++i) {
        if (wanted[src[i]]) {
            wanted[src[i]] = 0;
            --left;
        }
    }
    for (unsigned j = 0; j < k; ++j) found[j] = wanted[cand[j]] == 0;
}

KV_AVX512 void count_window_avx512(const uint8_t* src, size_t n, uint8_t lo, unsigned width, uint32_t* hist) {
    for (unsigned v = 0; v < 256; ++v) hist[v] = 0;
    constexpr unsigned kPerPass = 8;
    constexpr size_t kFlushVectors = 255;  // a byte counter's most
    const size_t vectors = n / 64;
    const __m512i base = _mm512_set1_epi8(static_cast<char>(lo));
    const __m512i one = _mm512_set1_epi8(1);
    for (unsigned first = 0; first < width; first += kPerPass) {
        // Window offsets past the window (255 > width) never match.
        __m512i want[kPerPass];
        for (unsigned j = 0; j < kPerPass; ++j)
            want[j] = _mm512_set1_epi8(static_cast<char>(first + j < width ? first + j : 255));
        for (size_t v0 = 0; v0 < vectors; v0 += kFlushVectors) {
            __m512i acc[kPerPass];
            for (unsigned j = 0; j < kPerPass; ++j) acc[j] = _mm512_setzero_si512();
            const size_t v1 = std::min(vectors, v0 + kFlushVectors);
            for (size_t v = v0; v < v1; ++v) {
                const __m512i x = _mm512_sub_epi8(_mm512_loadu_si512(src + 64 * v), base);
                for (unsigned j = 0; j < kPerPass; ++j)
                    acc[j] = _mm512_mask_add_epi8(acc[j], _mm512_cmpeq_epi8_mask(x, want[j]), acc[j], one);
            }
            for (unsigned j = 0; j < kPerPass && first + j < width; ++j) {
                alignas(64) uint64_t lane[8];  // the counters summed by eights
                _mm512_store_si512(lane, _mm512_sad_epu8(acc[j], _mm512_setzero_si512()));
                uint64_t sum = 0;
                for (const uint64_t x : lane) sum += x;
                hist[uint8_t(lo + first + j)] += uint32_t(sum);
            }
        }
    }
    for (size_t i = 64 * vectors; i < n; ++i) ++hist[src[i]];
}

}  // namespace kvcore::entropy::detail
#endif  // KVCORE_X86
