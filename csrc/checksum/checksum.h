// Checksums of original bytes (frames, SSD files): XXH3-64 from libxxhash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {

uint64_t checksum64(const void* data, size_t size, uint64_t seed = 0);

}  // namespace kvcore
