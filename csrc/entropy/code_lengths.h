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

// The range map, the compact alternative: the shortest circular range of byte
// values [first, first + span) (mod 256) that holds every coded symbol (ties:
// the smallest first), as first(1) and span - 1 (1), then the length of every
// value of the range in range order, two a byte, low nibble first, 0 for a
// value not coded (an odd span leaves the last high nibble 0). Exponent planes
// code a few adjacent values (residuals wrap past 0): some 15 bytes against
// the bitmap's 42.
struct SymbolRange {
    uint8_t first;
    unsigned span;  // 1..256
};

// The range of the symbols with lens[s] > 0 (at least one).
SymbolRange symbol_range(const uint8_t* lens);

inline size_t range_map_bytes(unsigned span) { return 2 + (span + 1) / 2; }

// Writes the range map of lens (r = symbol_range(lens)).
void write_range_map(const uint8_t* lens, SymbolRange r, uint8_t* out);

// Reads a range map of `size` bytes or more: lens[256] (0 outside the map),
// syms = the coded symbols, increasing; returns their number, or 0 when the map
// is truncated, a length exceeds max_len, the pad nibble is not 0, or the range
// is not the one write_range_map gives for these lengths (one spelling per code).
unsigned read_range_map(const uint8_t* map, size_t size, unsigned max_len, uint8_t* lens, uint8_t* syms,
                        size_t* map_size);

// Length i of a map's nibbles.
inline unsigned length_nibble(const uint8_t* nibbles, unsigned i) { return (nibbles[i / 2] >> (4 * (i & 1))) & 15u; }

}  // namespace kvcore::entropy
