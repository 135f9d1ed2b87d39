// Low-bit split and join (low_bits.h), AVX-512 (F, BW): one 64-element group
// per register. 64-bit lane p of the group holds elements 8p..8p+7; its low bits
// sit in packed word K p / 8 at bit K p % 8 (and spill into the next word), so
// a lane's bits are two qword permutes of the group's K words, each shifted by
// the lane's own count and masked per byte. The split runs the other way: each
// lane's bits shifted into place, then gathered into the K words by permutes
// (the lanes that share a word hold disjoint bits of it, so OR joins them).
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
#include "shuffle/low_bits.h"

namespace kvcore::shuffle::detail {
namespace {

constexpr uint64_t kOnes = 0x0101010101010101ull;
constexpr uint64_t bytes_of(unsigned b) { return kOnes * (b & 0xFFu); }

// Per-lane constants for K: source words, shifts and byte masks of the two parts.
template <unsigned K>
struct Lanes {
    uint64_t word[8], shift[8], mask[8];          // (packed[word] >> shift) & mask
    uint64_t spill_word[8], spill_shift[8], spill_mask[8];  // | (packed[spill_word] << spill_shift) & spill_mask
    constexpr Lanes() : word(), shift(), mask(), spill_word(), spill_shift(), spill_mask() {
        for (unsigned p = 0; p < 8; ++p) {
            const unsigned j = K * p / 8, s = K * p % 8;
            const bool spills = s + K > 8;
            word[p] = j;
            shift[p] = s;
            mask[p] = bytes_of((1u << (spills ? 8 - s : K)) - 1);
            spill_word[p] = spills ? j + 1 : j;
            spill_shift[p] = spills ? 8 - s : 0;
            spill_mask[p] = spills ? bytes_of(((1u << K) - 1) & ~((1u << (8 - s)) - 1)) : 0;
        }
    }
};

KV_AVX512 inline __m512i load_lanes(const uint64_t* v) { return _mm512_loadu_si512(v); }

// The low bits of group g, one per byte.
template <unsigned K>
struct GroupBits {
    static constexpr Lanes<K> L{};
    __m512i word, shift, mask, spill_word, spill_shift, spill_mask;
    KV_AVX512 GroupBits()
        : word(load_lanes(L.word)), shift(load_lanes(L.shift)), mask(load_lanes(L.mask)),
          spill_word(load_lanes(L.spill_word)), spill_shift(load_lanes(L.spill_shift)),
          spill_mask(load_lanes(L.spill_mask)) {}
    KV_AVX512 __m512i operator()(const uint8_t* packed, size_t g) const {
        const uint8_t words = uint8_t((1u << K) - 1);  // the group's K packed words
        const __m512i w = _mm512_maskz_loadu_epi64(words, packed + 8 * K * g);
        const __m512i a = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutexvar_epi64(word, w), shift), mask);
        const __m512i b = _mm512_and_si512(_mm512_sllv_epi64(_mm512_permutexvar_epi64(spill_word, w), spill_shift),
                                           spill_mask);
        return _mm512_or_si512(a, b);
    }
};

// Joins whole groups in place; returns whether no symbol had a bit above 8 - K.
template <unsigned K>
KV_AVX512 bool join_groups(uint8_t* plane, size_t groups, const uint8_t* packed) {
    const GroupBits<K> low;
    const __m512i high_bits = _mm512_set1_epi8(char(~(0xFFu >> K)));  // must be 0 in a valid stream
    const __m512i above_low = _mm512_set1_epi8(char(~((1u << K) - 1)));
    __m512i stray = _mm512_setzero_si512();
    for (size_t g = 0; g < groups; ++g) {
        uint8_t* out = plane + 64 * g;
        const __m512i x = _mm512_loadu_si512(out);
        stray = _mm512_or_si512(stray, _mm512_and_si512(x, high_bits));
        const __m512i shifted = _mm512_and_si512(_mm512_slli_epi16(x, K), above_low);
        _mm512_storeu_si512(out, _mm512_or_si512(shifted, low(packed, g)));
    }
    return _mm512_test_epi8_mask(stray, stray) == 0;
}

// Whole groups of plane = base | low bits << shift. The low bits are below
// 2^K and shift + K <= 8, so a 16-bit shift moves no bit into the next byte.
template <unsigned K>
KV_AVX512 void expand_groups(uint8_t* plane, size_t groups, const uint8_t* packed, unsigned shift, uint8_t base) {
    const GroupBits<K> low;
    const __m128i count = _mm_cvtsi32_si128(int(shift));
    const __m512i fill = _mm512_set1_epi8(char(base));
    for (size_t g = 0; g < groups; ++g)
        _mm512_storeu_si512(plane + 64 * g, _mm512_or_si512(fill, _mm512_sll_epi16(low(packed, g), count)));
}

// Per-lane constants of the split for K: where lane p's low bits go. Its part in
// word K p / 8 is (low << shift) & mask, its spill into the next word (low >>
// spill_shift) & spill_mask (mask 0: none). Round r of the gather moves, into
// word j, the r-th lane whose part goes there (from[r][j], where bit j of
// take[r] is set); the spill round the one lane that spills into j.
template <unsigned K>
struct SplitLanes {
    static constexpr unsigned kRounds = (8 + K - 1) / K + 1;  // lanes sharing a word, at most
    uint64_t shift[8], mask[8], spill_shift[8], spill_mask[8];
    uint64_t from[kRounds][8], spill_from[8];
    uint8_t take[kRounds], spill_take;
    unsigned rounds;
    constexpr SplitLanes()
        : shift(), mask(), spill_shift(), spill_mask(), from(), spill_from(), take(), spill_take(), rounds() {
        unsigned count[8] = {};  // lanes given to each word so far
        for (unsigned p = 0; p < 8; ++p) {
            const unsigned j = K * p / 8, s = K * p % 8;
            shift[p] = s;
            mask[p] = bytes_of(0xFFu << s);
            const unsigned r = count[j]++;
            from[r][j] = p;
            take[r] = uint8_t(take[r] | 1u << j);
            if (r + 1 > rounds) rounds = r + 1;
            if (s + K > 8) {
                spill_shift[p] = 8 - s;
                spill_mask[p] = bytes_of((1u << (s + K - 8)) - 1);
                spill_from[j + 1] = p;
                spill_take = uint8_t(spill_take | 1u << (j + 1));
            }
        }
    }
};

// Whole groups: packed gets each group's K words; high (unless null) each byte >> K.
// from: the lowest bit packed of each byte (0 for the split).
template <unsigned K>
KV_AVX512 void split_groups(const uint8_t* src, size_t groups, unsigned from, uint8_t* high, uint8_t* packed) {
    static constexpr SplitLanes<K> L{};
    const __m512i shift = load_lanes(L.shift), mask = load_lanes(L.mask);
    const __m512i spill_shift = load_lanes(L.spill_shift), spill_mask = load_lanes(L.spill_mask);
    const __m512i spill_from = load_lanes(L.spill_from);
    __m512i round_from[SplitLanes<K>::kRounds];
    for (unsigned r = 0; r < L.rounds; ++r) round_from[r] = load_lanes(L.from[r]);
    const __m512i low_mask = _mm512_set1_epi8(char((1u << K) - 1));
    const __m512i high_mask = _mm512_set1_epi8(char(0xFFu >> K));
    const __m128i from_count = _mm_cvtsi32_si128(int(from));
    const uint8_t words = uint8_t((1u << K) - 1);
    for (size_t g = 0; g < groups; ++g) {
        const __m512i x = _mm512_loadu_si512(src + 64 * g);
        const __m512i low = _mm512_and_si512(_mm512_srl_epi64(x, from_count), low_mask);
        const __m512i part = _mm512_and_si512(_mm512_sllv_epi64(low, shift), mask);
        const __m512i spill = _mm512_and_si512(_mm512_srlv_epi64(low, spill_shift), spill_mask);
        __m512i w = _mm512_maskz_permutexvar_epi64(L.spill_take, spill_from, spill);
        for (unsigned r = 0; r < L.rounds; ++r)
            w = _mm512_or_si512(w, _mm512_maskz_permutexvar_epi64(L.take[r], round_from[r], part));
        _mm512_mask_storeu_epi64(packed + 8 * K * g, words, w);
        if (high) _mm512_storeu_si512(high + 64 * g, _mm512_and_si512(_mm512_srli_epi64(x, K), high_mask));
    }
}

}  // namespace

void split_low_bits_groups_avx512(const uint8_t* src, size_t groups, unsigned k, unsigned from, uint8_t* high,
                                  uint8_t* packed) {
    switch (k) {
        case 1: return split_groups<1>(src, groups, from, high, packed);
        case 2: return split_groups<2>(src, groups, from, high, packed);
        case 3: return split_groups<3>(src, groups, from, high, packed);
        case 4: return split_groups<4>(src, groups, from, high, packed);
        case 5: return split_groups<5>(src, groups, from, high, packed);
        case 6: return split_groups<6>(src, groups, from, high, packed);
        default: return split_groups<7>(src, groups, from, high, packed);
    }
}

bool join_low_bits_groups_avx512(uint8_t* plane, size_t groups, unsigned k, const uint8_t* packed) {
    switch (k) {
        case 1: return join_groups<1>(plane, groups, packed);
        case 2: return join_groups<2>(plane, groups, packed);
        case 3: return join_groups<3>(plane, groups, packed);
        case 4: return join_groups<4>(plane, groups, packed);
        case 5: return join_groups<5>(plane, groups, packed);
        case 6: return join_groups<6>(plane, groups, packed);
        default: return join_groups<7>(plane, groups, packed);
    }
}

void expand_low_bits_groups_avx512(uint8_t* plane, size_t groups, unsigned k, const uint8_t* packed, unsigned shift,
                                   uint8_t base) {
    switch (k) {
        case 1: return expand_groups<1>(plane, groups, packed, shift, base);
        case 2: return expand_groups<2>(plane, groups, packed, shift, base);
        case 3: return expand_groups<3>(plane, groups, packed, shift, base);
        case 4: return expand_groups<4>(plane, groups, packed, shift, base);
        case 5: return expand_groups<5>(plane, groups, packed, shift, base);
        case 6: return expand_groups<6>(plane, groups, packed, shift, base);
        default: return expand_groups<7>(plane, groups, packed, shift, base);
    }
}

}  // namespace kvcore::shuffle::detail

#endif  // KVCORE_X86
