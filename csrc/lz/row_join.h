// The join of join_rows (lz/row_repeats.cpp) where many rows repeat: the
// copies' indices unpacked, and which distinct row each row of a 64-row bitmap
// word takes. Internal: the AVX-512 variants, for join_rows's dispatch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::lz::detail {

// The index arrays the join reads hold this many entries past the last copy's
// (zeros), so that a vector may load the indices of a whole word's copies.
constexpr size_t kIndexPad = 16;

// src[j] for rows j in [0, count) of a word (count <= 64; bits: which rows repeat,
// none at or past count): the next new distinct row (next, next + 1, ... in
// order) or, for a repeat, its index (idx[0], idx[1], ... in order). False when a
// repeat names a distinct row that no earlier row brought in (idx >= next + the
// new rows before it); src is then partly written.
bool word_sources_avx512(uint64_t bits, size_t count, const uint8_t* idx, size_t next, uint32_t* src);
bool word_sources_avx512(uint64_t bits, size_t count, const uint32_t* idx, size_t next, uint32_t* src);

// The copies' indices, `width` bits each (1-32) packed LSB first in
// indices[0, bytes), unpacked to out[0, copies) (uint8_t: width <= 8); returns
// the largest (0 when there are none). Reads no byte past indices + bytes.
uint32_t unpack_indices_avx512(const uint8_t* indices, size_t bytes, size_t copies, unsigned width, uint8_t* out);
uint32_t unpack_indices_avx512(const uint8_t* indices, size_t bytes, size_t copies, unsigned width, uint32_t* out);

}  // namespace kvcore::lz::detail
