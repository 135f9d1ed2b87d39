// The AVX2 counterpart of interleave_avx512.h: the step that turns the two byte
// planes of 2-byte elements back into the elements, shared by the shuffle's
// merge kernel and the kernels that merge a plane while decoding it, and the two
// ways a kernel writes its output vectors. Include in a file that defines KV_AVX2
// (the AVX2 target attribute) first.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include <immintrin.h>

#include <cstdint>

namespace kvcore::shuffle::avx2 {

// Output vectors written through the caches, or around them with non-temporal
// stores (p 32-byte aligned; the caller fences them).
struct CachedStores {
    KV_AVX2 static void put(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
struct StreamingStores {
    KV_AVX2 static void put(uint8_t* p, __m256i v) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); }
};

KV_AVX2 inline __m256i rotr16(__m256i x) { return _mm256_or_si256(_mm256_srli_epi16(x, 1), _mm256_slli_epi16(x, 15)); }

// 32 elements from their low bytes (lo) and high bytes (hi): elements 0..15 in
// *a, 16..31 in *b, each rotated right by one bit when Rot (undoing the split's
// rotation).
template <bool Rot>
KV_AVX2 inline void interleave2(__m256i lo, __m256i hi, __m256i* a, __m256i* b) {
    // After (q0 q2 q1 q3), the in-lane unpacks yield elements 0..15 and 16..31.
    lo = _mm256_permute4x64_epi64(lo, 0xD8);
    hi = _mm256_permute4x64_epi64(hi, 0xD8);
    *a = _mm256_unpacklo_epi8(lo, hi);
    *b = _mm256_unpackhi_epi8(lo, hi);
    if (Rot) *a = rotr16(*a), *b = rotr16(*b);
}

}  // namespace kvcore::shuffle::avx2

#endif  // KVCORE_X86
