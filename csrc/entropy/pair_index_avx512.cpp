// Pair-table indices through a 256-entry byte table, AVX-512 (VBMI): two
// two-register byte permutes look up 64 symbols (one for symbols below 128, one
// for the rest, blended by each byte's top bit) and one multiply-add joins each
// pair's two indices (unsigned bytes times signed byte weights: below 128 both).
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
#include "entropy/pair_index.h"

namespace kvcore::entropy::detail {

KV_AVX512 size_t ranked_pair_indices_avx512(const uint8_t* src, size_t pairs, const uint8_t* index_of,
                                            unsigned stride, uint16_t* idx) {
    const __m512i t0 = _mm512_loadu_si512(index_of);
    const __m512i t1 = _mm512_loadu_si512(index_of + 64);
    const __m512i t2 = _mm512_loadu_si512(index_of + 128);
    const __m512i t3 = _mm512_loadu_si512(index_of + 192);
    const __m512i weights = _mm512_set1_epi16(int16_t(1 | stride << 8));  // a * 1 + b * stride
    size_t j = 0;
    for (; j + 32 <= pairs; j += 32) {
        const __m512i x = _mm512_loadu_si512(src + 2 * j);
        const __m512i low = _mm512_permutex2var_epi8(t0, x, t1);
        const __m512i high = _mm512_permutex2var_epi8(t2, x, t3);
        const __m512i r = _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), low, high);
        _mm512_storeu_si512(idx + j, _mm512_maddubs_epi16(r, weights));
    }
    return j;
}

}  // namespace kvcore::entropy::detail
#endif  // KVCORE_X86
