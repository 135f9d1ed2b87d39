// The body of one wide XXH3 build (xxh3_wide.h): included once by a file that
// first sets its target ISA (#pragma GCC target) and XXH_VECTOR.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include <immintrin.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "checksum/xxh3_wide.h"

namespace kvcore::detail {
namespace {

uint64_t wide_hash(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

void wide_reset(void* state, uint64_t seed) { XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state), seed); }

void wide_update(void* state, const void* data, size_t size) {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}

uint64_t wide_digest(const void* state) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state)); }

constexpr Xxh3Wide kThisBuild{wide_hash, wide_reset, wide_update, wide_digest};

}  // namespace
}  // namespace kvcore::detail

#endif  // KVCORE_X86
