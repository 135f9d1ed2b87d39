// XXH3-64 for AVX2 (xxh3_wide.h), and the streaming state every build shares.
#pragma GCC target("avx2")
#define XXH_VECTOR XXH_AVX2
#include "checksum/xxh3_wide_impl.h"

#include <cstring>

namespace kvcore::detail {

const Xxh3Wide kXxh3Avx2 = kThisBuild;

size_t xxh3_state_bytes() { return sizeof(XXH3_state_t); }

void xxh3_init_state(void* state) {
    std::memset(state, 0, sizeof(XXH3_state_t));
    XXH3_INITSTATE(static_cast<XXH3_state_t*>(state));
}

}  // namespace kvcore::detail
