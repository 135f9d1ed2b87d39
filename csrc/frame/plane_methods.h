// Plane methods: how one byte plane of one block is stored in a frame.
// The numeric values are part of the frame format (docs/FORMAT.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "frame/codec.h"
#include "lz/row_repeats.h"

namespace kvcore {
struct Xxh3Stripes;
}  // namespace kvcore

namespace kvcore::frame {

enum class Method : uint8_t {
    kRaw = 0,       // the plane's bytes as they are
    kHuffman = 1,   // entropy/huffman.h
    kFastcode = 2,  // entropy/fastcode.h
    kZstd = 3,      // lz/zstd_plane.h
    kDeflate = 4,   // raw DEFLATE pieces (QAT-compatible), deflate/
    kConstant = 5,  // one byte, repeated n times
    kGrouped = 6,   // channel-grouped Huffman, entropy/channel_groups.h
    kRows = 7,      // distinct rows (coded by another method) + which rows repeat, lz/row_repeats.h
    kLowBits = 8,   // each byte's low bits packed raw + its high bits coded by another method, shuffle/low_bits.h
    kSigns = 9,     // bits 7..1 packed raw + bit 0 (a float's sign) coded by channel, shuffle/sign_bits.h
    kPacked = 10,   // the few adjacent bits in which the bytes differ, packed raw, shuffle/packed_bits.h
};
constexpr unsigned kMethodCount = 11;
const char* method_name(uint8_t method);

// The signs method needs enough rows per channel for its flips and code tables
// to pay (a byte of signs covers 8 rows); a block with fewer does not try it.
constexpr size_t kSignsMinRows = 64;

// Rows that repeat whole in a block's elements repeat in each of its planes, so
// one row table, searched over the element rows, serves every plane
// (frame/codec.cpp: where its planes repeat rows about equally often).
struct SharedRows {
    const uint8_t* table = nullptr;  // nullptr: none; the rows method searches the plane
    size_t table_size = 0;           // a row table (lz/row_repeats.h) of the element rows
    const uint8_t* distinct = nullptr;  // this plane's bytes of the distinct element rows, in order
};

// How the encoder chooses a plane's method.
struct PlanePolicy {
    Mode mode = Mode::kDense;
    bool try_entropy = true;  // false: the plane looks incompressible (mantissa bytes)
    float estimated_entropy = 8;  // the frame's estimate of this plane's order-0 entropy (bits per byte)
    bool try_lz = false;      // the plane repeats rows: also try the rows method, and zstd where they repeat in part
    uint32_t row_bytes = 0;   // length of the rows the repeat detector compared (a multiple of channels)
    float prefix_repeats = 0; // share of the rows it sampled whose leading bytes repeat an earlier row's
    bool deflate = false;     // use the DEFLATE method instead of Huffman/fastcode
    Backend backend = Backend::kAuto;
    uint32_t channels = 1;    // > 1: the plane is whole rows of this many channels (context modelling)
    uint32_t sign_channels = 0;  // > 1: bit 0 of each byte is a float's sign, in rows of this many
                                 // channels: also try the signs method (dense mode)
    bool fused_decode = false;  // fast mode decodes the plane fused with the block's merge when it is
                                // coded whole (the high plane of 2-byte elements, frame/codec.cpp)
    bool max_ratio = false;   // max mode: keep the smallest coding however slow it decodes (zstd,
                              // as many channel-group tables as make it smallest)
    bool lanes = false;       // Huffman streams may be lane-interleaved (EncodeOptions::lanes)
    SharedRows shared_rows;   // the block's row table, for the rows method (rows of row_bytes)
};

// Whether every byte of plane[0, n) equals the first (n >= 1): 64 bytes a step,
// leaving at the first that differs.
bool one_value(const uint8_t* plane, size_t n);

// Encodes plane[0, n) into dst (capacity >= n), picking the smallest method the
// policy allows. plane may be dst itself (then a raw result needs no copy).
Status encode_plane(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t cap,
                    Method* method, size_t* written);

// The rows method's payload (lz/row_repeats.h) of a plane of n bytes, parsed:
// its row table, then the method and payload of its distinct rows. Corrupt
// where the table is, where no method follows it, or where that method is the
// rows method again.
struct RowsPayload {
    lz::RowTable table;
    uint8_t inner = 0;
    const uint8_t* data = nullptr;
    size_t size = 0;
};
Status parse_rows_payload(const uint8_t* payload, size_t size, size_t n, RowsPayload* r);

// Decodes a payload of n bytes. For kRaw *out points into the payload itself
// (no copy); otherwise the plane is decoded into scratch and *out = scratch.
// channels: the frame's channel count (for kGrouped). hash (optional; begun over
// the n bytes, nothing fed) is fed the stripes a method checksums while it
// decodes (fastcode with AVX-512); hash->fed tells how many it took.
Status decode_plane(uint8_t method, const uint8_t* payload, size_t size, size_t n, uint32_t channels,
                    uint8_t* scratch, const uint8_t** out, Xxh3Stripes* hash = nullptr);

}  // namespace kvcore::frame
