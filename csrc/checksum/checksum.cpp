#include "checksum/checksum.h"

#include <cstdlib>
#include <new>
#include <xxhash.h>

#include "checksum/xxh3_avx2.h"
#include "cpu/cpu_features.h"

namespace kvcore {
namespace {

bool use_avx2() { return (cpu::active_isa() & cpu::kIsaAvx2) != 0; }

}  // namespace

uint64_t checksum64(const void* data, size_t size, uint64_t seed) {
    return use_avx2() ? detail::xxh3_64_avx2(data, size, seed) : XXH3_64bits_withSeed(data, size, seed);
}

// Holds both states' memory: the library's (SSE2) and the AVX2 build's; the
// variant is fixed at reset, so a mask change mid-stream cannot mix them.
struct StreamingChecksum64::State {
    State() : lib(XXH3_createState()), avx2(std::aligned_alloc(64, round_up(detail::xxh3_state_bytes()))) {
        if (lib == nullptr || avx2 == nullptr) {
            XXH3_freeState(lib);
            std::free(avx2);
            throw std::bad_alloc();
        }
        detail::xxh3_init_avx2(avx2);
    }
    ~State() {
        XXH3_freeState(lib);
        std::free(avx2);
    }
    static size_t round_up(size_t n) { return (n + 63) & ~size_t(63); }
    XXH3_state_t* lib;
    void* avx2;
    bool wide = false;
};

StreamingChecksum64::StreamingChecksum64() : state_(std::make_unique<State>()) {}
StreamingChecksum64::~StreamingChecksum64() = default;

void StreamingChecksum64::reset(uint64_t seed) {
    state_->wide = use_avx2();
    if (state_->wide) detail::xxh3_reset_avx2(state_->avx2, seed);
    else XXH3_64bits_reset_withSeed(state_->lib, seed);
}

void StreamingChecksum64::update(const void* data, size_t size) {
    if (state_->wide) detail::xxh3_update_avx2(state_->avx2, data, size);
    else XXH3_64bits_update(state_->lib, data, size);
}

uint64_t StreamingChecksum64::digest() const {
    return state_->wide ? detail::xxh3_digest_avx2(state_->avx2) : XXH3_64bits_digest(state_->lib);
}

}  // namespace kvcore
