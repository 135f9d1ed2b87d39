#include "checksum/checksum.h"

#include <xxhash.h>

namespace kvcore {

uint64_t checksum64(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

}  // namespace kvcore
