#include "checksum/checksum.h"

#include <cstdlib>
#include <new>
#include <xxhash.h>

#include "checksum/xxh3_wide.h"
#include "common/arch.h"
#include "cpu/cpu_features.h"

namespace kvcore {
namespace {

// The widest XXH3 build the active ISA allows; null: libxxhash's own (SSE2).
const detail::Xxh3Wide* wide_build() {
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return &detail::kXxh3Avx512;
    if (isa & cpu::kIsaAvx2) return &detail::kXxh3Avx2;
#endif  // KVCORE_X86
    return nullptr;
}

}  // namespace

uint64_t checksum64(const void* data, size_t size, uint64_t seed) {
    const detail::Xxh3Wide* wide = wide_build();
    return wide ? wide->hash(data, size, seed) : XXH3_64bits_withSeed(data, size, seed);
}

// Holds both states' memory: the library's (SSE2) and the wide builds' (one
// layout); the build is fixed at reset, so a mask change mid-stream cannot mix them.
struct StreamingChecksum64::State {
    State() : lib(XXH3_createState()), wide_state(std::aligned_alloc(64, round_up(detail::xxh3_state_bytes()))) {
        if (lib == nullptr || wide_state == nullptr) {
            XXH3_freeState(lib);
            std::free(wide_state);
            throw std::bad_alloc();
        }
        detail::xxh3_init_state(wide_state);
    }
    ~State() {
        XXH3_freeState(lib);
        std::free(wide_state);
    }
    static size_t round_up(size_t n) { return (n + 63) & ~size_t(63); }
    XXH3_state_t* lib;
    void* wide_state;
    const detail::Xxh3Wide* wide = nullptr;
};

StreamingChecksum64::StreamingChecksum64() : state_(std::make_unique<State>()) {}
StreamingChecksum64::~StreamingChecksum64() = default;

void StreamingChecksum64::reset(uint64_t seed) {
    state_->wide = wide_build();
    if (state_->wide) state_->wide->reset(state_->wide_state, seed);
    else XXH3_64bits_reset_withSeed(state_->lib, seed);
}

void StreamingChecksum64::update(const void* data, size_t size) {
    if (state_->wide) state_->wide->update(state_->wide_state, data, size);
    else XXH3_64bits_update(state_->lib, data, size);
}

uint64_t StreamingChecksum64::digest() const {
    return state_->wide ? state_->wide->digest(state_->wide_state) : XXH3_64bits_digest(state_->lib);
}

}  // namespace kvcore
