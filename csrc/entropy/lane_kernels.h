// Internals of entropy/lane_code: the passes of the lane coder, portable,
// AVX2 (lane_kernels_avx2.cpp) and AVX-512 (lane_kernels_avx512.cpp), for
// lane_code.cpp and its tests. Every variant produces and accepts the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "entropy/lane_code.h"

namespace kvcore::entropy::lanes::detail {

// Encoder tables: rank[s] = the code index of symbol s (escaped symbols: ESC's);
// code[r] (right-aligned) and len[r] by code index; esc_rank = ESC's index, or
// kCodeSpace when nothing is escaped; codes = how many ranks there are, ESC's
// included. Absent symbols' ranks are never looked up.
struct EncodeTables {
    alignas(64) uint8_t rank[256];
    alignas(64) uint8_t code[kCodeSpace];
    alignas(64) uint8_t len[kCodeSpace];
    unsigned esc_rank;
    unsigned codes;
};

// Decoder tables by the next 7 bits of a lane: the symbol (ESC: the
// placeholder) and the length of the code they start with.
struct DecodeTables {
    alignas(64) uint8_t sym[kCodeSpace];
    alignas(64) uint8_t len[kCodeSpace];
};

// Each lane's 16-bit window (its bits at the top) and how many bits it holds.
struct LaneState {
    alignas(64) uint16_t window[kLanes];
    alignas(64) uint16_t bits[kLanes];
};

// Encoder pass 1: ranks[i] = rank[src[i]] for i < n; lane_bits[l] = the sum of
// lane l's code lengths mod 256; the escaped symbols appended from *escaped on,
// in order (the pointer moved past them). Room: ranks n rounded up to 64 bytes,
// escapes n + 64.
void rank_pass_portable(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                        uint8_t** escaped);
void rank_pass_avx512(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                      uint8_t** escaped);
void rank_pass_avx2(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                    uint8_t** escaped);

// Encoder pass 2, from the last step to the first: writes the lane stream down
// from *stream, moving the pointer to its first byte. Room below it: n + 2 * kLanes
// bytes, and 32 more for the AVX-512 and AVX2 passes.
void lay_out_portable(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                      uint8_t** stream);
void lay_out_avx512(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                    uint8_t** stream);
void lay_out_avx2(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                  uint8_t** stream);

// The lay-out's state between steps: each lane's window and its bit count mod 256.
struct LayState {
    uint16_t window[kLanes];
    uint8_t bit[kLanes];
};
// Lays out steps [first_step, end_step), the last first, as lay_out_portable does.
void lay_steps_portable(const uint8_t* ranks, size_t n, const EncodeTables& t, LayState& s, size_t first_step,
                        size_t end_step, uint8_t** stream);

// The escaped bytes and how many of them the output has taken so far (*used;
// it counts every placeholder, also past `count`: the caller checks it). The
// AVX-512 decoder marks placeholders in hits (bit i of hits[k]: output byte
// 64 k + i) instead of replacing them, which took several times the decode's
// own time on Zen 4 (a branch on every 64 bytes, or a byte expand).
struct Escapes {
    const uint8_t* bytes;
    size_t count;
    uint8_t placeholder;
    size_t* used;
    uint64_t* hits;  // room for n / 64 words
};

// Decodes steps [step, ceil(n / kLanes)) of n symbols (the last one may be
// partial) into dst, refilling from *pos up to end; returns false when the
// stream runs out. Placeholders are left in place.
bool decode_steps_portable(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                           size_t step, size_t n, uint8_t* dst);
// Decodes whole steps from `step` on while at least kLanes stream bytes remain,
// marking placeholders in esc.hits (esc.count > 0); returns the next step.
size_t decode_steps_avx512(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                           size_t step, size_t n, uint8_t* dst, const Escapes& esc);
size_t decode_steps_avx2(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                         size_t step, size_t n, uint8_t* dst, const Escapes& esc);

// Replaces each placeholder byte of dst[0, n) with the next escaped byte.
void patch_escapes_portable(uint8_t* dst, size_t n, const Escapes& esc);
// The same for the placeholders marked in esc.hits[0, words).
void patch_marked_escapes(uint8_t* dst, size_t words, const Escapes& esc);

}  // namespace kvcore::entropy::lanes::detail
