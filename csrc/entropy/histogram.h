// Symbol counts of a byte plane, exact or estimated from a sample.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy {

// Counts symbols: hist[256] is overwritten.
void histogram(const uint8_t* src, size_t n, uint32_t* hist);

// Weights for building a code: hist[256] is overwritten with counts scaled to
// about n, measured on an eighth of the plane, and every symbol that occurs in
// src gets a nonzero weight (found from the plane's exact value range: values in
// it that the sample missed weigh 1 where they occur, 0 where they do not).
// Returns true when the weights are the exact counts (small or constant planes).
bool histogram_estimate(const uint8_t* src, size_t n, uint32_t* hist);

// The same weights without the guarantee that every symbol of src has one: a
// value the sample missed may weigh 0. For coders that escape any value
// (fastcode), which then never pay for an exact count. True when exact (small or
// constant planes).
bool histogram_weights(const uint8_t* src, size_t n, uint32_t* hist);

}  // namespace kvcore::entropy
