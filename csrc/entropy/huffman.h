// Order-0 canonical Huffman coder for one byte plane ("dense" mode).
//
// The encoded stream is self-describing (code lengths, stream sizes) and is
// decoded with the number of symbols, which the frame stores. Decoding checks
// every bound: any byte string decodes to an error or to exactly n bytes, never
// reads outside [src, src + src_size) or writes outside [dst, dst + n).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "entropy/histogram.h"

namespace kvcore::entropy {

// Largest stream huffman_encode can produce for n symbols (it fails rather than
// exceed the capacity it is given; the frame then stores the plane raw).
size_t huffman_bound(size_t n);

// Encodes src[0, n). `hist` may be null or hold the 256 symbol counts of src;
// with exact_counts false it holds weights (histogram_estimate) that are nonzero
// for every symbol in src. On success *written is the stream size. Returns
// kBufferTooSmall when the stream would not fit in cap bytes (the caller then
// stores the plane raw).
//
// lanes_allowance: how much larger (a share of its size) the lane-interleaved
// stream (lane_code.h: codes of at most 7 bits, decoded 1.5-1.8x as fast with
// AVX-512) may be than the six-stream one and still be chosen; 0 takes it only
// where it is not larger, a negative value never. Both are estimated from the
// weights first.
Status huffman_encode(const uint8_t* src, size_t n, const uint32_t* hist, uint8_t* dst, size_t cap,
                      size_t* written, bool exact_counts = true, double lanes_allowance = -1);

// Size of the stream huffman_encode would produce for a plane of n symbols with
// these 256 counts, without coding it: an upper bound at most 5 bytes above the
// exact size (per-stream padding is not known in advance). Cost: building the code.
// With exact_counts false, hist holds weights (as for huffman_encode) and the
// result is their estimate scaled to n symbols plus a 1/64 margin: huffman_encode
// refuses a plane whose estimate does not fit its capacity with that margin.
// A lane-interleaved stream (as lanes_allowance picks it) is bounded with its
// lanes' final bytes: up to 2 bytes a lane (256) above its exact size.
size_t huffman_estimate(const uint32_t* hist, size_t n, bool exact_counts = true, double lanes_allowance = -1);

// How huffman_encode codes a plane of n symbols with these 256 counts (present
// symbols nonzero), on the active ISA: four or eight symbols a put, from chunks
// of codes joined by the AVX-512 kernel ("chunks"); else one symbol a table
// lookup ("single"), or two, indexed through a window of values ("window") or by
// rank ("rank"). The stream is the same bytes every way; this is for tests and
// benchmarks.
const char* huffman_pairing(const uint32_t* hist, size_t n);

// Decodes exactly n symbols. kCorruptFrame on any inconsistency.
Status huffman_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n);


}  // namespace kvcore::entropy
