// Internals of entropy/huffman: the AVX-512 kernel that looks up the Huffman
// codes of 32 symbols at a time and joins them into chunks of four or eight
// symbols, so the encoder's scalar bit writer puts four or eight symbols per
// step (huffman.cpp's encode_chunked), for huffman.cpp and its tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::entropy::detail {

// The code of every present symbol, right-aligned (at most 11 bits), with its
// length in bits 11..14, in one or two tables of 64 entries: symbol s is entry
// (s mod 64) of table 0 (one table) or of table bit `select` of s (two tables,
// select = 6 or 7). No two present symbols share an entry.
struct ChunkTable {
    alignas(64) uint16_t entry[128];
    unsigned tables;
    unsigned select;
};
constexpr unsigned kChunkLenShift = 11;

// A chunk's bits at most: a writer that has flushed holds at most 7 pending bits,
// and can then take one chunk before the next flush.
constexpr unsigned kMaxChunkBits = 56;

// Codes the 32 * groups symbols before end, last first, in chunks: the codes of
// consecutive symbols in coding order, left-aligned in chunks[j] with zeros below,
// and lens[j] their summed length (<= kMaxChunkBits). Each 32 symbols give eight
// chunks of four symbols (at most 44 bits), or four of eight where each of those
// has at most kMaxChunkBits. Returns the number of chunks (4 * groups to
// 8 * groups); chunks and lens need room for 8 * groups entries.
size_t code_chunks_avx512(const uint8_t* end, size_t groups, const ChunkTable& t, uint64_t* chunks, uint8_t* lens);

}  // namespace kvcore::entropy::detail
