// The streaming XXH3 state that every wide build (xxh3_wide.h) shares. Kept out
// of the AVX2 file, whose code is compiled for AVX2: this runs on every CPU.
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t, XXH3_INITSTATE
#include <xxhash.h>

#include <cstring>

#include "checksum/xxh3_wide.h"

namespace kvcore::detail {

size_t xxh3_state_bytes() { return sizeof(XXH3_state_t); }

void xxh3_init_state(void* state) {
    std::memset(state, 0, sizeof(XXH3_state_t));
    XXH3_INITSTATE(static_cast<XXH3_state_t*>(state));
}

}  // namespace kvcore::detail
