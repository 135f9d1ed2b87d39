// zstd as a plane method: for planes with long repeats (duplicate token rows,
// zero padding) where an LZ stage beats order-0 coding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvcore::lz {

// kBufferTooSmall when the result does not fit in cap.
Status zstd_plane_encode(const uint8_t* src, size_t n, int level, uint8_t* dst, size_t cap, size_t* written);

// Decodes exactly n bytes; any other outcome is kCorruptFrame.
Status zstd_plane_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n);

}  // namespace kvcore::lz
