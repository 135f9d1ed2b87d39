// Channel transposes: dispatch, the SSE2 / AVX2 kernels, the portable tiles
// (CPUs other than x86-64) and the scalar reference.
//
// Tiles are 16 x 16 byte transposes (four rounds of unpacks). Two tile shapes:
//  * wide (16 rows x 16 or 32 channels): each channel's stream gets 16 bytes per
//    tile, so a stream's cache line is filled by four tiles far apart in time;
//  * tall (64 rows x 16 channels): each stream gets a whole 64-byte line at once.
// Tall tiles pay when the plane's rows are short: with 32 channels, the 32
// streams of a 1 MiB block sit 16 KiB apart, all in the same few L1 sets, and
// wide tiles evict each line three times before it is full (3.0 against 8.8 GB/s
// on Zen 4). With long rows, 64 of them overflow L1 and wide tiles can win.
// Limits, measured (ad hoc, best of 4 rounds x 200) on 512 KiB planes of
// synthetic bytes (a transpose moves bytes without looking at them) into
// cache-line aligned streams in shuffled order, as the grouped coder's scratch
// holds them; AVX-512 tall tiles against wide, GB/s:
//  * channel-major: tall won at every width up to 1024 channels on an Intel
//    Xeon (20 against 7 at 1024) and on Zen 4 (18 against 14);
//  * row-major: tall won on Zen 4 up to 256 channels (26 against 22), tied at
//    384 and lost from 512 on; on the Xeon it ran from 13% faster (32
//    channels) to 13% slower (256) up to 768, and lost at 1024 (6 against 16).
#include "shuffle/channel_transpose.h"

#include <algorithm>
#include <initializer_list>

#include "common/arch.h"
#include "common/little_endian.h"
#if KVCORE_X86
#include <immintrin.h>

#include "cpu/cpu_features.h"

#define KV_AVX2 __attribute__((target("avx2")))
#endif  // KVCORE_X86

namespace kvcore::shuffle {
#if KVCORE_X86
namespace {

constexpr uint32_t kTallChannelMajorMaxChannels = 1024;
constexpr uint32_t kTallRowMajorMaxChannels = 384;

// Columns 0-7 of a 16x16 byte transpose: x[k] interleaves the bytes of rows
// 2k and 2k+1 (for columns 0-7 or 8-15); col[0..7] receive those columns.
inline void transpose_half(const __m128i* x, __m128i* col) {
    __m128i m[8];  // m[q]: 4 bytes (rows 4q..4q+3) of columns 0-3; m[q + 4]: columns 4-7
    for (int q = 0; q < 4; ++q) {
        m[q] = _mm_unpacklo_epi16(x[2 * q], x[2 * q + 1]);
        m[q + 4] = _mm_unpackhi_epi16(x[2 * q], x[2 * q + 1]);
    }
    for (int g = 0; g < 8; g += 4) {  // columns g/4*4 .. +3
        const __m128i n01a = _mm_unpacklo_epi32(m[g], m[g + 1]), n23a = _mm_unpackhi_epi32(m[g], m[g + 1]);
        const __m128i n01b = _mm_unpacklo_epi32(m[g + 2], m[g + 3]), n23b = _mm_unpackhi_epi32(m[g + 2], m[g + 3]);
        col[g + 0] = _mm_unpacklo_epi64(n01a, n01b);
        col[g + 1] = _mm_unpackhi_epi64(n01a, n01b);
        col[g + 2] = _mm_unpacklo_epi64(n23a, n23b);
        col[g + 3] = _mm_unpackhi_epi64(n23a, n23b);
    }
}

// 16x16 byte transpose: row[i] (16 bytes) -> col[j] (16 bytes).
inline void transpose16x16(const __m128i* row, __m128i* col) {
    __m128i lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
        lo[k] = _mm_unpacklo_epi8(row[2 * k], row[2 * k + 1]);
        hi[k] = _mm_unpackhi_epi8(row[2 * k], row[2 * k + 1]);
    }
    transpose_half(lo, col);
    transpose_half(hi, col + 8);
}

// The same 16x16 transposes on 256-bit registers: unpacks work within 128-bit
// lanes, so each lane holds its own 16x16 tile (two tiles per pass).
KV_AVX2 inline void transpose_half_avx2(const __m256i* x, __m256i* col) {
    __m256i m[8];
    for (int q = 0; q < 4; ++q) {
        m[q] = _mm256_unpacklo_epi16(x[2 * q], x[2 * q + 1]);
        m[q + 4] = _mm256_unpackhi_epi16(x[2 * q], x[2 * q + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        const __m256i n01a = _mm256_unpacklo_epi32(m[g], m[g + 1]), n23a = _mm256_unpackhi_epi32(m[g], m[g + 1]);
        const __m256i n01b = _mm256_unpacklo_epi32(m[g + 2], m[g + 3]), n23b = _mm256_unpackhi_epi32(m[g + 2], m[g + 3]);
        col[g + 0] = _mm256_unpacklo_epi64(n01a, n01b);
        col[g + 1] = _mm256_unpackhi_epi64(n01a, n01b);
        col[g + 2] = _mm256_unpacklo_epi64(n23a, n23b);
        col[g + 3] = _mm256_unpackhi_epi64(n23a, n23b);
    }
}

KV_AVX2 inline void transpose16x16_avx2(const __m256i* row, __m256i* col) {
    __m256i lo[8], hi[8];
    for (int k = 0; k < 8; ++k) {
        lo[k] = _mm256_unpacklo_epi8(row[2 * k], row[2 * k + 1]);
        hi[k] = _mm256_unpackhi_epi8(row[2 * k], row[2 * k + 1]);
    }
    transpose_half_avx2(lo, col);
    transpose_half_avx2(hi, col + 8);
}

KV_AVX2 inline __m256i load2x16(const uint8_t* lo, const uint8_t* hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// ---- row-major -> channel-major ----

// Rows [r_begin, r_end), channels from c_done on (channels below it are done):
// 16 x 16 tiles, then single bytes.
void to_channel_major_rest(const uint8_t* plane, size_t r_begin, size_t r_end, uint32_t channels,
                           uint8_t* const* column, uint32_t c_done) {
    const size_t r16 = r_begin + ((r_end - r_begin) & ~size_t(15));
    const uint32_t c16 = channels & ~15u;
    for (size_t r = r_begin; r < r16; r += 16) {
        for (uint32_t c = c_done; c < c16; c += 16) {
            __m128i in[16], out[16];
            const uint8_t* p = plane + r * channels + c;
            for (int i = 0; i < 16; ++i, p += channels) in[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
            transpose16x16(in, out);
            for (int j = 0; j < 16; ++j) _mm_storeu_si128(reinterpret_cast<__m128i*>(column[c + j] + r), out[j]);
        }
    }
    // Single bytes: the channels past the tiles, then the rows past them.
    if (c16 < channels)
        for (size_t r = r_begin; r < r16; ++r)
            for (uint32_t c = c16; c < channels; ++c) column[c][r] = plane[r * channels + c];
    for (size_t r = r16; r < r_end; ++r)
        for (uint32_t c = 0; c < channels; ++c) column[c][r] = plane[r * channels + c];
}

// Wide tiles, 16 rows x 32 channels, over rows [r_begin, r_begin + 16k);
// returns the channels done (a multiple of 32).
KV_AVX2 uint32_t to_channel_major_wide_avx2(const uint8_t* plane, size_t r_begin, size_t r_end, uint32_t channels,
                                            uint8_t* const* column) {
    const size_t r16 = r_begin + ((r_end - r_begin) & ~size_t(15));
    const uint32_t c32 = channels & ~31u;
    for (size_t r = r_begin; r < r16; r += 16) {
        for (uint32_t c = 0; c < c32; c += 32) {
            __m256i in[16], out[16];
            const uint8_t* p = plane + r * channels + c;
            for (int i = 0; i < 16; ++i, p += channels) in[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            transpose16x16_avx2(in, out);
            for (int j = 0; j < 16; ++j) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(column[c + j] + r), _mm256_castsi256_si128(out[j]));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(column[c + 16 + j] + r), _mm256_extracti128_si256(out[j], 1));
            }
        }
    }
    return c32;
}

// Tall tiles as two 32-row halves (lane 0: rows i, lane 1: rows 16 + i), so a
// stream's line is written by two consecutive 32-byte stores.
KV_AVX2 size_t to_channel_major_tall_avx2(const uint8_t* plane, size_t rows, uint32_t channels,
                                          uint8_t* const* column) {
    const size_t r64 = rows & ~size_t(63);
    const uint32_t c16 = channels & ~15u;
    for (size_t r = 0; r < r64; r += 32) {
        for (uint32_t c = 0; c < c16; c += 16) {
            __m256i in[16], out[16];
            const uint8_t* p = plane + r * channels + c;
            for (int i = 0; i < 16; ++i) in[i] = load2x16(p + i * channels, p + (16 + i) * channels);
            transpose16x16_avx2(in, out);
            for (int j = 0; j < 16; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(column[c + j] + r), out[j]);
        }
    }
    return r64;
}

// ---- channel-major -> row-major ----

// 16 rows x 8 channels: column[i] + r holds 16 bytes (rows r..r+15) of channel c+i;
// row j of the result (8 bytes, channels c..c+7) goes to out + j * stride.
inline void transpose16x8(const uint8_t* const* column, size_t r, uint8_t* out, size_t stride) {
    __m128i a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(column[i] + r));
    __m128i t[8];
    for (int k = 0; k < 4; ++k) {
        t[2 * k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);      // rows 0-7, channels 2k, 2k+1
        t[2 * k + 1] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);  // rows 8-15
    }
    // Channels 0-3 (from t0..t3) and 4-7 (from t4..t7), four rows per register.
    const __m128i u[8] = {_mm_unpacklo_epi16(t[0], t[2]), _mm_unpackhi_epi16(t[0], t[2]),
                          _mm_unpacklo_epi16(t[1], t[3]), _mm_unpackhi_epi16(t[1], t[3]),
                          _mm_unpacklo_epi16(t[4], t[6]), _mm_unpackhi_epi16(t[4], t[6]),
                          _mm_unpacklo_epi16(t[5], t[7]), _mm_unpackhi_epi16(t[5], t[7])};
    for (int q = 0; q < 4; ++q) {  // rows 4q .. 4q+3
        const __m128i lo = _mm_unpacklo_epi32(u[q], u[q + 4]);
        const __m128i hi = _mm_unpackhi_epi32(u[q], u[q + 4]);
        uint8_t* row = out + size_t(4 * q) * stride;
        // (8-byte stores at any alignment: _mm_storel_epi64 is declared for unaligned use)
        _mm_storel_epi64(reinterpret_cast<__m128i*>(row), lo);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(row + stride), _mm_unpackhi_epi64(lo, lo));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(row + 2 * stride), hi);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(row + 3 * stride), _mm_unpackhi_epi64(hi, hi));
    }
}

// Rows [r_begin, r_end), channels from c_done on (channels below it are done;
// c_done is 0 or channels & ~15): 16 x 16 tiles, 16 x 8 tiles, then single bytes.
void to_row_major_rest(const uint8_t* const* column, size_t r_begin, size_t r_end, uint32_t channels,
                       uint8_t* plane, uint32_t c_done) {
    const size_t r16 = r_begin + ((r_end - r_begin) & ~size_t(15));
    const uint32_t c16 = channels & ~15u;
    const uint32_t c8 = channels & ~7u;
    for (size_t r = r_begin; r < r16; r += 16) {
        uint8_t* row = plane + r * channels;
        for (uint32_t c = c_done; c < c16; c += 16) {
            __m128i in[16], out[16];
            for (int i = 0; i < 16; ++i) in[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(column[c + i] + r));
            transpose16x16(in, out);
            uint8_t* p = row + c;
            for (int j = 0; j < 16; ++j, p += channels) _mm_storeu_si128(reinterpret_cast<__m128i*>(p), out[j]);
        }
        for (uint32_t c = c16; c < c8; c += 8) transpose16x8(column + c, r, row + c, channels);
    }
    if (c8 < channels)
        for (size_t r = r_begin; r < r16; ++r)
            for (uint32_t c = c8; c < channels; ++c) plane[r * channels + c] = column[c][r];
    for (size_t r = r16; r < r_end; ++r)
        for (uint32_t c = 0; c < channels; ++c) plane[r * channels + c] = column[c][r];
}

// Wide tiles, 32 rows x 16 channels (rows r..r+15 in the low lanes, r+16.. in
// the high), from r_begin; returns the first row not done.
KV_AVX2 size_t to_row_major_wide_avx2(const uint8_t* const* column, size_t r_begin, size_t rows, uint32_t channels,
                                      uint8_t* plane) {
    const uint32_t c16 = channels & ~15u;
    size_t r = r_begin;
    for (; r + 32 <= rows; r += 32) {
        uint8_t* row = plane + r * channels;
        for (uint32_t c = 0; c < c16; c += 16) {
            __m256i in[16], out[16];
            for (int i = 0; i < 16; ++i) in[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column[c + i] + r));
            transpose16x16_avx2(in, out);
            uint8_t* p = row + c;
            uint8_t* q = p + 16 * size_t(channels);
            for (int j = 0; j < 16; ++j, p += channels, q += channels) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(out[j]));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm256_extracti128_si256(out[j], 1));
            }
        }
    }
    return r;
}

// Tall tiles as two 32-row halves: each stream's line is read by two
// consecutive 32-byte loads.
KV_AVX2 size_t to_row_major_tall_avx2(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane) {
    const size_t r64 = rows & ~size_t(63);
    const uint32_t c16 = channels & ~15u;
    for (size_t r = 0; r < r64; r += 32) {
        for (uint32_t c = 0; c < c16; c += 16) {
            __m256i in[16], out[16];
            for (int j = 0; j < 16; ++j) in[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(column[c + j] + r));
            transpose16x16_avx2(in, out);
            uint8_t* p = plane + r * channels + c;
            for (int i = 0; i < 16; ++i) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i * channels), _mm256_castsi256_si128(out[i]));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p + (16 + i) * channels), _mm256_extracti128_si256(out[i], 1));
            }
        }
    }
    return r64;
}

}  // namespace
#endif  // KVCORE_X86

namespace detail {
namespace {

// Swaps the kShift-bit blocks that kMask selects in b with the blocks above them in a.
template <unsigned kShift, uint64_t kMask>
inline void swap_blocks(uint64_t& a, uint64_t& b) {
    const uint64_t t = ((a >> kShift) ^ b) & kMask;
    b ^= t;
    a ^= t << kShift;
}

// Transposes 8 x 8 bytes held as eight 64-bit words (word k: row k): the 2 x 2
// blocks of bytes, then of 2 bytes, then of 4 swap across the diagonal. The same
// on either byte order (reversing both indices commutes with transposing).
inline void transpose8x8(uint64_t* x) {
    for (unsigned i = 0; i < 8; i += 2) swap_blocks<8, 0x00ff00ff00ff00ffull>(x[i], x[i + 1]);
    for (unsigned i : {0u, 1u, 4u, 5u}) swap_blocks<16, 0x0000ffff0000ffffull>(x[i], x[i + 2]);
    for (unsigned i = 0; i < 4; ++i) swap_blocks<32, 0x00000000ffffffffull>(x[i], x[i + 4]);
}

// The portable tiles run down 64 rows of 8 channels before moving across, so that
// each stream's cache line is read or written whole at once (the streams of a
// tall plane sit a multiple of 4 KiB apart, in the same few L1 sets: going across
// 8 rows at a time, stories260K's 32 streams lost their lines before the next
// tile came back to them), across stripes of 64 channels, whose 64 rows stay in L1.
constexpr size_t kTileRows = 64;
constexpr uint32_t kTileStripe = 64;

// Calls tile(r, c) for each 8 x 8 tile of rows [0, r8) x channels [0, c8), in that order.
template <typename Tile>
inline void for_each_tile(size_t r8, uint32_t c8, Tile tile) {
    for (uint32_t c0 = 0; c0 < c8; c0 += kTileStripe)
        for (size_t r0 = 0; r0 < r8; r0 += kTileRows)
            for (uint32_t c = c0; c < std::min(c0 + kTileStripe, c8); c += 8)
                for (size_t r = r0; r < std::min(r0 + kTileRows, r8); r += 8) tile(r, c);
}

}  // namespace

void to_channel_major_tiled(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column) {
    const size_t r8 = rows & ~size_t(7);
    const uint32_t c8 = channels & ~7u;
    for_each_tile(r8, c8, [&](size_t r, uint32_t c) {
        uint64_t x[8];
        for (unsigned k = 0; k < 8; ++k) x[k] = load64(plane + (r + k) * channels + c);
        transpose8x8(x);
        for (unsigned k = 0; k < 8; ++k) store64(column[c + k] + r, x[k]);
    });
    for (size_t r = 0; r < rows; ++r)  // what the tiles leave: the last rows, the last channels
        for (uint32_t c = r < r8 ? c8 : 0; c < channels; ++c) column[c][r] = plane[r * channels + c];
}

void to_row_major_tiled(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane) {
    const size_t r8 = rows & ~size_t(7);
    const uint32_t c8 = channels & ~7u;
    for_each_tile(r8, c8, [&](size_t r, uint32_t c) {
        uint64_t x[8];
        for (unsigned k = 0; k < 8; ++k) x[k] = load64(column[c + k] + r);
        transpose8x8(x);
        for (unsigned k = 0; k < 8; ++k) store64(plane + (r + k) * channels + c, x[k]);
    });
    for (size_t r = 0; r < rows; ++r)
        for (uint32_t c = r < r8 ? c8 : 0; c < channels; ++c) plane[r * channels + c] = column[c][r];
}

void to_channel_major_scalar(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column) {
    for (size_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < channels; ++c) column[c][r] = plane[r * channels + c];
}

void to_row_major_scalar(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane) {
    for (size_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < channels; ++c) plane[r * channels + c] = column[c][r];
}

}  // namespace detail

void to_channel_major(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column) {
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    size_t r_tall = 0;  // rows [0, r_tall) of channels [0, channels & ~15) done by tall tiles
    if (channels >= 16 && channels <= kTallChannelMajorMaxChannels) {
        if (isa & cpu::kIsaAvx512) {
            r_tall = detail::to_channel_major_tall_avx512(plane, rows, channels, column);
        } else if (isa & cpu::kIsaAvx2) {
            r_tall = to_channel_major_tall_avx2(plane, rows, channels, column);
        }
        if (r_tall) to_channel_major_rest(plane, 0, r_tall, channels, column, channels & ~15u);
    }
    const uint32_t c_done = (isa & cpu::kIsaAvx2) ? to_channel_major_wide_avx2(plane, r_tall, rows, channels, column) : 0;
    to_channel_major_rest(plane, r_tall, rows, channels, column, c_done);
#else  // the tiles above are SSE2 at least: the portable tiles elsewhere
    detail::to_channel_major_tiled(plane, rows, channels, column);
#endif  // KVCORE_X86
}

void to_row_major(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane) {
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    const uint32_t c16 = channels & ~15u;
    size_t r_tall = 0;  // rows [0, r_tall) of channels [0, c16) done by tall tiles
    if (channels >= 16 && channels <= kTallRowMajorMaxChannels) {
        if (isa & cpu::kIsaAvx512) {
            r_tall = detail::to_row_major_tall_avx512(column, rows, channels, plane);
        } else if (isa & cpu::kIsaAvx2) {
            r_tall = to_row_major_tall_avx2(column, rows, channels, plane);
        }
        if (r_tall) to_row_major_rest(column, 0, r_tall, channels, plane, c16);
    }
    size_t r_wide = r_tall;  // rows [r_tall, r_wide) of channels [0, c16) done by wide tiles
    if (isa & cpu::kIsaAvx2) {
        r_wide = to_row_major_wide_avx2(column, r_tall, rows, channels, plane);
        if (r_wide > r_tall) to_row_major_rest(column, r_tall, r_wide, channels, plane, c16);
    }
    to_row_major_rest(column, r_wide, rows, channels, plane, 0);
#else  // the tiles above are SSE2 at least: the portable tiles elsewhere
    detail::to_row_major_tiled(column, rows, channels, plane);
#endif  // KVCORE_X86
}

}  // namespace kvcore::shuffle
