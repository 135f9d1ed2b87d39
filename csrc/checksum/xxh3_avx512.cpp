// XXH3-64 for AVX-512 (xxh3_wide.h): 1.48x the AVX2 build's speed on Zen 4
// (hot buffers of 256 KiB to 8 MiB of pseudo-random bytes, ad hoc, 2026-12-05).
#include "common/arch.h"
#if KVCORE_X86
#pragma GCC target("avx512f,avx512bw,avx2")
// GCC 12 reports its own _mm512_undefined_*() placeholders as uninitialized (see
// common/avx512_target.h): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define XXH_VECTOR XXH_AVX512
#include "checksum/xxh3_wide_impl.h"

namespace kvcore::detail {

const Xxh3Wide kXxh3Avx512 = kThisBuild;

}  // namespace kvcore::detail

#endif  // KVCORE_X86
