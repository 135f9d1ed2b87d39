#include "checksum/xxh3_stripes.h"

#include <cstring>
#define XXH_STATIC_LINKING_ONLY  // XXH3_generateSecret_fromSeed
#include <xxhash.h>

namespace kvcore {
namespace {

constexpr uint64_t kPrime32_1 = 0x9E3779B1u, kPrime32_2 = 0x85EBCA77u, kPrime32_3 = 0xC2B2AE3Du;
constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull, kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ull, kPrime64_4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;
constexpr size_t kLastStripeSecret = Xxh3Stripes::kSecretBytes - 64 - 7;
constexpr size_t kScrambleSecret = Xxh3Stripes::kSecretBytes - 64;
constexpr size_t kMergeSecret = 11;

uint64_t read64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;  // little endian (the frame format requires it)
}

void accumulate(uint64_t* acc, const uint8_t* data, const uint8_t* key) {
    for (unsigned j = 0; j < 8; ++j) {
        const uint64_t v = read64(data + 8 * j), k = v ^ read64(key + 8 * j);
        acc[j ^ 1] += v;
        acc[j] += (k & 0xFFFFFFFFu) * (k >> 32);
    }
}

void scramble(uint64_t* acc, const uint8_t* key) {
    for (unsigned j = 0; j < 8; ++j) {
        uint64_t a = acc[j] ^ (acc[j] >> 47);
        a ^= read64(key + 8 * j);
        acc[j] = a * kPrime32_1;
    }
}

uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    const unsigned __int128 p = (unsigned __int128)a * b;
    return uint64_t(p) ^ uint64_t(p >> 64);
}

uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

}  // namespace

void xxh3_stripes_begin(Xxh3Stripes* s, uint64_t seed, uint64_t len) {
    XXH3_generateSecret_fromSeed(s->secret, seed);
    const uint64_t init[8] = {kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                              kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1};
    std::memcpy(s->acc, init, sizeof init);
    s->len = len;
    s->fed = 0;
}

uint64_t xxh3_stripes_finish(Xxh3Stripes* s, const uint8_t* data) { return xxh3_stripes_finish_tail(s, data, 0); }

uint64_t xxh3_stripes_finish_tail(Xxh3Stripes* s, const uint8_t* tail, uint64_t tail_offset) {
    for (const uint64_t regular = s->regular(); s->fed < regular; ++s->fed) {
        const unsigned n = s->fed % Xxh3Stripes::kStripesPerBlock;
        accumulate(s->acc, tail + (64 * s->fed - tail_offset), s->secret + 8 * n);
        if (n + 1 == Xxh3Stripes::kStripesPerBlock) scramble(s->acc, s->secret + kScrambleSecret);
    }
    accumulate(s->acc, tail + (s->len - 64 - tail_offset), s->secret + kLastStripeSecret);
    uint64_t h = s->len * kPrime64_1;
    for (unsigned i = 0; i < 4; ++i)
        h += mul128_fold64(s->acc[2 * i] ^ read64(s->secret + kMergeSecret + 16 * i),
                           s->acc[2 * i + 1] ^ read64(s->secret + kMergeSecret + 16 * i + 8));
    return avalanche(h);
}

}  // namespace kvcore
