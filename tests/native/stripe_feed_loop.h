// The plain loop that feeds an AVX-512 StripeFeed the first `stripes` stripes of
// data one by one: what the harnesses compare the kernels' feeds, and the
// library's digest, with.
#pragma once

#include <cstdint>

#include "common/avx512_target.h"
// (after avx512_target.h, which defines KV_AVX512)
#include "checksum/xxh3_stripes_avx512.h"

KV_AVX512 inline void feed_stripes_avx512(kvcore::Xxh3Stripes* s, const uint8_t* data, uint64_t stripes) {
    kvcore::StripeFeed f(s);
    kvcore::StripeAcc acc = f.load();
    for (uint64_t i = 0; i < stripes; ++i) {
        acc = f.add(acc, _mm512_loadu_si512(data + 64 * i));
        if ((i + 1) % kvcore::StripeFeed::kStripesPerBlock == 0) acc = f.end_block(acc);
    }
    f.store(acc);
}
