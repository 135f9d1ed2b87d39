// Internals of entropy/huffman: the AVX-512 kernel that turns symbol pairs into
// pair-table indices through a per-symbol index table (the "ranked" pairs of
// huffman_encode), for huffman.cpp and its tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy::detail {

// idx[j] = index_of[src[2j]] + index_of[src[2j + 1]] * stride for the first 32 * (pairs / 32)
// pairs (index_of[s] < 128, stride < 128); returns that count (the caller indexes the rest).
size_t ranked_pair_indices_avx512(const uint8_t* src, size_t pairs, const uint8_t* index_of, unsigned stride,
                                  uint16_t* idx);

}  // namespace kvcore::entropy::detail
