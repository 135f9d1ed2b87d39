#include "checksum/checksum.h"

#include <new>
#include <xxhash.h>

namespace kvcore {

uint64_t checksum64(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

struct StreamingChecksum64::State {
    State() : xxh(XXH3_createState()) {
        if (xxh == nullptr) throw std::bad_alloc();
    }
    ~State() { XXH3_freeState(xxh); }
    XXH3_state_t* xxh;
};

StreamingChecksum64::StreamingChecksum64() : state_(std::make_unique<State>()) {}
StreamingChecksum64::~StreamingChecksum64() = default;

void StreamingChecksum64::reset(uint64_t seed) { XXH3_64bits_reset_withSeed(state_->xxh, seed); }
void StreamingChecksum64::update(const void* data, size_t size) { XXH3_64bits_update(state_->xxh, data, size); }
uint64_t StreamingChecksum64::digest() const { return XXH3_64bits_digest(state_->xxh); }

}  // namespace kvcore
