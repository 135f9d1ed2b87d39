// Channel transposes, AVX-512 tall tiles (F, BW): 64 rows x 16 channels per
// tile, each 128-bit lane one 16 x 16 byte transpose (the unpacks work within
// lanes), lane L holding rows 16L..16L+15. A channel's 64 rows are then one
// 64-byte vector: one whole-line store (to_channel_major) or load (to_row_major).
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
#include "shuffle/channel_transpose.h"

namespace kvcore::shuffle::detail {
namespace {

// In-lane 16 x 16 transposes: lane L of in[i] is row i of tile L; lane L of
// out[j] becomes column j of tile L.
KV_AVX512 inline void transpose_lanes(const __m512i* in, __m512i* out) {
    __m512i a[16], m[16];
    for (int k = 0; k < 8; ++k) {  // a[k]: rows 2k, 2k+1 interleaved, columns 0-7; a[k + 8]: columns 8-15
        a[k] = _mm512_unpacklo_epi8(in[2 * k], in[2 * k + 1]);
        a[k + 8] = _mm512_unpackhi_epi8(in[2 * k], in[2 * k + 1]);
    }
    for (int h = 0; h < 16; h += 8) {  // m[h + q]: 4 rows of columns 0-3 (of the half); m[h + q + 4]: columns 4-7
        for (int q = 0; q < 4; ++q) {
            m[h + q] = _mm512_unpacklo_epi16(a[h + 2 * q], a[h + 2 * q + 1]);
            m[h + q + 4] = _mm512_unpackhi_epi16(a[h + 2 * q], a[h + 2 * q + 1]);
        }
    }
    for (int h = 0; h < 16; h += 8) {
        for (int g = h; g < h + 8; g += 4) {
            const __m512i n01a = _mm512_unpacklo_epi32(m[g], m[g + 1]), n23a = _mm512_unpackhi_epi32(m[g], m[g + 1]);
            const __m512i n01b = _mm512_unpacklo_epi32(m[g + 2], m[g + 3]);
            const __m512i n23b = _mm512_unpackhi_epi32(m[g + 2], m[g + 3]);
            out[g + 0] = _mm512_unpacklo_epi64(n01a, n01b);
            out[g + 1] = _mm512_unpackhi_epi64(n01a, n01b);
            out[g + 2] = _mm512_unpacklo_epi64(n23a, n23b);
            out[g + 3] = _mm512_unpackhi_epi64(n23a, n23b);
        }
    }
}

KV_AVX512 inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
KV_AVX512 inline void store16(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

}  // namespace

KV_AVX512 size_t to_channel_major_tall_avx512(const uint8_t* plane, size_t rows, uint32_t channels,
                                              uint8_t* const* column) {
    const size_t r64 = rows & ~size_t(63);
    const uint32_t c16 = channels & ~15u;
    const size_t s = channels;
    for (size_t r = 0; r < r64; r += 64) {
        for (uint32_t c = 0; c < c16; c += 16) {
            __m512i in[16], out[16];
            const uint8_t* p = plane + r * s + c;
            for (int i = 0; i < 16; ++i) {
                __m512i v = _mm512_castsi128_si512(load16(p + i * s));
                v = _mm512_inserti32x4(v, load16(p + (16 + i) * s), 1);
                v = _mm512_inserti32x4(v, load16(p + (32 + i) * s), 2);
                in[i] = _mm512_inserti32x4(v, load16(p + (48 + i) * s), 3);
            }
            transpose_lanes(in, out);
            for (int j = 0; j < 16; ++j) _mm512_storeu_si512(column[c + j] + r, out[j]);
        }
    }
    return r64;
}

KV_AVX512 size_t to_row_major_tall_avx512(const uint8_t* const* column, size_t rows, uint32_t channels,
                                          uint8_t* plane) {
    const size_t r64 = rows & ~size_t(63);
    const uint32_t c16 = channels & ~15u;
    const size_t s = channels;
    for (size_t r = 0; r < r64; r += 64) {
        for (uint32_t c = 0; c < c16; c += 16) {
            __m512i in[16], out[16];
            for (int j = 0; j < 16; ++j) in[j] = _mm512_loadu_si512(column[c + j] + r);
            transpose_lanes(in, out);
            uint8_t* p = plane + r * s + c;
            for (int i = 0; i < 16; ++i) {
                store16(p + i * s, _mm512_castsi512_si128(out[i]));
                store16(p + (16 + i) * s, _mm512_extracti32x4_epi32(out[i], 1));
                store16(p + (32 + i) * s, _mm512_extracti32x4_epi32(out[i], 2));
                store16(p + (48 + i) * s, _mm512_extracti32x4_epi32(out[i], 3));
            }
        }
    }
    return r64;
}

}  // namespace kvcore::shuffle::detail

#endif  // KVCORE_X86
