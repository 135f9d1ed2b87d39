// XXH3-64 (seeded) of an input longer than 240 bytes, computed from its 64-byte
// stripes as a kernel produces them: a merge kernel feeds each output vector
// while it is still in a register (xxh3_stripes_avx512.h, xxh3_stripes_avx2.h), so the checksum of
// decoded bytes costs no second pass over them. The digest equals
// XXH3_64bits_withSeed(data, len, seed) of the whole input.
//
// begin() derives the seed's secret and the initial accumulators; a kernel feeds
// stripes 0, 1, ... in order (any prefix of them, even none); finish() feeds the
// rest from the finished bytes, then the final stripe and merges the lanes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore {

struct Xxh3Stripes {
    static constexpr size_t kMinLength = 241;  // shorter inputs take XXH3's short-input paths
    static constexpr size_t kSecretBytes = 192;
    static constexpr unsigned kStripesPerBlock = 16;  // the accumulators are scrambled after each block

    alignas(64) uint64_t acc[8];
    alignas(64) uint8_t secret[kSecretBytes];
    uint64_t len = 0;
    uint64_t fed = 0;  // stripes accumulated so far

    // Stripes accumulated in order; the last 64 bytes come after them.
    uint64_t regular() const { return (len - 1) / 64; }
};

// Starts the hash of len (>= kMinLength) bytes.
void xxh3_stripes_begin(Xxh3Stripes* s, uint64_t seed, uint64_t len);

// Feeds the stripes a kernel did not, from data (all len bytes), and returns the digest.
uint64_t xxh3_stripes_finish(Xxh3Stripes* s, const uint8_t* data);

// The same from the input's tail alone: tail holds its bytes from tail_offset to
// the end, which must cover every stripe not fed and the last 64 bytes
// (tail_offset <= 64 * s->fed and tail_offset <= len - 64), so that the input
// may sit in separate pieces as long as the kernels fed all but the last one.
uint64_t xxh3_stripes_finish_tail(Xxh3Stripes* s, const uint8_t* tail, uint64_t tail_offset);

}  // namespace kvcore
