#include "shuffle/packed_bits.h"

#include "common/little_endian.h"
#include "shuffle/low_bits.h"

namespace kvcore::shuffle {

VaryingBits varying_bits(const uint8_t* src, size_t n) {
    // Word-wide OR and AND (the compiler vectorizes both), then the bytes of the words.
    uint64_t any = 0, all = ~uint64_t(0);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t w = load64(src + i);
        any |= w;
        all &= w;
    }
    unsigned any8 = 0, all8 = 0xFF;
    for (unsigned b = 0; b < 8 && i >= 8; ++b) {
        any8 |= unsigned(any >> (8 * b)) & 0xFF;
        all8 &= unsigned(all >> (8 * b)) & 0xFF;
    }
    for (; i < n; ++i) {
        any8 |= src[i];
        all8 &= src[i];
    }
    VaryingBits v;
    const unsigned differ = any8 & ~all8;
    v.base = static_cast<uint8_t>(all8);
    if (differ == 0) return v;
    v.shift = static_cast<uint8_t>(__builtin_ctz(differ));
    v.width = static_cast<uint8_t>(32 - __builtin_clz(differ) - v.shift);
    return v;
}

bool valid_packing(const VaryingBits& v) {
    return v.width >= 1 && v.width <= 7 && v.shift + v.width <= 8 &&
           (v.base & (((1u << v.width) - 1) << v.shift)) == 0;
}

void pack_fields(const uint8_t* src, size_t n, const VaryingBits& v, uint8_t* packed) {
    pack_bits(src, n, v.width, v.shift, packed);
}

bool unpack_fields(const uint8_t* packed, size_t n, const VaryingBits& v, uint8_t* plane) {
    return expand_low_bits(packed, n, v.width, v.shift, v.base, plane);
}

}  // namespace kvcore::shuffle
