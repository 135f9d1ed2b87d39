// The lane coder's passes, AVX-512 (see lane_kernels.h): 32 lanes a register in
// 16-bit words, kLanes / 32 registers a step. Code lookups by a 7-bit index (a code
// or a rank) are two-register VBMI byte permutes; the decoder's refills are
// VBMI2 word expands of the next stream bytes into the lanes that need one, and
// the encoder's lay-out is their inverse, a compress of the bytes those lanes
// take, written backwards.
#include "common/arch.h"
#if KVCORE_X86
#include <algorithm>

#include "common/avx512_target.h"
#include "entropy/lane_kernels.h"

namespace kvcore::entropy::lanes::detail {
namespace {

constexpr unsigned kVectors = kLanes / 32;
constexpr __mmask64 kLowBytes = 0x5555555555555555ull;  // the low byte of each word

// The byte-table entries of word lanes holding indices < 128, in their low bytes
// (high bytes zero) for the lanes in `bytes`.
KV_AVX512 inline __m512i lookup(__mmask64 bytes, __m512i lo, __m512i idx, __m512i hi) {
    return _mm512_maskz_permutex2var_epi8(bytes, lo, idx, hi);
}

// Word mask of the first `lanes` (0..32) lanes, and its byte mask for lookups.
KV_AVX512 inline __mmask32 first_lanes(unsigned lanes) { return _bzhi_u32(~0u, lanes); }
KV_AVX512 inline __mmask64 low_bytes_of(__mmask32 lanes) { return _pdep_u64(lanes, kLowBytes); }

KV_AVX512 inline void rank_chunk(__m512i x, const __m512i* r, __m512i l0, __m512i l1, __mmask64 valid, __m512i esc,
                                 uint8_t* ranks, __m512i& sum, uint8_t*& escaped) {
    const __m512i lo = _mm512_permutex2var_epi8(r[0], x, r[1]);
    const __m512i hi = _mm512_permutex2var_epi8(r[2], x, r[3]);
    const __m512i rank = _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
    _mm512_storeu_si512(ranks, rank);
    sum = _mm512_add_epi8(sum, _mm512_maskz_permutex2var_epi8(valid, l0, rank, l1));
    // The escaped symbols, appended in order (the store's bytes past them are
    // overwritten next or are slack).
    const __mmask64 hits = _mm512_mask_cmpeq_epi8_mask(valid, rank, esc);
    _mm512_storeu_si512(escaped, _mm512_maskz_compress_epi8(hits, x));
    escaped += _mm_popcnt_u64(hits);
}

}  // namespace

KV_AVX512 void rank_pass_avx512(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks,
                                uint8_t* lane_bits, uint8_t** escaped) {
    __m512i r[4];
    for (unsigned i = 0; i < 4; ++i) r[i] = _mm512_load_si512(t.rank + 64 * i);
    const __m512i l0 = _mm512_load_si512(t.len), l1 = _mm512_load_si512(t.len + 64);
    // No escape code: an index no rank has.
    const __m512i esc = _mm512_set1_epi8(char(t.esc_rank < kCodeSpace ? t.esc_rank : 0xff));
    constexpr unsigned kSums = kLanes / 64;
    __m512i sum[kSums];
    for (unsigned u = 0; u < kSums; ++u) sum[u] = _mm512_setzero_si512();
    uint8_t* x = *escaped;
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (unsigned u = 0; u < kSums; ++u)
            rank_chunk(_mm512_loadu_si512(src + i + 64 * u), r, l0, l1, ~__mmask64(0), esc, ranks + i + 64 * u, sum[u],
                       x);
    for (unsigned u = 0; i < n; ++u, i += 64) {
        const __mmask64 valid = _bzhi_u64(~0ull, unsigned(std::min<size_t>(64, n - i)));
        rank_chunk(_mm512_maskz_loadu_epi8(valid, src + i), r, l0, l1, valid, esc, ranks + i, sum[u], x);
    }
    for (unsigned u = 0; u < kSums; ++u) _mm512_storeu_si512(lane_bits + 64 * u, sum[u]);
    *escaped = x;
}

namespace {

// One register's lanes at one step of the lay-out: their code and length, the
// previous step's lengths (8 at step 0), and which lanes are active.
KV_AVX512 inline void lay_vector(__m512i& window, __m512i& bit, __m512i code, __m512i len, __m512i prev,
                                 __mmask32 lanes, __m256i iota, uint8_t*& q) {
    const __m512i seven = _mm512_set1_epi16(7);
    window = _mm512_or_si512(_mm512_srlv_epi16(window, len),
                             _mm512_sllv_epi16(code, _mm512_sub_epi16(_mm512_set1_epi16(16), len)));
    bit = _mm512_sub_epi16(bit, len);
    const __mmask32 take =
        _mm512_mask_cmplt_epu16_mask(lanes, _mm512_and_si512(_mm512_add_epi16(bit, seven), seven), prev);
    const __m512i shift = _mm512_and_si512(_mm512_sub_epi16(_mm512_setzero_si512(), bit), seven);
    const __m512i byte = _mm512_srli_epi16(_mm512_sllv_epi16(window, shift), 8);
    // The taken bytes at the top of 32 stored below q (the bytes under them are
    // written over by the steps before; a masked store is microcoded on Zen 4).
    const unsigned taken = unsigned(_mm_popcnt_u32(take));
    const __m256i packed = _mm512_cvtepi16_epi8(_mm512_maskz_compress_epi16(take, byte));
    const __m256i raise = _mm256_add_epi8(iota, _mm256_set1_epi8(char(taken)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q - 32), _mm256_permutexvar_epi8(raise, packed));
    q -= taken;
}

// The ranks of a register's active lanes, one a word.
KV_AVX512 inline __m512i ranks_at(const uint8_t* p, __mmask32 lanes) {
    return _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, p));
}

}  // namespace

KV_AVX512 void lay_out_avx512(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                              uint8_t** stream) {
    const __m512i c0 = _mm512_load_si512(t.code), c1 = _mm512_load_si512(t.code + 64);
    const __m512i l0 = _mm512_load_si512(t.len), l1 = _mm512_load_si512(t.len + 64);
    const __m256i iota = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                          22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
    // Each step's codes and lengths are looked up once, as the previous step's of
    // the step after it.
    __m512i window[kVectors], bit[kVectors], code[kVectors], len[kVectors];
    const size_t steps = (n + kLanes - 1) / kLanes, last = (steps - 1) * kLanes;
    const size_t active = n - last;
    for (unsigned v = 0; v < kVectors; ++v) {
        window[v] = _mm512_setzero_si512();
        bit[v] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lane_bits + 32 * v)));
        const __mmask32 lanes = first_lanes(unsigned(std::min<size_t>(32, active - std::min<size_t>(active, 32 * v))));
        const __m512i rank = ranks_at(ranks + last + 32 * v, lanes);
        code[v] = lookup(low_bytes_of(lanes), c0, rank, c1);
        len[v] = lookup(low_bytes_of(lanes), l0, rank, l1);
    }
    uint8_t* q = *stream;
    for (size_t step = steps; step-- > 0;) {
        const size_t base = step * kLanes;
#pragma GCC unroll 8
        for (unsigned v = kVectors; v-- > 0;) {
            __m512i prev_code = _mm512_setzero_si512(), prev_len = _mm512_set1_epi16(8);
            if (step) {
                const __m512i rank = ranks_at(ranks + base - kLanes + 32 * v, ~__mmask32(0));
                prev_code = lookup(kLowBytes, c0, rank, c1);
                prev_len = lookup(kLowBytes, l0, rank, l1);
            }
            const __mmask32 lanes = step + 1 < steps ? ~__mmask32(0)
                                                     : first_lanes(unsigned(
                                                           std::min<size_t>(32, active - std::min<size_t>(active, 32 * v))));
            if (lanes) lay_vector(window[v], bit[v], code[v], len[v], prev_len, lanes, iota, q);
            code[v] = prev_code;
            len[v] = prev_len;
        }
    }
    *stream = q;
}

namespace {

template <bool kEscapes>
KV_AVX512 inline size_t decode_steps(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                                     size_t step, size_t whole, uint8_t* dst, const Escapes& esc) {
    const uint8_t* p = *pos;
    const __m512i s0 = _mm512_load_si512(t.sym), s1 = _mm512_load_si512(t.sym + 64);
    const __m512i l0 = _mm512_load_si512(t.len), l1 = _mm512_load_si512(t.len + 64);
    const __m512i eight = _mm512_set1_epi16(8);
    const __m512i mark = _mm512_set1_epi8(char(esc.placeholder));
    // Joins two registers' low bytes: 64 consecutive symbols.
    alignas(64) static constexpr uint8_t kEvenBytes[64] = {
        0,   2,   4,   6,   8,   10,  12,  14,  16,  18,  20,  22,  24,  26,  28,  30,  32,  34,  36,  38,  40,  42,
        44,  46,  48,  50,  52,  54,  56,  58,  60,  62,  64,  66,  68,  70,  72,  74,  76,  78,  80,  82,  84,  86,
        88,  90,  92,  94,  96,  98,  100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126};
    const __m512i evens = _mm512_load_si512(kEvenBytes);
    __m512i window[kVectors], bits[kVectors];
    for (unsigned v = 0; v < kVectors; ++v) {
        window[v] = _mm512_load_si512(s.window + 32 * v);
        bits[v] = _mm512_load_si512(s.bits + 32 * v);
    }
    // Each register reads 32 bytes at p and takes at most 32: a step reads below p + kLanes.
    for (; step < whole && size_t(end - p) >= kLanes; ++step) {
        uint8_t* out = dst + step * kLanes;
        // Two registers at a time, stored as soon as decoded (eight live results
        // spilled the lanes' state).
        // (Unrolled, or the lanes' state lives in memory.)
#pragma GCC unroll 4
        for (unsigned v = 0; v < kVectors; v += 2) {
            __m512i sym[2];
#pragma GCC unroll 2
            for (unsigned u = 0; u < 2; ++u) {
                __m512i& w = window[v + u];
                __m512i& b = bits[v + u];
                const __mmask32 take = _mm512_cmplt_epu16_mask(b, eight);
                const __m512i next = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
                const __m512i fill = _mm512_maskz_expand_epi16(take, next);
                w = _mm512_or_si512(w, _mm512_sllv_epi16(fill, _mm512_sub_epi16(eight, b)));
                b = _mm512_mask_add_epi16(b, take, b, eight);
                p += _mm_popcnt_u32(take);
                const __m512i idx = _mm512_srli_epi16(w, 16 - kMaxLen);
                const __m512i len = lookup(kLowBytes, l0, idx, l1);
                sym[u] = _mm512_permutex2var_epi8(s0, idx, s1);
                w = _mm512_sllv_epi16(w, len);
                b = _mm512_sub_epi16(b, len);
            }
            const __m512i x = _mm512_permutex2var_epi8(sym[0], evens, sym[1]);
            _mm512_storeu_si512(out + 32 * v, x);
            if (kEscapes) esc.hits[(out - dst) / 64 + v / 2] = _mm512_cmpeq_epi8_mask(x, mark);
        }
    }
    for (unsigned v = 0; v < kVectors; ++v) {
        _mm512_store_si512(s.window + 32 * v, window[v]);
        _mm512_store_si512(s.bits + 32 * v, bits[v]);
    }
    *pos = p;
    return step;
}

}  // namespace

KV_AVX512 size_t decode_steps_avx512(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                                     size_t step, size_t n, uint8_t* dst, const Escapes& esc) {
    return esc.count ? decode_steps<true>(pos, end, t, s, step, n / kLanes, dst, esc)
                     : decode_steps<false>(pos, end, t, s, step, n / kLanes, dst, esc);
}

}  // namespace kvcore::entropy::lanes::detail
#endif  // KVCORE_X86
