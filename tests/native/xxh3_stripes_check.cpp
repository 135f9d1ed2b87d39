// Checks checksum/xxh3_stripes against libxxhash's XXH3_64bits_withSeed: for every
// length from 241 (XXH3's first long input) to 4 KiB, lengths around 64-byte
// stripes and 1024-byte blocks up to 64 KiB, and random seeds, a stripe feed (as
// the merge kernels use it) takes a random number of the in-order stripes, from
// none to all, and xxh3_stripes_finish reads the rest; xxh3_stripes_finish_tail
// reads it from a copy of a random tail alone (exact size on the heap, where
// ASan sees a read outside it): the stripes not fed and the last 64 bytes. The AVX-512 feed compiled
// against emulated intrinsics (KVCORE_EMULATE_AVX512, test_shuffle_avx512_emulated.py),
// or natively: then the AVX-512 and AVX2 feeds, each where the CPU has it.
// Usage: xxh3_stripes_check <seed>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "stripe_feed_loop.h"
#ifndef KVCORE_EMULATE_AVX512
#define KV_AVX2 __attribute__((target("avx2")))
#include "checksum/xxh3_stripes_avx2.h"
#endif

namespace {

#ifndef KVCORE_EMULATE_AVX512
KV_AVX2 void feed_avx2(kvcore::Xxh3Stripes* s, const uint8_t* data, uint64_t stripes) {
    kvcore::StripeFeedAvx2 f(s);
    kvcore::StripeAccAvx2 acc;
    f.load(acc);
    for (uint64_t i = 0; i < stripes; ++i) {
        const auto* p = reinterpret_cast<const __m256i*>(data + 64 * i);
        f.add(acc, _mm256_loadu_si256(p), _mm256_loadu_si256(p + 1));
        if ((i + 1) % kvcore::StripeFeedAvx2::kStripesPerBlock == 0) f.end_block(acc);
    }
    f.store(acc);
}
#endif

using Feed = void (*)(kvcore::Xxh3Stripes*, const uint8_t*, uint64_t);

}  // namespace

int main(int argc, char** argv) {
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
    std::vector<std::pair<const char*, Feed>> feeds;
#ifdef KVCORE_EMULATE_AVX512
    feeds.emplace_back("avx512 (emulated)", feed_stripes_avx512);
#else
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) feeds.emplace_back("avx512", feed_stripes_avx512);
    if (__builtin_cpu_supports("avx2")) feeds.emplace_back("avx2", feed_avx2);
#endif
    std::vector<size_t> lengths;
    for (size_t len = kvcore::Xxh3Stripes::kMinLength; len <= 4096; ++len) lengths.push_back(len);
    for (size_t base = 4096; base <= 65536; base += 1024)
        for (long d = -65; d <= 65; d += 1) lengths.push_back(size_t(long(base) + d));
    std::vector<uint8_t> data(65536 + 128);
    for (auto& b : data) b = uint8_t(rng());
    size_t checks = 0, bad = 0;
    for (const auto& [name, feed] : feeds) {
        for (size_t len : lengths) {
            const uint8_t* p = data.data() + rng() % 64;  // any alignment
            const uint64_t seed = rng() % 4 == 0 ? 0 : rng();
            kvcore::Xxh3Stripes s;
            kvcore::xxh3_stripes_begin(&s, seed, len);
            feed(&s, p, rng() % (s.regular() + 1));
            kvcore::Xxh3Stripes from_tail = s;
            const uint64_t tail_offset = rng() % (std::min<uint64_t>(64 * s.fed, len - 64) + 1);
            const std::vector<uint8_t> tail(p + tail_offset, p + len);
            const uint64_t want = XXH3_64bits_withSeed(p, len, seed);
            const uint64_t got[2] = {kvcore::xxh3_stripes_finish(&s, p),
                                     kvcore::xxh3_stripes_finish_tail(&from_tail, tail.data(), tail_offset)};
            for (int k = 0; k < 2; ++k) {
                ++checks;
                if (got[k] != want && bad++ < 5)
                    std::printf("%s%s, length %zu seed %llu: %016llx, library %016llx\n", name, k ? " (from a tail)" : "",
                                len, (unsigned long long)seed, (unsigned long long)got[k], (unsigned long long)want);
            }
        }
    }
    std::printf("%s: %zu feeds, %zu lengths, %zu mismatches\n", bad ? "FAIL" : "ok", feeds.size(), checks, bad);
    return bad || feeds.empty() ? 1 : 0;
}
