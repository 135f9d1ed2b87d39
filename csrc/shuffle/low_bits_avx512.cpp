// Low-bit join (low_bits.h), AVX-512 (F, BW): one 64-element group per
// register. 64-bit lane p of the group holds elements 8p..8p+7; its low bits
// sit in packed word K p / 8 at bit K p % 8 (and spill into the next word), so
// a lane's bits are two qword permutes of the group's K words, each shifted by
// the lane's own count and masked per byte.
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

}  // namespace

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
