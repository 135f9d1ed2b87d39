// Byte-plane shuffle: the filter in front of every entropy coder.
//
// An element of `elem_size` bytes (1, 2, 4) is split into `elem_size` planes;
// plane p holds byte p (little endian) of every element, so the top plane holds
// the exponent-carrying bytes of all elements together.
//
// Options (struct PlaneTransform), applied in this order on split and undone in
// reverse on merge:
//  * rotate: rotate each element's bits left by one before splitting. For bf16
//    and fp32 the top byte then holds the whole 8-bit exponent and the sign moves
//    to bit 0 of the lowest byte; for fp16 the top byte holds the 5-bit exponent
//    and the top 3 mantissa bits.
//  * residual: a per-channel byte is subtracted (mod 256) from the top plane:
//    top[i] -= residual[(phase + i) % period]. A channel is one (head, dim)
//    position; subtracting each channel's most common exponent byte concentrates
//    the top plane's distribution (a cheap form of channel conditioning).
//
// Every function has a scalar, an AVX2 and an AVX-512 variant; the widest one in
// cpu::active_isa() runs. Results are identical across variants.
#pragma once

#include <cstddef>
#include <cstdint>

#include "checksum/xxh3_stripes.h"

namespace kvcore::shuffle {

struct PlaneTransform {
    bool rotate = false;
    const uint8_t* residual = nullptr;  // nullptr: no residual
    uint32_t period = 1;                // channels; residual has `period` bytes
    uint32_t phase = 0;                 // channel of element 0, < period
};

// How split and merge_hashed write their output: through the caches, or
// streaming around them (non-temporal stores), for outputs too large to stay
// cached. Fenced before the call returns. merge_hashed streams where dst is
// 64-byte aligned; split streams with AVX-512, at any alignment (its planes'
// lines are written whole, each from two vectors where a plane starts inside one).
enum class Stores : uint8_t { kCached, kStreaming };

// planes[p] receives n bytes for p in [0, elem_size). src may be unaligned.
void split(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes,
           Stores stores = Stores::kCached);

// split that also feeds hash the stripes of its input as it reads them, leaving
// xxh3_stripes_finish fewer to read back: hash must be of exactly these n *
// elem_size bytes, nothing fed yet. The AVX-512 variant feeds; false (nothing
// split) where it is not active or the input is not one split() takes.
bool split_hashed(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes,
                  Xxh3Stripes* hash);

// Inverse of split: dst receives n * elem_size bytes.
void merge(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst);

// merge that also feeds hash the stripes of its output as it writes them, leaving
// xxh3_stripes_finish fewer to read back. The output may be one piece of the
// hashed input, the one that starts at byte 64 * hash->fed: pieces merged in
// order chain their stripes when every piece but the last starts and ends on an
// XXH3 block (kXxh3BlockBytes; the last piece ends the input); else a piece feeds
// nothing. The AVX-512 and AVX2 variants feed; false (nothing written) when
// neither is active.
bool merge_hashed(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst,
                  Xxh3Stripes* hash, Stores stores = Stores::kCached);

// Bytes of input per XXH3 block of stripes, where chained pieces may end.
constexpr size_t kXxh3BlockBytes = 64 * Xxh3Stripes::kStripesPerBlock;

}  // namespace kvcore::shuffle
