// Lane-interleaved Huffman stream ("lanes", tag 4 of huffman.h's format):
// an order-0 code of at most 7 bits a symbol that 128 lanes decode side by side.
//
// Symbol i belongs to lane i mod 128, as that lane's (i div 128)-th symbol, so a
// step of the decoder yields 128 consecutive output bytes. Each lane holds at
// most 15 bits of its own MSB-first bit string in a 16-bit window. At step t
// every lane l with t * 128 + l < n, in increasing l, first takes the next byte
// of the shared lane stream below its bits if it holds fewer than 8, then looks
// its symbol up by the window's top 7 bits and drops that code's bits. The order
// of refills is thus fixed by the code lengths alone, and the encoder, which knows
// them, lays the lanes' bytes out in that order. The stream is consumed exactly,
// and the bits a lane holds after its last code are zero.
//
// A 7-bit code cannot give rare symbols their long codes without starving the
// common ones, so symbols with weight below 1/512 of the total (p < 2^-9) are
// escaped: they share one code (ESC), and their bytes follow in a list, in
// position order. The decoder writes ESC's placeholder (the smallest byte value
// that has no code of its own) and replaces each placeholder with the next
// listed byte. On the kvdata exponent streams the escapes keep the 7-bit code
// within 0.9% of the 11-bit one (without them 3-4% larger), and the AVX-512
// decoder (VBMI byte permutes for the lookups, VBMI2 expands for the refills)
// decoded them 2.0-2.9x as fast as the six-stream decoder (standalone, Zen 4).
//
// Stream: [4][exceptions e: u32][bitmap: 32 bytes][lengths: nibbles]
//         [e exception bytes][lane stream]
// The bitmap marks the directly coded symbols; lengths (1..7) follow for them
// in increasing symbol order and, when e > 0, for ESC, two per byte, low nibble
// first, a zero pad nibble when odd. The lengths form a complete code of at least
// two codes; codes are canonical, by (length, symbol) with ESC sorting as its
// placeholder.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvcore::entropy::lanes {

constexpr unsigned kLanes = 128;  // a multiple of 64
constexpr unsigned kMaxLen = 7;
constexpr unsigned kCodeSpace = 1u << kMaxLen;
constexpr uint8_t kTag = 4;

// A lane code chosen for a plane's weights: what it would cost, before coding.
struct Plan {
    uint8_t lens[256];      // direct symbols' lengths (0: escaped or absent)
    uint8_t esc_len = 0;    // 0: nothing escaped
    uint8_t placeholder = 0;
    unsigned codes = 0;     // direct symbols + ESC
    uint64_t bits = 0;      // code bits of the weights, escaped bytes included
    uint64_t escaped = 0;   // weight of the escaped symbols
};

// The lane code for these 256 weights (total > 0, at least two present
// symbols); false when none exists (a single code would remain).
bool plan(const uint64_t* weights, Plan* p);

// Size of the stream for n symbols, at least the exact one: the header, the coded
// bits (exact counts; else weights summing to `total`, scaled to n with a 1/64
// margin), and two bytes a lane for each lane's last partial byte and the byte
// it takes ahead.
size_t estimate(const Plan& p, size_t n, uint64_t total, bool exact_counts);

// Codes src[0, n) with plan p (built from src's counts, or from weights that are
// nonzero for every symbol of src). kBufferTooSmall when the stream would not
// fit in cap.
Status encode(const uint8_t* src, size_t n, const Plan& p, uint8_t* dst, size_t cap, size_t* written);

// Decodes exactly n symbols of a tag-4 stream. kCorruptFrame on any
// inconsistency; never reads outside src[0, size) or writes outside dst[0, n).
Status decode(const uint8_t* src, size_t size, uint8_t* dst, size_t n);

}  // namespace kvcore::entropy::lanes
