// Length-limited Huffman code lengths, shared by the order-0 coder's stream
// kinds (huffman.cpp: codes of up to 11 bits; lane_code.cpp: up to 7).
#pragma once

#include <cstdint>

namespace kvcore::entropy {

constexpr unsigned kMaxCodeLen = 15;  // the longest limit limited_lengths takes

// Optimal code lengths limited to max_len <= kMaxCodeLen (package-merge), with
// 2^max_len >= m. counts[s] > 0 marks the m >= 2 present symbols; lens[s]
// receives 1..max_len (0 when absent).
void limited_lengths(const uint64_t* counts, unsigned max_len, uint8_t* lens);

}  // namespace kvcore::entropy
