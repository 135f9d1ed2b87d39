// Packed fields: a byte plane whose bytes differ only in a few adjacent bits.
//
// After the byte shuffle some planes hold a handful of values that differ in
// one to a few adjacent bits, close to uniformly: the sign byte of a float32
// upcast from bfloat16 or float16 (rotated: the sign alone, 0 or 1), the byte
// of the float16 mantissa's two lowest bits in such a float32 (0, 64, 128,
// 192). A Huffman code spends at least one bit a byte and exactly the field's
// width on a uniform field, at its coder's speed; packing the field raw costs
// the same bits at memory speed.
//
// Bytes are base | field << shift with field < 2^width (base zero on the
// field's bits). The fields are packed as shuffle/low_bits.h packs low bits,
// with k = width.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::shuffle {

struct VaryingBits {
    uint8_t base = 0;   // the bits every byte shares (0 on the field)
    uint8_t shift = 0;  // the field's lowest bit
    uint8_t width = 0;  // its width: 0 for a constant plane (then base is the byte)
};

// The narrowest field that holds every bit in which bytes of src[0, n) differ (n >= 1).
VaryingBits varying_bits(const uint8_t* src, size_t n);

// Whether v describes a field that can be packed: 1 <= width <= 7, shift + width <= 8,
// base zero on the field.
bool valid_packing(const VaryingBits& v);

// packed receives low_bits_packed_size(n, v.width) bytes: each byte's field.
// Every byte of src must be v.base | field << v.shift.
void pack_fields(const uint8_t* src, size_t n, const VaryingBits& v, uint8_t* packed);

// plane[i] = v.base | field i << v.shift (v valid). Returns false when the
// packing's padding bits are not 0 (never in a valid stream).
bool unpack_fields(const uint8_t* packed, size_t n, const VaryingBits& v, uint8_t* plane);

}  // namespace kvcore::shuffle
