// "fast" mode coder for one byte plane: decompression speed first.
//
// Each symbol gets a fixed-width code (the most frequent 2^w - 1 values map to
// codes 0..2^w-2, the all-ones code escapes to an exception list of literal
// bytes), so decoding is branch-free SIMD unpacking plus a table lookup, with
// the exceptions patched afterwards. The encoder chooses w to minimize size.
// Same contract as huffman.h: self-describing, bounds-checked, decoded with n.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvcore {
struct Xxh3Stripes;
}  // namespace kvcore

namespace kvcore::entropy {

// Stream layout: fastcode_format.h. Variants (portable, AVX2) are picked with
// cpu::active_isa() and write/read identical streams.

// Largest stream for n symbols at any code width (header + n literals + 7n/8).
size_t fastcode_bound(size_t n);

// Encodes src[0, n) at the code width (1..7) that gives the smallest stream.
// `hist` may be null or hold the 256 symbol counts of src. *written = stream
// size. kBufferTooSmall when the stream would exceed cap (pass cap = n - 1 to
// get a stream only when it is smaller than the plane; else store it raw).
Status fastcode_encode(const uint8_t* src, size_t n, const uint32_t* hist, uint8_t* dst, size_t cap,
                       size_t* written);

// Decodes exactly n symbols into dst[0, n). kCorruptFrame on any inconsistency
// (the stream size must match n exactly, escape codes must match the literal
// count); never reads outside [src, src + src_size) or writes outside dst[0, n).
Status fastcode_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n);

// fastcode_decode that also feeds hash (begun over the n decoded bytes, nothing
// fed yet) the stripes it writes while they are in registers, where the AVX-512
// decoder runs (else it feeds none); xxh3_stripes_finish(hash, dst) then
// completes the digest from the rest. Null hash: fastcode_decode.
Status fastcode_decode_hashed(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n, Xxh3Stripes* hash);

// The elements of 2-byte values whose high byte plane fastcode_decode_merged
// decodes: element i = low[i] | symbol_i << 8, rotated right by one bit when
// rotate (the frame's rotated layout), is written little endian at dst + 2 i.
struct HighPlaneMerge {
    const uint8_t* low = nullptr;
    bool rotate = false;
    uint8_t* dst = nullptr;
    bool streaming = false;      // non-temporal stores where dst is 64-byte aligned (fenced before return)
    Xxh3Stripes* hash = nullptr;  // begun over the 2n output bytes, nothing fed yet
};

// fastcode_decode of n symbols, the high bytes of n 2-byte elements, that writes
// its first *merged symbols straight out as elements (m) while they are in
// registers, feeding their stripes to m.hash, and decodes the rest into
// rest[*merged, n). *merged is a whole number of XXH3 blocks of output short of
// its last byte (so the caller's merge of the rest chains the hash and ends it);
// 0 where neither the AVX-512 nor the AVX2 decoder runs. Checks as
// fastcode_decode; on an error the outputs are unspecified.
Status fastcode_decode_merged(const uint8_t* src, size_t src_size, size_t n, const HighPlaneMerge& m, uint8_t* rest,
                              size_t* merged);

// Additions to the fixed interface above.
//
// fastcode_bound(n) covers every width, so it is also the capacity that lets
// fastcode_encode_width succeed for any n. width 0 = the smallest stream (what
// fastcode_encode does), 1..7 forces that code width (tests, experiments).
// kInvalidArgument when hist is given but does not describe src.
Status fastcode_encode_width(const uint8_t* src, size_t n, const uint32_t* hist, unsigned width, uint8_t* dst,
                             size_t cap, size_t* written);

// Like fastcode_encode, with the code width and table chosen from estimated
// weights (e.g. histogram_estimate: counts from a sample, scaled to about n)
// instead of exact counts; the escapes are counted while coding, so any data
// is coded correctly whatever the weights. Same stream format.
Status fastcode_encode_estimated(const uint8_t* src, size_t n, const uint32_t* weights, uint8_t* dst, size_t cap,
                                 size_t* written);

// Size of the stream fastcode_encode would write for data with this histogram
// (n = sum of hist), without encoding; *width (optional) gets the chosen width.
// SIZE_MAX when hist does not sum to n. For choosing a plane method cheaply.
size_t fastcode_estimate(const uint32_t* hist, size_t n, unsigned* width);

}  // namespace kvcore::entropy
