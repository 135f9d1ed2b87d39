// XXH3-64 for AVX2 (xxh3_wide.h).
#include "common/arch.h"
#if KVCORE_X86
#pragma GCC target("avx2")
#define XXH_VECTOR XXH_AVX2
#include "checksum/xxh3_wide_impl.h"

namespace kvcore::detail {

const Xxh3Wide kXxh3Avx2 = kThisBuild;

}  // namespace kvcore::detail
#endif  // KVCORE_X86
