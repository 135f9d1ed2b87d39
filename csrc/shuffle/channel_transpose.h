// Channel transposes: a byte plane of `rows` x `channels` (row-major, one row per
// token) to one contiguous stream per channel and back. The channel-grouped
// coder (entropy/channel_groups) codes each group of channels as one stream.
//
// column[c] is where channel c's `rows` bytes go (to_channel_major) or come from
// (to_row_major); the streams may sit anywhere and in any order, but must not
// overlap the plane.
//
// Like split/merge, every ISA variant gives the same bytes; the widest one in
// cpu::active_isa() runs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::shuffle {

void to_channel_major(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column);
void to_row_major(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane);

namespace detail {

// The AVX-512 tiles of 64 rows x 16 channels, which read and write each
// channel's stream a whole 64-byte line at a time. They do rows [0, rows & ~63)
// of channels [0, channels & ~15) and return the rows done.
size_t to_channel_major_tall_avx512(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column);
size_t to_row_major_tall_avx512(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane);

// The portable tiles of 8 rows x 8 channels (64-bit words), which CPUs other than
// x86-64 run; the whole plane.
void to_channel_major_tiled(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column);
void to_row_major_tiled(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane);

// The portable reference (tests compare the variants with it).
void to_channel_major_scalar(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column);
void to_row_major_scalar(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane);

}  // namespace detail
}  // namespace kvcore::shuffle
