// Symbol counts of a byte plane, exact or estimated from a sample.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy {

// Counts symbols: hist[256] is overwritten.
void histogram(const uint8_t* src, size_t n, uint32_t* hist);

// The bits of an ideal order-0 code of the symbols lo..hi counted in hist: the sum
// of c log2(t / c) over their counts c, t = the counts' total (0 for no symbol).
// As t log2 t - sum c log2 c, with c log2 c looked up for counts below 4096: the
// estimates that choose layouts and channel groups spent a quarter of a 16-token
// page's compress time in log2 and divisions.
double order0_bits(const uint32_t* hist, unsigned lo = 0, unsigned hi = 255);

// Weights for building a code: hist[256] is overwritten with counts scaled to
// about n, measured on a sample of the plane (1 byte in 8.5 of a large one, 1 in
// 5.5 of one below 32 KiB), and every symbol that occurs in src gets a nonzero
// weight (found from the plane's exact value range: values in it that the sample
// missed weigh 1 where they occur, 0 where they do not). Returns true when the
// weights are the exact counts: constant planes, planes below 8 KiB, and planes
// below 32 KiB whose values span more than 64 values.
bool histogram_estimate(const uint8_t* src, size_t n, uint32_t* hist);

// The same weights without the guarantee that every symbol of src has one: a
// value the sample missed may weigh 0. For coders that escape any value
// (fastcode), which then never pay for an exact count. True when exact (as for
// histogram_estimate).
bool histogram_weights(const uint8_t* src, size_t n, uint32_t* hist);

}  // namespace kvcore::entropy
