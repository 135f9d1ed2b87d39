// "fast" plane coder, AVX-512 group decoder and encoder (F, BW, VBMI, VBMI2);
// layout in fastcode_format.h. 64 symbols (output vectors i = 2J and 2J + 1 of a
// group) per register.
// Decoder: each code component is one 32-byte vector of the group, broadcast to
// both halves and rotated by a different count in each; the components are
// spliced (complemented) by bit selects, looked up by one byte permute in the
// reversed table (up to 128 entries, row-progressive tables too); escapes are a
// mask, filled from the literals by one expand-load. No marker byte and no
// second pass.
// Encoder: a byte's code is two 128-entry permutes and a blend; each component
// is shifted into place per half and the halves OR-ed into one 32-byte vector;
// escaped bytes leave by one compress per register.
#include "common/arch.h"
#if KVCORE_X86
#include <algorithm>
#include <cstring>

#include "common/avx512_target.h"
// (after avx512_target.h, which defines KV_AVX512)
#include "checksum/xxh3_stripes_avx512.h"
#include "entropy/fastcode_format.h"
#include "shuffle/interleave_avx512.h"

namespace kvcore::entropy::fastcode_detail {
namespace {

constexpr bool has_comp(unsigned w, unsigned c) { return (w & c) != 0; }
constexpr unsigned comp_offset(unsigned w, unsigned c) { return c == 4 ? 0 : c == 2 ? (w & 4) : (w & 6); }

// Where a C-bit component of output vectors 2J and 2J + 1 sits in its byte of the
// group's vector: bit C * f in the low half (vector 2J) and C * (f + 1) in the high
// half, f = 2J mod 8 / C.
constexpr unsigned field_bit(unsigned c, unsigned j) { return c * ((2 * j) % (8 / c)); }

// A 16-bit count for each half of a register (lo: vector 2J, hi: 2J + 1).
KV_AVX512 inline __m512i per_half(unsigned lo, unsigned hi) {
    return _mm512_inserti64x4(_mm512_set1_epi16(short(lo)), _mm256_set1_epi16(short(hi)), 1);
}

// The component's position as shift counts (the encoder shifts fields up to it).
template <unsigned C, unsigned J>
KV_AVX512 inline __m512i half_shifts() {
    return per_half(field_bit(C, J), field_bit(C, J) + C);
}

// Component (C bits at code offset o) of output vectors 2J, 2J + 1, rotated (per
// 16-bit lane, one count per half) to bits [o, o + C) of each byte; the byte's
// other bits are left as garbage for the caller to mask off or ignore.
template <unsigned W, unsigned C, unsigned J>
KV_AVX512 inline __m512i component(const uint8_t* g) {
    constexpr unsigned o = comp_offset(W, C), per = 8 / C, at = field_bit(C, J);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * (o + 2 * J / per)));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
    const __m512i counts = per_half((o + 16 - at) % 16, (o + 16 - at - C) % 16);
    return _mm512_shldv_epi16(both, both, counts);  // a funnel shift of a word with itself: a rotate
}

// Bits [O, 8) of each byte from b, [0, O) from a; kNot: the complement of that.
template <unsigned O, bool kNot>
KV_AVX512 inline __m512i splice(__m512i a, __m512i b) {
    const __m512i take_b = _mm512_set1_epi8(char(0xFFu << O));
    return _mm512_ternarylogic_epi32(take_b, a, b, kNot ? 0x53 : 0xAC);  // 0xAC: take_b ? b : a
}

// The complement of the 64 codes of output vectors 2J, 2J + 1 in their low W bits
// (bits above: garbage): the symbol lookup then reads a reversed table, and an
// escape (all W bits set) is a byte whose low W bits are all clear. Against
// shifting each component down, masking and shifting it up: 2-4 fewer operations
// per register (fastcode decode 1.05-1.25x on KV planes).
template <unsigned W, unsigned J>
KV_AVX512 inline __m512i inverted_codes_of(const uint8_t* g) {
    // (each component in a local: the emulation's intrinsics are macros, which split template arguments)
    constexpr unsigned n = has_comp(W, 4) + has_comp(W, 2) + has_comp(W, 1);
    __m512i code;
    if constexpr (has_comp(W, 4)) code = component<W, 4, J>(g);
    if constexpr (has_comp(W, 2)) {
        const __m512i part = component<W, 2, J>(g);
        if constexpr (has_comp(W, 4)) {
            code = splice<comp_offset(W, 2), !has_comp(W, 1)>(code, part);
        } else {
            code = part;
        }
    }
    if constexpr (has_comp(W, 1)) {
        const __m512i part = component<W, 1, J>(g);
        if constexpr (n > 1) {
            code = splice<comp_offset(W, 1), true>(code, part);
        } else {
            code = part;
        }
    }
    if constexpr (n == 1) code = _mm512_ternarylogic_epi32(code, code, code, 0x55);  // NOT
    return code;
}

// The symbols of 64 inverted codes (escapes: don't-care). R0, R1: the table
// reversed and repeated, entry j = table[2^W - 1 - (j mod 2^W)], so that the
// garbage bits above W in the 6 or 7 index bits a permute reads do not matter.
// A row-progressive table (fastcode_format.h) is looked up whole too: one permute
// is cheaper here than a row start plus the low bits (1.1-1.2x decode speed).
template <unsigned W>
KV_AVX512 inline __m512i symbols(__m512i inverted, __m512i R0, __m512i R1) {
    if constexpr (W == 7) {
        return _mm512_permutex2var_epi8(R0, inverted, R1);
    } else {
        return _mm512_permutexvar_epi8(inverted, R0);
    }
}

// The reversed, repeated table of symbols() in two registers.
template <unsigned W>
KV_AVX512 inline void reversed_table(const uint8_t* table, __m512i* R0, __m512i* R1) {
    alignas(64) uint8_t reversed[128];
    constexpr unsigned top = (1u << W) - 1;
    for (unsigned j = 0; j < 128; ++j) reversed[j] = table[top - (j & top)];
    *R0 = _mm512_load_si512(reversed);
    *R1 = _mm512_load_si512(reversed + 64);
}

// The 256 symbols of the group at g into r[0..3], escapes filled from the
// literals lit[k, nexc) in order (k advanced); false when the group holds more
// escapes than that.
template <unsigned W>
KV_AVX512 inline bool decode_group(const uint8_t* g, __m512i R0, __m512i R1, const uint8_t* lit, uint64_t nexc,
                                   uint64_t& k, __m512i* r) {
    const __m512i low_bits = _mm512_set1_epi8(char((1u << W) - 1));
    const __m512i c0 = inverted_codes_of<W, 0>(g), c1 = inverted_codes_of<W, 1>(g);
    const __m512i c2 = inverted_codes_of<W, 2>(g), c3 = inverted_codes_of<W, 3>(g);
    r[0] = symbols<W>(c0, R0, R1);
    r[1] = symbols<W>(c1, R0, R1);
    r[2] = symbols<W>(c2, R0, R1);
    r[3] = symbols<W>(c3, R0, R1);
    const uint64_t m[4] = {_mm512_testn_epi8_mask(c0, low_bits), _mm512_testn_epi8_mask(c1, low_bits),
                           _mm512_testn_epi8_mask(c2, low_bits), _mm512_testn_epi8_mask(c3, low_bits)};
    if ((m[0] | m[1] | m[2] | m[3]) != 0) {
        const uint64_t n0 = uint64_t(__builtin_popcountll(m[0])), n1 = uint64_t(__builtin_popcountll(m[1]));
        const uint64_t n2 = uint64_t(__builtin_popcountll(m[2])), n3 = uint64_t(__builtin_popcountll(m[3]));
        if (n0 + n1 + n2 + n3 > nexc - k) return false;
        // Reads exactly the literals taken: lit[k, k + n) with k + n <= nexc.
        r[0] = _mm512_mask_expandloadu_epi8(r[0], m[0], lit + k);
        r[1] = _mm512_mask_expandloadu_epi8(r[1], m[1], lit + k + n0);
        r[2] = _mm512_mask_expandloadu_epi8(r[2], m[2], lit + k + n0 + n1);
        r[3] = _mm512_mask_expandloadu_epi8(r[3], m[3], lit + k + n0 + n1 + n2);
        k += n0 + n1 + n2 + n3;
    }
    return true;
}

// The decoders' loop over whole groups: put(gi, r, acc, feed) writes group gi's
// symbols r[0..3] (or what they make) and hands each 64-byte output vector, in
// order, to the Feed: NoStripeFeed, or a StripeFeed that checksums the output
// from registers (an in-place plane's checksum then costs no second pass).
// XXH3's block ends (every kStripesPerBlock stripes, kGroupsPerBlock groups)
// fall between inner loops of whole groups, so that no call inside them makes
// GCC keep the accumulators on the stack.
template <unsigned W, size_t kGroupsPerBlock, typename Feed, typename Put>
KV_AVX512 inline bool for_each_group(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                                     uint64_t nexc, uint64_t* k_io, Feed& fed_to, Put put) {
    Feed feed = fed_to;  // locals stay in registers
    __m512i R0, R1;
    reversed_table<W>(table, &R0, &R1);
    uint64_t k = *k_io;
    StripeAcc acc = feed.load();
    size_t gi = 0;
    for (bool full = true; full;) {
        const size_t end = gi + std::min(kGroupsPerBlock, groups - gi);
        full = end - gi == kGroupsPerBlock;
        for (; gi < end; ++gi) {
            __m512i r[4];
            if (!decode_group<W>(codes + gi * 32 * W, R0, R1, lit, nexc, k, r)) return false;
            put(gi, r, acc, feed);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    *k_io = k;
    return true;
}

// A plane's groups into dst: a group's 256 output bytes are four stripes.
template <unsigned W, typename Feed>
KV_AVX512 bool decode_groups(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                             uint64_t nexc, uint64_t* k_io, uint8_t* dst, Feed& feed) {
    static_assert(Feed::kStripesPerBlock % 4 == 0, "a group must not straddle a block end");
    return for_each_group<W, Feed::kStripesPerBlock / 4>(
        codes, groups, table, lit, nexc, k_io, feed, [dst](size_t gi, const __m512i* r, StripeAcc& acc, Feed& f) KV_AVX512 {
            uint8_t* out = dst + gi * kGroup;
            for (unsigned j = 0; j < 4; ++j) {
                _mm512_storeu_si512(out + 64 * j, r[j]);
                acc = f.add(acc, r[j]);
            }
        });
}

// The high plane of 2-byte elements, merged with their low bytes as it is
// decoded (fastcode.h, HighPlaneMerge): a group is 512 output bytes, eight stripes.
template <unsigned W, bool Rot, typename Stores>
KV_AVX512 bool decode_groups_merged(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                                    uint64_t nexc, uint64_t* k_io, const uint8_t* low, uint8_t* dst,
                                    StripeFeed& feed) {
    static_assert(StripeFeed::kStripesPerBlock % 8 == 0, "a group must not straddle a block end");
    const shuffle::Interleave2 interleave;
    return for_each_group<W, StripeFeed::kStripesPerBlock / 8>(
        codes, groups, table, lit, nexc, k_io, feed,
        [&interleave, low, dst](size_t gi, const __m512i* r, StripeAcc& acc, StripeFeed& f) KV_AVX512 {
            const uint8_t* lo = low + gi * kGroup;
            uint8_t* out = dst + 2 * gi * kGroup;
            for (unsigned j = 0; j < 4; ++j) {
                __m512i a, b;
                interleave.apply<Rot>(_mm512_loadu_si512(lo + 64 * j), r[j], &a, &b);
                Stores::put(out + 128 * j, a);
                Stores::put(out + 128 * j + 64, b);
                acc = f.add(acc, a);
                acc = f.add(acc, b);
            }
        });
}

template <unsigned W>
KV_AVX512 bool decode_plain(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                            uint64_t nexc, uint64_t* k_io, uint8_t* dst) {
    NoStripeFeed none;
    return decode_groups<W>(codes, groups, table, lit, nexc, k_io, dst, none);
}

template <unsigned W>
KV_AVX512 bool decode_hashed(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                             uint64_t nexc, uint64_t* k_io, uint8_t* dst, Xxh3Stripes* hash) {
    StripeFeed feed(hash);
    return decode_groups<W>(codes, groups, table, lit, nexc, k_io, dst, feed);
}

template <unsigned W, bool Rot, typename Stores>
KV_AVX512 bool decode_merged(const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                             uint64_t nexc, uint64_t* k_io, const uint8_t* low, uint8_t* dst, Xxh3Stripes* hash) {
    StripeFeed feed(hash);
    return decode_groups_merged<W, Rot, Stores>(codes, groups, table, lit, nexc, k_io, low, dst, feed);
}

using GroupsFn = bool (*)(const uint8_t*, size_t, const uint8_t*, const uint8_t*, uint64_t, uint64_t*, uint8_t*);
using MergedGroupsFn = bool (*)(const uint8_t*, size_t, const uint8_t*, const uint8_t*, uint64_t, uint64_t*,
                                const uint8_t*, uint8_t*, Xxh3Stripes*);
using HashedGroupsFn = bool (*)(const uint8_t*, size_t, const uint8_t*, const uint8_t*, uint64_t, uint64_t*,
                                uint8_t*, Xxh3Stripes*);

// ---- encoder

// The code of each of 64 bytes: code_of as four 64-entry tables, the top bit choosing
// between the lower and the upper pair.
KV_AVX512 inline __m512i lookup256(__m512i x, const __m512i* CT) {
    const __m512i lo = _mm512_permutex2var_epi8(CT[0], x, CT[1]);
    const __m512i hi = _mm512_permutex2var_epi8(CT[2], x, CT[3]);
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

// Bits [O, O + C) of each code, at bit C * f of its byte, where f is the code's
// output vector (32 codes each) modulo 8 / C: register J holds vectors 2J, 2J + 1.
template <unsigned C, unsigned O, unsigned J>
KV_AVX512 inline __m512i placed(__m512i code) {
    const __m512i field = _mm512_and_si512(_mm512_srli_epi16(code, O), _mm512_set1_epi8(char((1u << C) - 1)));
    const __m512i counts = half_shifts<C, J>();
    return _mm512_sllv_epi16(field, counts);  // C * f + C <= 8: no bit crosses into the next byte
}

KV_AVX512 inline __m256i fold(__m512i x) {
    return _mm256_or_si256(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
}

KV_AVX512 inline void store32(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// Packs the 256 codes of a group (code[J]: codes 64J .. 64J + 63) into its 32 * W bytes.
template <unsigned W>
KV_AVX512 inline void pack_group(const __m512i* code, uint8_t* g) {
    if constexpr (has_comp(W, 4)) {  // vector o + j: output vectors 2j (low nibbles) and 2j + 1
        constexpr unsigned o = comp_offset(W, 4);
        store32(g + 32 * (o + 0), fold(placed<4, o, 0>(code[0])));
        store32(g + 32 * (o + 1), fold(placed<4, o, 1>(code[1])));
        store32(g + 32 * (o + 2), fold(placed<4, o, 2>(code[2])));
        store32(g + 32 * (o + 3), fold(placed<4, o, 3>(code[3])));
    }
    // (parts in locals: the emulation's intrinsics are macros, which split template arguments)
    if constexpr (has_comp(W, 2)) {  // vector o + j: output vectors 4j .. 4j + 3
        constexpr unsigned o = comp_offset(W, 2);
        const __m512i p0 = placed<2, o, 0>(code[0]), p1 = placed<2, o, 1>(code[1]);
        const __m512i p2 = placed<2, o, 2>(code[2]), p3 = placed<2, o, 3>(code[3]);
        store32(g + 32 * (o + 0), fold(_mm512_or_si512(p0, p1)));
        store32(g + 32 * (o + 1), fold(_mm512_or_si512(p2, p3)));
    }
    if constexpr (has_comp(W, 1)) {  // vector o: all 8 output vectors
        constexpr unsigned o = comp_offset(W, 1);
        const __m512i p0 = placed<1, o, 0>(code[0]), p1 = placed<1, o, 1>(code[1]);
        const __m512i p2 = placed<1, o, 2>(code[2]), p3 = placed<1, o, 3>(code[3]);
        store32(g + 32 * o, fold(_mm512_or_si512(_mm512_or_si512(p0, p1), _mm512_or_si512(p2, p3))));
    }
}

template <unsigned W>
KV_AVX512 bool encode_groups(const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit, uint64_t nexc,
                             uint64_t* k_io, uint8_t* out) {
    __m512i CT[4];
    for (unsigned t = 0; t < 4; ++t) CT[t] = _mm512_loadu_si512(code_of + 64 * t);
    const __m512i esc = _mm512_set1_epi8(char((1u << W) - 1));
    alignas(64) uint8_t lbuf[kGroup + 64];  // a group's escaped bytes (each compress stores 64)
    uint64_t k = *k_io;
    for (size_t gi = 0; gi < groups; ++gi) {
        const uint8_t* s = src + gi * kGroup;
        __m512i x[4], code[4];
        uint64_t m[4];
        for (unsigned j = 0; j < 4; ++j) {
            x[j] = _mm512_loadu_si512(s + 64 * j);
            code[j] = lookup256(x[j], CT);
            m[j] = _mm512_cmpeq_epi8_mask(code[j], esc);
        }
        if ((m[0] | m[1] | m[2] | m[3]) != 0) {
            size_t e = 0;
            for (unsigned j = 0; j < 4; ++j) {
                _mm512_storeu_si512(lbuf + e, _mm512_maskz_compress_epi8(m[j], x[j]));
                e += size_t(__builtin_popcountll(m[j]));
            }
            if (e > nexc - k) return false;
            std::memcpy(lit + k, lbuf, e);
            k += e;
        }
        pack_group<W>(code, out + gi * 32 * W);
    }
    *k_io = k;
    return true;
}

using EncodeGroupsFn = bool (*)(const uint8_t*, size_t, const uint8_t*, uint8_t*, uint64_t, uint64_t*, uint8_t*);

}  // namespace

bool encode_groups_avx512(unsigned w, const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit,
                          uint64_t nexc, uint64_t* k_io, uint8_t* out) {
    static const EncodeGroupsFn by_width[8] = {nullptr,          encode_groups<1>, encode_groups<2>, encode_groups<3>,
                                               encode_groups<4>, encode_groups<5>, encode_groups<6>, encode_groups<7>};
    if (w < 1 || w > kMaxWidth) return false;
    return by_width[w](src, groups, code_of, lit, nexc, k_io, out);
}

bool decode_groups_avx512(unsigned w, const uint8_t* codes, size_t groups, const uint8_t* table, const uint8_t* lit,
                          uint64_t nexc, uint64_t* k_io, uint8_t* dst, Xxh3Stripes* hash) {
    static const GroupsFn plain[8] = {nullptr,         decode_plain<1>, decode_plain<2>, decode_plain<3>,
                                      decode_plain<4>, decode_plain<5>, decode_plain<6>, decode_plain<7>};
    static const HashedGroupsFn hashed[8] = {nullptr,          decode_hashed<1>, decode_hashed<2>, decode_hashed<3>,
                                             decode_hashed<4>, decode_hashed<5>, decode_hashed<6>, decode_hashed<7>};
    if (w < 1 || w > kMaxWidth) return false;
    if (hash != nullptr) return hashed[w](codes, groups, table, lit, nexc, k_io, dst, hash);
    return plain[w](codes, groups, table, lit, nexc, k_io, dst);
}

namespace {

// The widths' kernels for one choice of rotation and stores.
template <bool Rot, typename Stores>
constexpr MergedGroupsFn kMergedByWidth[8] = {
    nullptr,                       decode_merged<1, Rot, Stores>, decode_merged<2, Rot, Stores>,
    decode_merged<3, Rot, Stores>, decode_merged<4, Rot, Stores>, decode_merged<5, Rot, Stores>,
    decode_merged<6, Rot, Stores>, decode_merged<7, Rot, Stores>};

}  // namespace

bool decode_groups_merged_avx512(unsigned w, bool rotate, bool streaming, const uint8_t* codes, size_t groups,
                                 const uint8_t* table, const uint8_t* lit, uint64_t nexc, uint64_t* k_io,
                                 const uint8_t* low, uint8_t* dst, Xxh3Stripes* hash) {
    if (w < 1 || w > kMaxWidth) return false;
    const MergedGroupsFn* by_width =
        rotate ? (streaming ? kMergedByWidth<true, shuffle::StreamingStores> : kMergedByWidth<true, shuffle::CachedStores>)
               : (streaming ? kMergedByWidth<false, shuffle::StreamingStores>
                            : kMergedByWidth<false, shuffle::CachedStores>);
    return by_width[w](codes, groups, table, lit, nexc, k_io, low, dst, hash);
}

}  // namespace kvcore::entropy::fastcode_detail
#endif  // KVCORE_X86
