// The mantissa packing of the sign split (sign_bits.h), AVX-512 VBMI variant:
// 64 bytes <-> 56 packed bytes (64 values of 7 bits) per step.
// Pack: each byte's bits 7..1 as a 7-bit value, merged pairwise into 14-, 28-
// and 56-bit fields of the 16-, 32- and 64-bit lanes, then one byte permute
// drops every lane's 8th byte. Unpack: one byte permute spreads the 7 bytes of
// each 64-bit lane's values over its 8 bytes, and vpmultishiftqb picks byte j
// of each lane at bit 7 j. Whole 64-byte loads and stores: a group's 8 bytes
// past its 56 belong to the next group (rewritten, or ignored: they land in
// bit 7 of a lane's last value, which the mask clears); the last group goes
// through a local copy, since the buffer may end there.
#include "common/arch.h"
#if KVCORE_X86
#include <cstring>

#include "common/avx512_target.h"
#include "shuffle/sign_bits.h"

namespace kvcore::shuffle::detail {
namespace {

template <typename F>
KV_AVX512 inline __m512i byte_vector(F f) {
    alignas(64) uint8_t v[64];
    for (int j = 0; j < 64; ++j) v[j] = static_cast<uint8_t>(f(j));
    return _mm512_load_si512(v);
}

}  // namespace

KV_AVX512 void pack_mantissa_groups_avx512(const uint8_t* plane, size_t groups, uint8_t* mantissa) {
    const __m512i lo7 = _mm512_set1_epi8(0x7F);
    const __m512i compact = byte_vector([](int i) { return i < 56 ? (i / 7) * 8 + i % 7 : 0; });
    for (size_t g = 0; g < groups; ++g) {
        __m512i v = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(plane + 64 * g), 1), lo7);
        v = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi16(0x007F)),
                            _mm512_srli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x7F00)), 1));
        v = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0x3FFF)),
                            _mm512_srli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x3FFF0000)), 2));
        v = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi64(0x0FFFFFFF)),
                            _mm512_srli_epi64(_mm512_and_si512(v, _mm512_set1_epi64(0x0FFFFFFF00000000ll)), 4));
        v = _mm512_permutexvar_epi8(compact, v);
        if (g + 1 < groups) {
            _mm512_storeu_si512(mantissa + 56 * g, v);
        } else {
            alignas(64) uint8_t last[64];
            _mm512_store_si512(last, v);
            std::memcpy(mantissa + 56 * g, last, 56);
        }
    }
}

KV_AVX512 void unpack_mantissa_groups_avx512(const uint8_t* mantissa, size_t groups, uint8_t* plane) {
    const __m512i lo7 = _mm512_set1_epi8(0x7F);
    // Lane q's bytes 0..6 are packed bytes 7 q .. 7 q + 6 (byte 7: any byte).
    const __m512i spread = byte_vector([](int i) { return i % 8 < 7 ? (i / 8) * 7 + i % 8 : 63; });
    const __m512i at = byte_vector([](int i) { return 7 * (i % 8); });
    for (size_t g = 0; g < groups; ++g) {
        __m512i packed;
        if (g + 1 < groups) {
            packed = _mm512_loadu_si512(mantissa + 56 * g);
        } else {
            alignas(64) uint8_t last[64] = {};
            std::memcpy(last, mantissa + 56 * g, 56);
            packed = _mm512_load_si512(last);
        }
        const __m512i v =
            _mm512_and_si512(_mm512_multishift_epi64_epi8(at, _mm512_permutexvar_epi8(spread, packed)), lo7);
        _mm512_storeu_si512(plane + 64 * g, _mm512_add_epi8(v, v));
    }
}

}  // namespace kvcore::shuffle::detail

#endif  // KVCORE_X86
