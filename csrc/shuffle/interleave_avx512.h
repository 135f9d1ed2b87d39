// The AVX-512 step that turns the two byte planes of 2-byte elements back into
// the elements (merge's inner step), shared by the shuffle's merge kernel and
// the kernels that merge a plane while decoding it (entropy/fastcode_avx512.cpp). Also
// the two ways a kernel writes its output vectors. Include after
// common/avx512_target.h.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include <cstdint>

namespace kvcore::shuffle {

// Output vectors written through the caches, or around them with non-temporal
// stores (p 64-byte aligned; the caller fences them).
struct CachedStores {
    KV_AVX512 static void put(uint8_t* p, __m512i v) { _mm512_storeu_si512(p, v); }
};
struct StreamingStores {
    KV_AVX512 static void put(uint8_t* p, __m512i v) { _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v); }
};

// One VBMI2 funnel shift in place of two shifts and an or: merge_hashed's rotated
// 2-byte kernel ran 1.19x faster with it on Zen 4 (1 MiB blocks in cache, aligned),
// split_hashed's (rotl16, shuffle_avx512.cpp) 1.17x: both are short of vector ports.
KV_AVX512 inline __m512i rotr16(__m512i x) { return _mm512_shrdi_epi16(x, x, 1); }

// 64 elements from their low bytes (lo) and high bytes (hi): elements 0..31 in
// *a, 32..63 in *b, each rotated right by one bit when Rot (undoing the split's
// rotation).
class Interleave2 {
public:
    KV_AVX512 Interleave2() {
        // Output byte j of elements 0..31: low plane byte j/2 (even j) or high plane byte j/2 (odd j, +64).
        alignas(64) uint8_t first[64], second[64];
        for (int j = 0; j < 64; ++j) {
            first[j] = static_cast<uint8_t>((j & 1 ? 64 : 0) + j / 2);
            second[j] = static_cast<uint8_t>((j & 1 ? 64 : 0) + 32 + j / 2);
        }
        first_ = _mm512_load_si512(first);
        second_ = _mm512_load_si512(second);
    }
    template <bool Rot>
    KV_AVX512 void apply(__m512i lo, __m512i hi, __m512i* a, __m512i* b) const {
        *a = _mm512_permutex2var_epi8(lo, first_, hi);
        *b = _mm512_permutex2var_epi8(lo, second_, hi);
        if (Rot) *a = rotr16(*a), *b = rotr16(*b);
    }

private:
    __m512i first_, second_;
};

}  // namespace kvcore::shuffle

#endif  // KVCORE_X86
