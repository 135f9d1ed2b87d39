// Internals of entropy/histogram: the ISA variants of the presence check, for
// histogram.cpp and the tests that compare them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy::detail {

// found[j] = whether the value cand[j] occurs in src[0, n), for j < k (k <= 256;
// the values may repeat).
void find_values_scalar(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);
void find_values_avx2(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);
void find_values_avx512(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found);

}  // namespace kvcore::entropy::detail
