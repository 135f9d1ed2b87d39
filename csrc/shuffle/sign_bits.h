// Sign split of a byte plane: the bit-level companion of the byte shuffle for
// the sign bit.
//
// After the rotation that puts a float's whole exponent in its top byte, the
// low byte holds seven mantissa bits (bits 7..1), close to random, and the sign
// (bit 0), which is not: a KV channel (one (head, dim) position)
// leans to one sign, and neighbouring tokens' signs agree more often than
// chance; stored raw, the sign costs a whole bit anyway. The split keeps the
// seven mantissa bits packed raw and turns the signs into a plane of bytes that
// an entropy coder with channel context can shrink (frame method 9, signs).
//
// For a plane of rows x channels bytes (row-major):
// - mantissa: byte i's bits 7..1 as a 7-bit value v_i, concatenated least
//   significant bit first: bit j of v_i is bit 7 i + j of the stream (byte b
//   holds stream bits 8 b .. 8 b + 7); the last byte's unused bits are 0;
// - flips: bit c (bit c % 8 of byte c / 8) = 1 when channel c's bit 0 is 1 in
//   more than half of the rows; unused bits are 0;
// - signs: ceil(rows / 8) x channels bytes; bit k of byte g * channels + c is
//   bit 0 of plane[(8 g + k) * channels + c] XOR channel c's flip bit. Bits for
//   rows past the end are 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::shuffle {

// Bytes of each part for rows x channels bytes.
size_t sign_bits_mantissa_size(size_t n);
size_t sign_bits_flips_size(uint32_t channels);
size_t sign_bits_signs_size(size_t rows, uint32_t channels);

// Splits plane (rows x channels, channels >= 1) into its three parts.
void split_sign_bits(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* mantissa, uint8_t* flips,
                     uint8_t* signs);

// Joins the parts back into plane. Returns false when an unused bit of any part
// is set (never in a valid stream); plane's contents are then unspecified.
bool join_sign_bits(const uint8_t* mantissa, const uint8_t* flips, const uint8_t* signs, size_t rows,
                    uint32_t channels, uint8_t* plane);

namespace detail {
// The AVX-512 packing (sign_bits_avx512.cpp) of whole groups of 64 bytes, each
// 56 bytes of the mantissa stream; the same bytes as the portable packing.
void pack_mantissa_groups_avx512(const uint8_t* plane, size_t groups, uint8_t* mantissa);
void unpack_mantissa_groups_avx512(const uint8_t* mantissa, size_t groups, uint8_t* plane);
}  // namespace detail

}  // namespace kvcore::shuffle
