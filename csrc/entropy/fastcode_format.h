// Stream layout of the "fast" plane coder (fastcode.h), shared by its encoder
// and decoder variants. Internal to csrc/entropy.
//
//   byte 0        code width w (1..7); the high nibble is a format version, 0
//   varint        nexc: number of escaped symbols (LEB128, at most 10 bytes, <= n)
//   2^w - 1 bytes the symbol table: code c (c < 2^w - 1) decodes to table[c];
//                 code 2^w - 1 is the escape
//   nexc bytes    the literal values of the escaped symbols, in symbol order
//   n / 256 groups of 32 * w bytes: the codes of 256 symbols each (below)
//   ceil(r * w / 8) bytes: the codes of the last r = n % 256 symbols, packed
//                 LSB first (bits past r * w are zero)
//
// The stream size must equal exactly the sum of these parts.
//
// The table may hold any values. The encoder prefers, at widths 5-7, a table
// whose rows of 16 codes are runs of 16 consecutive values (mod 256; the last
// row 15, beside the escape) when that costs few extra escapes: decoders that
// recognise such a table decode a code as its row's first value plus its low
// 4 bits. Every decoder reads every table; this is a choice, not a variant.
//
// Group layout ("sliced"): w = sum of components of c in {4, 2, 1} bits, taken
// from the largest down; a component of c bits holds code bits [o, o + c) where
// o = the sum of the larger components (so w = 7 is 4@0 + 2@4 + 1@6, w = 3 is
// 2@0 + 1@2). Symbol s = 32 * i + b of the group (i = 0..7, b = 0..31) stores the
// code bits of component (c, o) in the 32-byte vector number o + i / (8 / c),
// byte b, bits [c * f, c * f + c) with f = i % (8 / c). Decoding output vector i
// of 32 symbols is then a shift and a mask per component, in any lane width.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {
struct Xxh3Stripes;
}  // namespace kvcore

namespace kvcore::entropy::fastcode_detail {

constexpr size_t kGroup = 256;          // symbols per group
constexpr unsigned kMaxWidth = 7;       // w = 8 would never beat raw storage
constexpr size_t kMaxHeader = 1 + 10 + 127;

inline size_t varint_size(uint64_t v) {
    size_t s = 1;
    while (v >= 0x80) {
        v >>= 7;
        ++s;
    }
    return s;
}

inline size_t header_size(unsigned w, uint64_t nexc) { return 1 + varint_size(nexc) + ((size_t(1) << w) - 1); }

// Bytes of codes (groups + tail) for n symbols at width w.
inline size_t code_bytes(unsigned w, size_t n) { return (n / kGroup) * 32 * w + ((n % kGroup) * w + 7) / 8; }

inline size_t stream_size(unsigned w, size_t n, uint64_t nexc) {
    return header_size(w, nexc) + nexc + code_bytes(w, n);
}

// The AVX-512 group decoder (fastcode_avx512.cpp; needs F, BW, VBMI, VBMI2): the
// codes of `groups` whole groups into dst (256 symbols each). table: the 128 symbols
// of the codes (entry 2^w - 1, the escape, is don't-care; a row-progressive table
// is read whole like any other). Escapes take literals lit[*k_io, nexc) in order;
// false when the groups hold more escapes than that (dst then partly written).
// hash (optional) is fed the groups' output from registers (xxh3_stripes.h): it
// must be begun over the plane with no stripe fed yet, and the groups must end
// before its last 64 bytes (4 * groups <= hash->regular()).
bool decode_groups_avx512(unsigned w, const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                          uint64_t nexc, uint64_t* k_io, uint8_t* dst, Xxh3Stripes* hash = nullptr);

// decode_groups_avx512 for the high plane of 2-byte elements, merged with the
// low plane as it is decoded (fastcode.h, HighPlaneMerge): group g's elements
// go to dst[512 g, 512 g + 512), their low bytes read from low[256 g, ...).
// Each output vector feeds hash (begun over the merged output, nothing fed yet;
// the groups must end before its last 64 bytes). streaming: non-temporal
// stores (dst 64-byte aligned; the caller fences them).
bool decode_groups_merged_avx512(unsigned w, bool rotate, bool streaming, const uint8_t* codes, size_t groups,
                                 const uint8_t* table, const uint8_t* lit, uint64_t nexc, uint64_t* k_io,
                                 const uint8_t* low, uint8_t* dst, Xxh3Stripes* hash);

// The AVX-512 group encoder: `groups` groups of src into their codes at out, with
// code_of[byte] the code of each byte value (2^w - 1: escaped); escaped bytes go
// to lit[*k_io, nexc) in order. False when there are more of them than that.
bool encode_groups_avx512(unsigned w, const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit,
                          uint64_t nexc, uint64_t* k_io, uint8_t* out);

}  // namespace kvcore::entropy::fastcode_detail
