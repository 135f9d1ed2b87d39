// XXH3-64 compiled for AVX2 from the system's xxhash.h (its inline,
// header-only form); libxxhash itself is built for SSE2 only. Same results as
// the library: only called when cpu::active_isa() has AVX2.
#pragma GCC target("avx2")
#include <immintrin.h>

#include <cstring>
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "checksum/xxh3_avx2.h"

namespace kvcore::detail {

uint64_t xxh3_64_avx2(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

size_t xxh3_state_bytes() { return sizeof(XXH3_state_t); }

void xxh3_init_avx2(void* state) {
    std::memset(state, 0, sizeof(XXH3_state_t));
    XXH3_INITSTATE(static_cast<XXH3_state_t*>(state));
}

void xxh3_reset_avx2(void* state, uint64_t seed) {
    XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state), seed);
}

void xxh3_update_avx2(void* state, const void* data, size_t size) {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}

uint64_t xxh3_digest_avx2(const void* state) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state)); }

}  // namespace kvcore::detail
