// Length-limited Huffman code lengths and the symbol map that carries them,
// shared by the order-0 coder's stream kinds (huffman.cpp: codes of up to 11
// bits; lane_code.cpp: up to 7).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy {

constexpr unsigned kMaxCodeLen = 15;  // the longest limit limited_lengths takes

// Optimal code lengths limited to max_len <= kMaxCodeLen (package-merge), with
// 2^max_len >= m. counts[s] > 0 marks the m >= 2 present symbols; lens[s]
// receives 1..max_len (0 when absent).
void limited_lengths(const uint64_t* counts, unsigned max_len, uint8_t* lens);

// The symbol map: a bitmap of the coded symbols (bit s: byte s / 8, bit s % 8),
// then their lengths in increasing symbol order, two a byte, low nibble first.
constexpr size_t kSymbolBitmapBytes = 32;

// Writes the map of the symbols with lens[s] > 0, its nibbles zeroed for
// `extra` more lengths after theirs; returns the number of symbols.
unsigned write_symbol_map(const uint8_t* lens, unsigned extra, uint8_t* out);

// The symbols a map's bitmap marks, increasing; returns their number.
unsigned read_symbol_bitmap(const uint8_t* bitmap, uint8_t* syms);

// Length i of a map's nibbles.
inline unsigned length_nibble(const uint8_t* nibbles, unsigned i) { return (nibbles[i / 2] >> (4 * (i & 1))) & 15u; }

}  // namespace kvcore::entropy
