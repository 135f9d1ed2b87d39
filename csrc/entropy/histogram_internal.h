// Internals of entropy/histogram: the ISA variants of the presence check and the
// narrow-window count, for histogram.cpp and the tests that compare them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy::detail {

// found[j] = whether the value cand[j] occurs in src[0, n), for j < k (k <= 256;
// the values may repeat).
void find_values_scalar(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);
void find_values_avx2(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);
void find_values_avx512(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);

// hist = the exact counts of src[0, n), every byte of which lies in the window of
// `width` values from lo (mod 256; width <= 255).
void count_window_avx512(const uint8_t* src, size_t n, uint8_t lo, unsigned width, uint32_t* hist);

}  // namespace kvcore::entropy::detail
