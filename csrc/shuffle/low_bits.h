// Low-bit split of a byte plane: the bit-level companion of the byte shuffle.
//
// A float16 element's top byte is its exponent plus sign or mantissa bits that
// are close to random. Coding those bits with the exponent multiplies the
// entropy coder's alphabet and halves its symbols per table lookup, for almost
// no gain in size. The split keeps each byte's high (8 - k) bits as a plane of
// small symbols (for the entropy coder) and packs the low k bits apart, raw.
//
// Packing (k in 1..7): elements go in groups of 64, and group g's low bits take
// k 64-bit little-endian words, bytes [8 k g, 8 k (g + 1)) of the packed
// stream. Byte b of the group's words j = 0..k-1, read as one 8k-bit number
// C_b = sum_j byte_b(word j) << 8 j, holds the low bits of the group's elements
// 8 p + b (p = 0..7) at bits [k p, k p + k). A last group of fewer than 64
// elements is packed as if padded with zero bytes. With this layout both
// directions handle 8 elements per 64-bit word with shifts and masks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::shuffle {

constexpr bool valid_low_bits(unsigned k) { return k >= 1 && k <= 7; }

// Bytes the packed low bits of n elements take.
size_t low_bits_packed_size(size_t n, unsigned k);

// high[i] = src[i] >> k; packed receives low_bits_packed_size(n, k) bytes.
// high may be src itself.
void split_low_bits(const uint8_t* src, size_t n, unsigned k, uint8_t* high, uint8_t* packed);

// The same packing of bits [from, from + k) of each byte (from + k <= 8), alone.
void pack_bits(const uint8_t* src, size_t n, unsigned k, unsigned from, uint8_t* packed);

// In place: plane[i] = (plane[i] << k | low bits of i) mod 256. Returns false
// when some plane[i] had a bit above 8 - k set or the last group's padding is
// not 0 (never in a valid stream).
bool join_low_bits(uint8_t* plane, size_t n, unsigned k, const uint8_t* packed);

// plane[i] = base | (low bits of i) << shift, from the packed low bits alone
// (shift + k <= 8; base's bits under the shifted low bits are OR-ed in as they
// are). Returns false when the last group's padding bits are not 0.
bool expand_low_bits(const uint8_t* packed, size_t n, unsigned k, unsigned shift, uint8_t base, uint8_t* plane);

namespace detail {
// The AVX-512 split (high may be null: pack_bits) of whole groups of 64 elements;
// the same contract as split_low_bits / pack_bits for n = 64 * groups.
void split_low_bits_groups_avx512(const uint8_t* src, size_t groups, unsigned k, unsigned from, uint8_t* high,
                                  uint8_t* packed);
// The AVX-512 join (low_bits_avx512.cpp) of whole groups of 64 elements; the
// same contract as join_low_bits for n = 64 * groups.
bool join_low_bits_groups_avx512(uint8_t* plane, size_t groups, unsigned k, const uint8_t* packed);
// The AVX-512 expand_low_bits of whole groups.
void expand_low_bits_groups_avx512(uint8_t* plane, size_t groups, unsigned k, const uint8_t* packed, unsigned shift,
                                   uint8_t base);
}  // namespace detail

}  // namespace kvcore::shuffle
