#include "shuffle/low_bits.h"

#include <cstring>

#include "common/arch.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"

namespace kvcore::shuffle {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the packing works on little-endian 64-bit words");

constexpr size_t kGroup = 64;
constexpr uint64_t kOnes = 0x0101010101010101ull;

// Every byte of a word = b.
constexpr uint64_t bytes_of(unsigned b) { return kOnes * (b & 0xFFu); }


// One group of 64 elements. Element lane p (elements 8p..8p+7, one word) puts
// its K low bits at bit s = K p % 8 of word j = K p / 8, spilling into word j + 1
// when s + K > 8. All shifts stay inside byte lanes once masked.
// kHigh: also store each byte's high bits; from: the packed bits' lowest bit in
// each byte (0 for the split; from + K <= 8).
template <unsigned K, bool kHigh>
inline void split_group(const uint8_t* src, uint8_t* high, uint8_t* packed, unsigned from) {
    uint64_t words[K] = {};
    for (unsigned p = 0; p < 8; ++p) {
        const uint64_t w = load64(src + 8 * p);
        const uint64_t low = (w >> from) & bytes_of((1u << K) - 1);
        const unsigned j = K * p / 8, s = K * p % 8;
        words[j] |= (low << s) & bytes_of(0xFFu << s);
        if (s + K > 8) words[j + 1] |= (low >> (8 - s)) & bytes_of((1u << (s + K - 8)) - 1);
        if (kHigh) store64(high + 8 * p, (w >> K) & bytes_of(0xFFu >> K));
    }
    for (unsigned j = 0; j < K; ++j) store64(packed + 8 * j, words[j]);
}

// The low bits of elements 8p..8p+7 of a group (one per byte) from its K packed words.
template <unsigned K>
inline uint64_t lane_low_bits(const uint64_t* words, unsigned p) {
    const unsigned j = K * p / 8, s = K * p % 8;
    const unsigned here = s + K > 8 ? 8 - s : K;  // bits in word j; the rest in word j + 1
    uint64_t low = (words[j] >> s) & bytes_of((1u << here) - 1);
    if (s + K > 8) low |= (words[j + 1] << (8 - s)) & bytes_of(((1u << K) - 1) & ~((1u << (8 - s)) - 1));
    return low;
}

// Returns the bits of the group's symbols above 8 - K (0 for a valid stream).
template <unsigned K>
inline uint64_t join_group(uint8_t* plane, const uint8_t* packed) {
    uint64_t stray = 0;
    uint64_t words[K];
    for (unsigned j = 0; j < K; ++j) words[j] = load64(packed + 8 * j);
    for (unsigned p = 0; p < 8; ++p) {
        const uint64_t w = load64(plane + 8 * p);
        stray |= w & ~bytes_of(0xFFu >> K);
        store64(plane + 8 * p, ((w << K) & ~bytes_of((1u << K) - 1)) | lane_low_bits<K>(words, p));
    }
    return stray;
}

// plane[i] = base | low bits of i << shift for the group (shift + K <= 8).
template <unsigned K>
inline void expand_group(uint8_t* plane, const uint8_t* packed, unsigned shift, uint64_t base) {
    uint64_t words[K];
    for (unsigned j = 0; j < K; ++j) words[j] = load64(packed + 8 * j);
    for (unsigned p = 0; p < 8; ++p) store64(plane + 8 * p, base | lane_low_bits<K>(words, p) << shift);
}

template <unsigned K, bool kHigh>
void split_k(const uint8_t* src, size_t n, uint8_t* high, uint8_t* packed, unsigned from) {
    size_t i = 0;
#if KVCORE_X86
    if (cpu::active_isa() & cpu::kIsaAvx512) {
        i = n / kGroup * kGroup;
        detail::split_low_bits_groups_avx512(src, n / kGroup, K, from, kHigh ? high : nullptr, packed);
        packed += 8 * K * (n / kGroup);
    }
#endif  // KVCORE_X86
    for (; i + kGroup <= n; i += kGroup, packed += 8 * K)
        split_group<K, kHigh>(src + i, kHigh ? high + i : nullptr, packed, from);
    if (i < n) {  // the last group, padded with zero bytes
        uint8_t in[kGroup] = {}, out[kGroup];
        std::memcpy(in, src + i, n - i);
        split_group<K, kHigh>(in, out, packed, from);
        if (kHigh) std::memcpy(high + i, out, n - i);
    }
}

template <unsigned K>
bool join_k(uint8_t* plane, size_t n, const uint8_t* packed) {
    uint64_t stray = 0;
    size_t i = 0;
#if KVCORE_X86
    if (cpu::active_isa() & cpu::kIsaAvx512) {
        i = n / kGroup * kGroup;
        stray = !detail::join_low_bits_groups_avx512(plane, n / kGroup, K, packed);
        packed += 8 * K * (n / kGroup);
    }
#endif  // KVCORE_X86
    for (; i + kGroup <= n; i += kGroup, packed += 8 * K) stray |= join_group<K>(plane + i, packed);
    if (i < n) {
        uint8_t tmp[kGroup] = {};
        std::memcpy(tmp, plane + i, n - i);
        stray |= join_group<K>(tmp, packed);
        std::memcpy(plane + i, tmp, n - i);
        for (size_t j = n - i; j < kGroup; ++j) stray |= tmp[j];  // the padding's low bits are 0
    }
    return stray == 0;
}

template <unsigned K>
bool expand_k(uint8_t* plane, size_t n, const uint8_t* packed, unsigned shift, uint8_t base) {
    size_t i = 0;
#if KVCORE_X86
    if (cpu::active_isa() & cpu::kIsaAvx512) {
        i = n / kGroup * kGroup;
        detail::expand_low_bits_groups_avx512(plane, n / kGroup, K, packed, shift, base);
        packed += 8 * K * (n / kGroup);
    }
#endif  // KVCORE_X86
    for (; i + kGroup <= n; i += kGroup, packed += 8 * K) expand_group<K>(plane + i, packed, shift, bytes_of(base));
    if (i == n) return true;
    // The last group: its padding's low bits must be 0, as join_k checks them.
    uint8_t tmp[kGroup];
    expand_group<K>(tmp, packed, 0, 0);
    uint8_t stray = 0;
    for (size_t j = n - i; j < kGroup; ++j) stray |= tmp[j];
    for (size_t j = 0; j < n - i; ++j) plane[i + j] = static_cast<uint8_t>(base | tmp[j] << shift);
    return stray == 0;
}

}  // namespace

size_t low_bits_packed_size(size_t n, unsigned k) { return 8 * k * ((n + kGroup - 1) / kGroup); }

void split_low_bits(const uint8_t* src, size_t n, unsigned k, uint8_t* high, uint8_t* packed) {
    switch (k) {
        case 1: return split_k<1, true>(src, n, high, packed, 0);
        case 2: return split_k<2, true>(src, n, high, packed, 0);
        case 3: return split_k<3, true>(src, n, high, packed, 0);
        case 4: return split_k<4, true>(src, n, high, packed, 0);
        case 5: return split_k<5, true>(src, n, high, packed, 0);
        case 6: return split_k<6, true>(src, n, high, packed, 0);
        default: return split_k<7, true>(src, n, high, packed, 0);
    }
}

void pack_bits(const uint8_t* src, size_t n, unsigned k, unsigned from, uint8_t* packed) {
    switch (k) {
        case 1: return split_k<1, false>(src, n, nullptr, packed, from);
        case 2: return split_k<2, false>(src, n, nullptr, packed, from);
        case 3: return split_k<3, false>(src, n, nullptr, packed, from);
        case 4: return split_k<4, false>(src, n, nullptr, packed, from);
        case 5: return split_k<5, false>(src, n, nullptr, packed, from);
        case 6: return split_k<6, false>(src, n, nullptr, packed, from);
        default: return split_k<7, false>(src, n, nullptr, packed, from);
    }
}

bool join_low_bits(uint8_t* plane, size_t n, unsigned k, const uint8_t* packed) {
    switch (k) {
        case 1: return join_k<1>(plane, n, packed);
        case 2: return join_k<2>(plane, n, packed);
        case 3: return join_k<3>(plane, n, packed);
        case 4: return join_k<4>(plane, n, packed);
        case 5: return join_k<5>(plane, n, packed);
        case 6: return join_k<6>(plane, n, packed);
        default: return join_k<7>(plane, n, packed);
    }
}

bool expand_low_bits(const uint8_t* packed, size_t n, unsigned k, unsigned shift, uint8_t base, uint8_t* plane) {
    switch (k) {
        case 1: return expand_k<1>(plane, n, packed, shift, base);
        case 2: return expand_k<2>(plane, n, packed, shift, base);
        case 3: return expand_k<3>(plane, n, packed, shift, base);
        case 4: return expand_k<4>(plane, n, packed, shift, base);
        case 5: return expand_k<5>(plane, n, packed, shift, base);
        case 6: return expand_k<6>(plane, n, packed, shift, base);
        default: return expand_k<7>(plane, n, packed, shift, base);
    }
}

}  // namespace kvcore::shuffle
