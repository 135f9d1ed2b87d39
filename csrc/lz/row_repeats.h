// Whole-row repeats: a plane as its distinct rows plus a table that says which
// rows repeat an earlier one (the "rows" plane method, docs/FORMAT.md).
//
// KV caches repeat whole rows: a token seen before gives the same values in
// layers that depend on the token alone, and padding repeats one row. Coding
// only the distinct rows keeps the entropy coder (and its channel context) on
// them, and joining the rows back is a copy per row, where a general LZ stage
// costs several times the entropy coder's time.
//
// Row table layout (little endian):
//   row_bytes(4) copies(4) bitmap(ceil(rows / 8)) indices(ceil(copies * w / 8))
// with rows = n / row_bytes. Bit r of the bitmap (LSB first) is 1 when row r
// repeats an earlier row; the copies' indices follow in row order, w bits each,
// packed LSB first, each the position of the repeated row among the distinct
// rows; w = bit width of (distinct - 1), 0 when there is at most one distinct
// row. Unused bits of both fields are 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvcore::lz {

// Room a row table for a plane of `rows` rows may need (indices of at most 32 bits).
size_t row_table_bound(size_t rows);

// Splits plane[0, n) (whole rows of row_bytes >= 1) into its distinct rows, in
// order, written to distinct (room for n bytes), and the row table, written to
// table (room for row_table_bound(rows) bytes). Returns the number of rows
// that repeat an earlier row; *table_size = bytes of the table.
size_t split_rows(const uint8_t* plane, size_t n, size_t row_bytes, uint8_t* distinct, uint8_t* table,
                  size_t* table_size);

// A parsed row table, pointing into its payload.
struct RowTable {
    size_t row_bytes = 0;
    size_t rows = 0;
    size_t copies = 0;
    size_t distinct = 0;  // rows - copies
    unsigned width = 0;   // bits per index
    const uint8_t* bitmap = nullptr;
    const uint8_t* indices = nullptr;
    size_t size = 0;  // bytes of the table
};

// Parses the row table at the start of payload[0, size) for a plane of n bytes.
Status parse_row_table(const uint8_t* payload, size_t size, size_t n, RowTable* t);

// Writes the plane (t.rows * t.row_bytes bytes) from its distinct rows.
// Corrupt when an index does not name a distinct row that an earlier row
// brought in (then out is partly written).
Status join_rows(const RowTable& t, const uint8_t* distinct, uint8_t* out);

}  // namespace kvcore::lz
