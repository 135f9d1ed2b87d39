#include "shuffle/sign_bits.h"

#include "common/arch.h"
#if KVCORE_X86
#include <immintrin.h>
#endif  // KVCORE_X86

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/little_endian.h"
#include "cpu/cpu_features.h"

namespace kvcore::shuffle {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the mantissa stream is read as little-endian words");

#if KVCORE_X86
// Bits 7..1 of every byte of a word: where the mantissa values go back.
constexpr uint64_t kHighSeven = 0xFEFEFEFEFEFEFEFEull;
#endif  // KVCORE_X86

// 8 bytes -> their 8 values of 7 bits, as 56 bits.
inline uint64_t pack_word_portable(uint64_t w) {
    uint64_t m = 0;
    for (unsigned j = 0; j < 8; ++j) m |= ((w >> (8 * j + 1)) & 0x7F) << (7 * j);
    return m;
}
inline uint64_t unpack_word_portable(uint64_t m) {
    uint64_t w = 0;
    for (unsigned j = 0; j < 8; ++j) w |= ((m >> (7 * j)) & 0x7F) << (8 * j + 1);
    return w;
}

// A word's 7 packed bytes move as one 8-byte load or store (a 7-byte copy goes
// through memory piecewise), except the last word's, which may end the buffer:
// the 8th byte stored is the next word's first, and the 8th byte loaded is
// masked off.
constexpr uint64_t kLow56 = (uint64_t(1) << 56) - 1;

inline uint64_t load_packed(const uint8_t* p, bool last) {
    uint64_t m = 0;
    std::memcpy(&m, p, last ? 7 : 8);
    return m & kLow56;
}
inline void store_packed(uint8_t* p, uint64_t m, bool last) { std::memcpy(p, &m, last ? 7 : 8); }

// The whole 8-byte words of the plane (n / 8 of them), portably or with BMI2's
// bit gather / scatter; both give the same bytes.
void pack_words_portable(const uint8_t* plane, size_t words, uint8_t* mantissa) {
    for (size_t q = 0; q < words; ++q) {
        uint64_t w;
        std::memcpy(&w, plane + 8 * q, 8);
        store_packed(mantissa + 7 * q, pack_word_portable(w), q + 1 == words);
    }
}
void unpack_words_portable(const uint8_t* mantissa, size_t words, uint8_t* plane) {
    for (size_t q = 0; q < words; ++q) {
        const uint64_t w = unpack_word_portable(load_packed(mantissa + 7 * q, q + 1 == words));
        std::memcpy(plane + 8 * q, &w, 8);
    }
}
#if KVCORE_X86
__attribute__((target("bmi2"))) void pack_words_bmi2(const uint8_t* plane, size_t words, uint8_t* mantissa) {
    for (size_t q = 0; q < words; ++q) {
        uint64_t w;
        std::memcpy(&w, plane + 8 * q, 8);
        store_packed(mantissa + 7 * q, _pext_u64(w, kHighSeven), q + 1 == words);
    }
}
__attribute__((target("bmi2"))) void unpack_words_bmi2(const uint8_t* mantissa, size_t words, uint8_t* plane) {
    for (size_t q = 0; q < words; ++q) {
        const uint64_t w = _pdep_u64(load_packed(mantissa + 7 * q, q + 1 == words), kHighSeven);
        std::memcpy(plane + 8 * q, &w, 8);
    }
}

// The AVX2 level (it includes BMI2): pext / pdep, and 32-byte vectors for the sign passes.
bool avx2_level() { return (cpu::active_isa() & cpu::kIsaAvx2) != 0; }

bool avx512_level() { return (cpu::active_isa() & cpu::kIsaAvx512) != 0; }
#endif  // KVCORE_X86

// Groups of 64 bytes (56 packed) with AVX-512, then words of 8 (7 packed), then the tail.
void pack_mantissa(const uint8_t* plane, size_t n, uint8_t* mantissa) {
#if KVCORE_X86
    if (avx512_level() && n >= 64) {
        const size_t groups = n / 64;
        detail::pack_mantissa_groups_avx512(plane, groups, mantissa);
        plane += 64 * groups, mantissa += 56 * groups, n -= 64 * groups;
    }
#endif  // KVCORE_X86
    const size_t words = n / 8, tail = n % 8;
#if KVCORE_X86
    if (avx2_level()) pack_words_bmi2(plane, words, mantissa);
    else
#endif  // KVCORE_X86
    pack_words_portable(plane, words, mantissa);
    if (tail) {
        uint64_t w = 0;
        std::memcpy(&w, plane + 8 * words, tail);
        const uint64_t m = pack_word_portable(w);  // the zero bytes past the end add nothing
        std::memcpy(mantissa + 7 * words, &m, (7 * tail + 7) / 8);
    }
}

// False when the tail's unused stream bits are set.
bool unpack_mantissa(const uint8_t* mantissa, size_t n, uint8_t* plane) {
#if KVCORE_X86
    if (avx512_level() && n >= 64) {
        const size_t groups = n / 64;
        detail::unpack_mantissa_groups_avx512(mantissa, groups, plane);
        plane += 64 * groups, mantissa += 56 * groups, n -= 64 * groups;
    }
#endif  // KVCORE_X86
    const size_t words = n / 8, tail = n % 8;
#if KVCORE_X86
    if (avx2_level()) unpack_words_bmi2(mantissa, words, plane);
    else
#endif  // KVCORE_X86
    unpack_words_portable(mantissa, words, plane);
    if (tail) {
        uint64_t m = 0;
        std::memcpy(&m, mantissa + 7 * words, (7 * tail + 7) / 8);
        if (m >> (7 * tail)) return false;
        const uint64_t w = unpack_word_portable(m);
        std::memcpy(plane + 8 * words, &w, tail);
    }
    return true;
}

constexpr uint64_t kBitZero = 0x0101010101010101ull;  // bit 0 of every byte of a word

// Row r's bit 0s into the sign bytes of its group (bit r % 8), and into the
// channels' counts of ones (byte lanes of `lanes`, one word per 8 channels).
// Words of 8 channels, then the channels past the last whole word one by one.
// Plain code that the compiler vectorises; instantiated for AVX2 and the base ISA.
inline void gather_row(const uint8_t* row, size_t c_n, unsigned k, uint8_t* out, uint64_t* lanes, uint32_t* ones) {
    const size_t whole = c_n / 8 * 8;
    for (size_t c = 0; c < whole; c += 8) {
        const uint64_t s = load64(row + c) & kBitZero;
        store64(out + c, load64(out + c) | s << k);
        lanes[c / 8] += s;
    }
    for (size_t c = whole; c < c_n; ++c) {
        out[c] = uint8_t(out[c] | (row[c] & 1u) << k);
        ones[c] += row[c] & 1u;
    }
}

inline void scatter_row(uint8_t* row, size_t c_n, unsigned k, const uint8_t* in, const uint64_t* flip) {
    const size_t whole = c_n / 8 * 8;
    for (size_t c = 0; c < whole; c += 8)
        store64(row + c, load64(row + c) | ((load64(in + c) ^ flip[c / 8]) >> k & kBitZero));
    for (size_t c = whole; c < c_n; ++c) {
        const unsigned f = (flip[c / 8] >> (8 * (c % 8))) & 1u;
        row[c] = uint8_t(row[c] | (((in[c] >> k) & 1u) ^ f));
    }
}

// Counts of ones per channel (ones[c]); the byte lanes are emptied every 255 rows.
template <void (*Gather)(const uint8_t*, size_t, unsigned, uint8_t*, uint64_t*, uint32_t*)>
void gather_signs(const uint8_t* plane, size_t rows, size_t c_n, uint8_t* signs, uint32_t* ones) {
    std::vector<uint64_t> lanes(c_n / 8, 0);
    for (size_t r = 0; r < rows; ++r) {
        Gather(plane + r * c_n, c_n, unsigned(r % 8), signs + (r / 8) * c_n, lanes.data(), ones);
        if (r % 255 == 254 || r + 1 == rows) {
            for (size_t w = 0; w < lanes.size(); ++w)
                for (unsigned b = 0; b < 8; ++b) ones[8 * w + b] += uint32_t((lanes[w] >> (8 * b)) & 0xFF);
            std::fill(lanes.begin(), lanes.end(), 0);
        }
    }
}
template <void (*Scatter)(uint8_t*, size_t, unsigned, const uint8_t*, const uint64_t*)>
void scatter_signs(uint8_t* plane, size_t rows, size_t c_n, const uint8_t* signs, const uint64_t* flip) {
    for (size_t r = 0; r < rows; ++r) Scatter(plane + r * c_n, c_n, unsigned(r % 8), signs + (r / 8) * c_n, flip);
}

void gather_row_base(const uint8_t* row, size_t c_n, unsigned k, uint8_t* out, uint64_t* lanes, uint32_t* ones) {
    gather_row(row, c_n, k, out, lanes, ones);
}
#if KVCORE_X86
__attribute__((target("avx2"))) void gather_row_avx2(const uint8_t* row, size_t c_n, unsigned k, uint8_t* out,
                                                     uint64_t* lanes, uint32_t* ones) {
    gather_row(row, c_n, k, out, lanes, ones);
}
#endif  // KVCORE_X86
void scatter_row_base(uint8_t* row, size_t c_n, unsigned k, const uint8_t* in, const uint64_t* flip) {
    scatter_row(row, c_n, k, in, flip);
}
#if KVCORE_X86
__attribute__((target("avx2"))) void scatter_row_avx2(uint8_t* row, size_t c_n, unsigned k, const uint8_t* in,
                                                      const uint64_t* flip) {
    scatter_row(row, c_n, k, in, flip);
}
#endif  // KVCORE_X86

}  // namespace

size_t sign_bits_mantissa_size(size_t n) { return n / 8 * 7 + (7 * (n % 8) + 7) / 8; }
size_t sign_bits_flips_size(uint32_t channels) { return (size_t(channels) + 7) / 8; }
size_t sign_bits_signs_size(size_t rows, uint32_t channels) { return (rows + 7) / 8 * channels; }

void split_sign_bits(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* mantissa, uint8_t* flips,
                     uint8_t* signs) {
    const size_t c_n = channels, groups = (rows + 7) / 8;
    std::memset(signs, 0, groups * c_n);
    std::vector<uint32_t> ones(c_n, 0);
#if KVCORE_X86
    if (avx2_level()) gather_signs<gather_row_avx2>(plane, rows, c_n, signs, ones.data());
    else
#endif  // KVCORE_X86
    gather_signs<gather_row_base>(plane, rows, c_n, signs, ones.data());
    // The flip keeps the bits that are 0 in most rows; bits of rows past the end stay 0.
    std::memset(flips, 0, sign_bits_flips_size(channels));
    std::vector<uint8_t> mask(c_n);
    for (size_t c = 0; c < c_n; ++c) {
        const bool flip = 2 * size_t(ones[c]) > rows;
        mask[c] = flip ? 0xFF : 0;
        flips[c / 8] |= uint8_t(unsigned(flip) << (c % 8));
    }
    const uint8_t last = uint8_t((1u << (rows - 8 * (groups - 1))) - 1);  // the rows of the last group
    for (size_t g = 0; g < groups; ++g) {
        const uint8_t valid = g + 1 == groups ? last : 0xFF;
        uint8_t* out = signs + g * c_n;
        for (size_t c = 0; c < c_n; ++c) out[c] ^= mask[c] & valid;
    }
    pack_mantissa(plane, rows * c_n, mantissa);
}

bool join_sign_bits(const uint8_t* mantissa, const uint8_t* flips, const uint8_t* signs, size_t rows,
                    uint32_t channels, uint8_t* plane) {
    const size_t c_n = channels, groups = (rows + 7) / 8;
    if (channels % 8 && (flips[c_n / 8] >> (c_n % 8)) != 0) return false;
    const unsigned last_rows = unsigned(rows - 8 * (groups - 1));
    if (last_rows < 8) {
        uint8_t stray = 0;
        const uint8_t* last = signs + (groups - 1) * c_n;
        for (size_t c = 0; c < c_n; ++c) stray |= uint8_t(last[c] >> last_rows);
        if (stray) return false;
    }
    if (!unpack_mantissa(mantissa, rows * c_n, plane)) return false;
    // Channel c's flip as a byte of 0xFF or 0, 8 channels to a word.
    std::vector<uint64_t> flip((c_n + 7) / 8, 0);
    for (size_t c = 0; c < c_n; ++c)
        if ((flips[c / 8] >> (c % 8)) & 1u) flip[c / 8] |= uint64_t(0xFF) << (8 * (c % 8));
#if KVCORE_X86
    if (avx2_level()) scatter_signs<scatter_row_avx2>(plane, rows, c_n, signs, flip.data());
    else
#endif  // KVCORE_X86
    scatter_signs<scatter_row_base>(plane, rows, c_n, signs, flip.data());
    return true;
}

}  // namespace kvcore::shuffle
