// Presence of rare byte values, AVX-512 (F, BW, VBMI): each 64-byte vector is
// looked up in a 256-entry table of the values still wanted (two 128-entry
// permutes and a blend on the top bit); the rare vectors holding one are looked
// at byte by byte, and a value found leaves the table. One pass whatever the
// number of values, stopping once all have turned up.
#include "common/arch.h"
#if KVCORE_X86
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

}  // namespace kvcore::entropy::detail
#endif  // KVCORE_X86
