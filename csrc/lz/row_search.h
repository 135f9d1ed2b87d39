// The search of split_rows (lz/row_repeats.cpp): which rows of a plane repeat
// an earlier row, and which distinct row each repeats. Internal: the ISA
// variants, for split_rows's dispatch and the test that compares them.
//
// The variants find the same copies (every match is confirmed byte by byte),
// so the distinct rows and the row table do not depend on the variant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::lz::detail {

struct CopySearch {
    const uint8_t* plane = nullptr;  // rows x row_bytes
    size_t rows = 0;
    size_t row_bytes = 0;
    uint8_t* distinct = nullptr;        // receives the distinct rows in order (room for the plane)
    uint32_t* index_of_copy = nullptr;  // receives the distinct row each copy repeats, in row order (room for rows)
    uint8_t* bitmap = nullptr;          // receives the repeat bitmap's whole 64-row words
};

struct CopySearchResult {
    size_t copies = 0;
    size_t distinct = 0;
    uint64_t last_bits = 0;  // the bitmap's last word (rows % 64 bits), not stored
};

// The smallest row the AVX2 search takes (its loads and copies are 16 bytes or wider).
constexpr size_t kAvx2SearchMinRow = 16;

// The last step of both searches' row hashes: a sum of products, whose low bits
// depend only on the low bits of its terms, mixed so that every bit depends on all.
inline uint64_t mix_row_hash(uint64_t h) {
    h ^= h >> 32;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

CopySearchResult find_copies_scalar(const CopySearch& c);
CopySearchResult find_copies_avx2(const CopySearch& c);  // row_bytes >= kAvx2SearchMinRow

// The AVX2 search's row hashes and the buckets of eight slots its table has for
// `rows` rows: a row goes to bucket hash % buckets (tests build rows that fill one).
void hash_rows_avx2(const uint8_t* plane, size_t rows, size_t row_bytes, uint64_t* hash);
size_t avx2_search_buckets(size_t rows);

}  // namespace kvcore::lz::detail
