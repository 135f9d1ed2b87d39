// AVX2 build of XXH3-64 (see xxh3_avx2.cpp). The streaming state is opaque
// memory of xxh3_state_bytes() bytes, aligned to 64.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::detail {

uint64_t xxh3_64_avx2(const void* data, size_t size, uint64_t seed);
size_t xxh3_state_bytes();
// Prepares fresh state memory (like XXH3_createState): reset_withSeed reuses the
// derived secret when the stored seed equals the new one, so the stored seed
// must never be left uninitialised.
void xxh3_init_avx2(void* state);
void xxh3_reset_avx2(void* state, uint64_t seed);
void xxh3_update_avx2(void* state, const void* data, size_t size);
uint64_t xxh3_digest_avx2(const void* state);

}  // namespace kvcore::detail
