// The kvcore frame header (docs/FORMAT.md is the specification; keep in sync).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/little_endian.h"
#include "common/status.h"
#include "frame/codec.h"

namespace kvcore::frame {

constexpr uint32_t kMagic = 0x4643564bu;  // "KVCF" in file order
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagRotate = 1u << 0;
constexpr uint8_t kFlagResidual = 1u << 1;
constexpr uint8_t kFlagFastMode = 1u << 2;  // informational: the encoder's mode
constexpr uint8_t kKnownFlags = kFlagRotate | kFlagResidual | kFlagFastMode;
constexpr uint32_t kMaxChannels = 4096;        // channels per row, at most
constexpr uint32_t kMaxBlockBytes = 16u << 20;  // bound on one block's original size
constexpr uint32_t kDefaultBlockBytes = 1u << 20;  // dense: amortizes per-block code tables
constexpr uint32_t kDefaultFastBlockBytes = 256u << 10;  // fast: a block's output stays in L2
constexpr size_t kBlockPrefixBytes = 8;         // the block's checksum
constexpr size_t kPlanePrefixBytes = 5;         // method (1) + payload size (4)

struct Header {
    DType dtype = DType::kUInt8;
    uint8_t flags = 0;
    std::vector<uint64_t> shape;
    uint32_t block_elems = 0;
    uint32_t n_blocks = 0;
    uint64_t n_elems = 0;
    uint32_t channels = 1;              // channels per row; n_elems and block_elems are multiples
    std::vector<uint8_t> residual;      // channels bytes when kFlagResidual
    std::vector<uint32_t> block_sizes;  // encoded size of each block
    // XXH3-64 of the header bytes before the block table. Block checksums are
    // seeded with it, so a block only verifies under the header it was written with.
    uint64_t binding = 0;
};

// Seed of block b's checksum.
inline uint64_t block_seed(const Header& h, uint64_t b) { return h.binding ^ (b * 0x9E3779B97F4A7C15ull); }

// Computes h.binding from the descriptive fields (call before encoding blocks).
void bind_header(Header* h);

// Size of the serialized header (which depends on rank, period, block count).
size_t header_size(size_t ndim, bool residual, uint32_t channels, uint32_t n_blocks);
inline size_t header_size(const Header& h) {
    return header_size(h.shape.size(), (h.flags & kFlagResidual) != 0, h.channels, h.n_blocks);
}

// Writes the header (with its checksum) at dst, which has header_size(h) bytes.
void write_header(const Header& h, uint8_t* dst);

// Parses and validates a header, including that the block table exactly covers
// the rest of the frame; *consumed = header bytes.
Status parse_header(const uint8_t* frame, size_t size, Header* h, size_t* consumed);

}  // namespace kvcore::frame
