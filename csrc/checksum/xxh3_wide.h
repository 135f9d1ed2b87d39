// XXH3-64 compiled for wider ISAs than libxxhash's SSE2 build, from the
// system's header-only xxhash.h: xxh3_avx2.cpp and xxh3_avx512.cpp each compile
// xxh3_wide_impl.h for their ISA. Same digests as the library; each table is
// only used when cpu::active_isa() has its ISA. The streaming state is opaque
// memory of xxh3_state_bytes() bytes, aligned to 64, that every build reads alike.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::detail {

struct Xxh3Wide {
    uint64_t (*hash)(const void* data, size_t size, uint64_t seed);
    void (*reset)(void* state, uint64_t seed);
    void (*update)(void* state, const void* data, size_t size);
    uint64_t (*digest)(const void* state);
};

extern const Xxh3Wide kXxh3Avx2;
extern const Xxh3Wide kXxh3Avx512;

size_t xxh3_state_bytes();
// Prepares fresh state memory (like XXH3_createState): reset_withSeed reuses the
// derived secret when the stored seed equals the new one, so the stored seed
// must never be left uninitialised.
void xxh3_init_state(void* state);

}  // namespace kvcore::detail
