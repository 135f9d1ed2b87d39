// "fast" mode plane coder: fixed-width codes + escape list (fastcode.h).
// Layout in fastcode_format.h. Portable (64-bit SWAR), AVX2 and AVX-512
// (fastcode_avx512.cpp) variants of the encoder's packing and of the decoder; all
// produce identical bytes.
#include "entropy/fastcode.h"

#include <algorithm>
#include <cstring>
#include <vector>
#include <string>
#include <type_traits>
#include <utility>

#include "checksum/xxh3_stripes.h"
#include "common/arch.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"
#include "entropy/fastcode_format.h"

#if KVCORE_X86
#include <immintrin.h>

#define KV_AVX2 __attribute__((target("avx2,bmi,bmi2")))
#define KV_AVX2_INLINE __attribute__((target("avx2,bmi,bmi2"), always_inline)) inline

#include "checksum/xxh3_stripes_avx2.h"
#include "shuffle/interleave_avx2.h"
#endif

namespace kvcore::entropy {

using namespace fastcode_detail;

namespace {

// ---------------------------------------------------------------- helpers

constexpr uint64_t bcast8(unsigned b) { return 0x0101010101010101ull * (b & 0xff); }

// Component (c bits at code offset o) of a width: bits of w taken 4, 2, 1.
constexpr bool has_comp(unsigned w, unsigned c) { return (w & c) != 0; }
constexpr unsigned comp_offset(unsigned w, unsigned c) {
    return c == 4 ? 0 : c == 2 ? (w & 4) : (w & 6);
}

// Symbol table as decoded: full[c] for every code c < 128; the escape code and
// unused codes map to the escape marker, the smallest byte not in the table.
// `rows`: the table is row-progressive (see below).
struct Table {
    uint8_t full[128];
    uint8_t marker;
    bool rows;
};

// Row-progressive tables. When each row of 16 codes (codes 16j .. 16j + 15; the
// last row stops before the escape) maps to 16 consecutive byte values, mod 256,
// a code decodes as its row's first value plus its low 4 bits: one lookup in a
// table of at most 8 row starts, where an arbitrary table at width w takes 2^(w-4)
// lookups and as many blends. The format does not change: the decoder recognises
// such a table, and the encoder picks one where it costs few extra escapes.
constexpr unsigned kRowsMinWidth = 5;  // narrower codes take one lookup anyway

bool is_row_progressive(unsigned w, const uint8_t* table) {
    if (w < kRowsMinWidth) return false;
    const unsigned entries = (1u << w) - 1;
    for (unsigned c = 0; c < entries; ++c)
        if (static_cast<uint8_t>(table[c & ~15u] + (c & 15)) != table[c]) return false;
    return true;
}

void build_table(unsigned w, const uint8_t* table, Table* t) {
    bool used[256] = {};
    const unsigned entries = (1u << w) - 1;
    for (unsigned c = 0; c < entries; ++c) used[table[c]] = true;
    unsigned marker = 0;
    while (used[marker]) ++marker;  // entries <= 127, so a free value exists
    t->marker = static_cast<uint8_t>(marker);
    for (unsigned c = 0; c < 128; ++c) t->full[c] = c < entries ? table[c] : t->marker;
    t->rows = is_row_progressive(w, table);
}

struct Parsed {
    unsigned w = 0;
    uint64_t nexc = 0;
    const uint8_t* table = nullptr;
    const uint8_t* lit = nullptr;
    const uint8_t* codes = nullptr;   // groups, then the tail
    size_t after_lit = 0;             // bytes from lit to the end of the stream
    bool dense_escapes = false;       // escapes in most groups (rate >= 1/64)
    size_t groups = 0;
    size_t tail = 0;                  // symbols in the tail
};

Status parse(const uint8_t* src, size_t src_size, size_t n, Parsed* p) {
    if (n > SIZE_MAX / 4) return invalid("fastcode: symbol count out of range");
    if (src_size < 1) return corrupt("fastcode: empty stream");
    const uint8_t b0 = src[0];
    if (b0 >> 4) return corrupt("fastcode: unknown format version " + std::to_string(b0 >> 4));
    p->w = b0 & 15;
    if (p->w < 1 || p->w > kMaxWidth) return corrupt("fastcode: bad code width " + std::to_string(p->w));
    size_t pos = 1;
    uint64_t v = 0;
    unsigned shift = 0;
    for (;;) {
        if (pos >= src_size) return corrupt("fastcode: truncated header");
        if (shift > 63) return corrupt("fastcode: bad escape count");
        const uint8_t b = src[pos++];
        const uint64_t bits = uint64_t(b & 0x7f);
        if (shift == 63 && bits > 1) return corrupt("fastcode: bad escape count");
        v |= bits << shift;
        if (!(b & 0x80)) break;
        shift += 7;
    }
    if (varint_size(v) != pos - 1) return corrupt("fastcode: non-canonical escape count");
    if (v > n) return corrupt("fastcode: escape count exceeds symbol count");
    p->nexc = v;
    const size_t entries = (size_t(1) << p->w) - 1;
    if (src_size - pos < entries) return corrupt("fastcode: truncated symbol table");
    p->table = src + pos;
    pos += entries;
    const size_t body = static_cast<size_t>(v) + code_bytes(p->w, n);
    if (src_size - pos != body)
        return corrupt("fastcode: stream size " + std::to_string(src_size) + " does not match " +
                       std::to_string(n) + " symbols (expected " + std::to_string(pos + body) + ")");
    p->lit = src + pos;
    p->codes = p->lit + v;
    p->after_lit = body;
    p->dense_escapes = v >= n / 64 + (n % 64 != 0);  // v * 64 >= n without overflow
    p->groups = n / kGroup;
    p->tail = n % kGroup;
    return Status::ok();
}

// The tail: r < 256 codes packed LSB first. Decoded scalar by every variant.
Status decode_tail(const Parsed& p, const Table& t, uint64_t* k_io, uint8_t* dst) {
    const size_t r = p.tail;
    if (r == 0) return Status::ok();
    const unsigned w = p.w;
    const size_t bytes = (r * w + 7) / 8;
    const uint8_t* src = p.codes + p.groups * 32 * w;
    uint8_t buf[kGroup * kMaxWidth / 8 + 8] = {};
    std::memcpy(buf, src, bytes);
    const size_t used_bits = r * w;
    if (used_bits % 8 && (buf[bytes - 1] >> (used_bits % 8))) return corrupt("fastcode: nonzero padding bits");
    const unsigned esc = (1u << w) - 1;
    uint64_t k = *k_io;
    for (size_t j = 0; j < r; ++j) {
        const size_t bp = j * w;
        const unsigned two = buf[bp >> 3] | (unsigned(buf[(bp >> 3) + 1]) << 8);
        const unsigned code = (two >> (bp & 7)) & esc;
        if (code == esc) {
            if (k >= p.nexc) return corrupt("fastcode: more escapes than literals");
            dst[j] = p.lit[k++];
        } else {
            dst[j] = t.full[code];
        }
    }
    *k_io = k;
    return Status::ok();
}

// ---------------------------------------------------------------- scalar

// Code bits of component (c, o) for output vector i, from its 64-bit word x,
// placed at bit `to` of each byte.
inline uint64_t take_field(uint64_t x, unsigned c, unsigned f, unsigned to) {
    const int s = int(c * f) - int(to);
    const uint64_t v = s >= 0 ? x >> s : x << -s;
    return v & bcast8(((1u << c) - 1) << to);
}

template <unsigned W>
inline uint64_t scalar_code_word(const uint8_t* g, unsigned i, unsigned q) {
    uint64_t code = 0;
    for (unsigned c = 4; c >= 1; c >>= 1) {
        if (!has_comp(W, c)) continue;
        const unsigned o = comp_offset(W, c), per = 8 / c;
        code |= take_field(load64(g + 32 * (o + i / per) + 8 * q), c, i % per, o);
    }
    return code;
}

template <unsigned W>
Status decode_groups_scalar(const Parsed& p, const Table& t, uint64_t* k_io, uint8_t* dst) {
    constexpr unsigned esc = (1u << W) - 1;
    uint64_t k = *k_io;
    for (size_t gi = 0; gi < p.groups; ++gi) {
        const uint8_t* g = p.codes + gi * 32 * W;
        uint8_t* out = dst + gi * kGroup;
        for (unsigned i = 0; i < 8; ++i) {
            for (unsigned q = 0; q < 4; ++q) {
                uint64_t code = scalar_code_word<W>(g, i, q);
                uint8_t* o8 = out + 32 * i + 8 * q;
                for (unsigned b = 0; b < 8; ++b, code >>= 8) {
                    const unsigned c = code & 0xff;
                    if (c == esc) {
                        if (k >= p.nexc) return corrupt("fastcode: more escapes than literals");
                        o8[b] = p.lit[k++];
                    } else {
                        o8[b] = t.full[c];
                    }
                }
            }
        }
    }
    *k_io = k;
    return Status::ok();
}

// Packs 256 codes (bytes < 2^W) into 32 * W bytes.
template <unsigned W>
void pack_group_scalar(const uint8_t* codes, uint8_t* g) {
    for (unsigned c = 4; c >= 1; c >>= 1) {
        if (!has_comp(W, c)) continue;
        const unsigned o = comp_offset(W, c), per = 8 / c;
        for (unsigned j = 0; j < c; ++j) {
            for (unsigned q = 0; q < 4; ++q) {
                uint64_t x = 0;
                for (unsigned f = 0; f < per; ++f) {
                    const uint64_t cw = load64(codes + 32 * (j * per + f) + 8 * q);
                    const int s = int(c * f) - int(o);
                    const uint64_t v = s >= 0 ? cw << s : cw >> -s;
                    x |= v & bcast8(((1u << c) - 1) << (c * f));
                }
                store64(g + 32 * (o + j) + 8 * q, x);
            }
        }
    }
}

// Maps and packs whole groups; escaped symbols go to lit[*k..nexc). False when
// there are more escapes than nexc (a histogram that does not match the data).
template <unsigned W>
bool encode_groups_scalar(const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit, uint64_t nexc,
                          uint64_t* k_io, uint8_t* out) {
    constexpr unsigned esc = (1u << W) - 1;
    alignas(32) uint8_t codes[kGroup];
    uint64_t k = *k_io;
    for (size_t gi = 0; gi < groups; ++gi) {
        const uint8_t* s = src + gi * kGroup;
        for (size_t i = 0; i < kGroup; ++i) {
            const uint8_t c = code_of[s[i]];
            codes[i] = c;
            if (c == esc) {
                if (k >= nexc) return false;
                lit[k++] = s[i];
            }
        }
        pack_group_scalar<W>(codes, out + gi * 32 * W);
    }
    *k_io = k;
    return true;
}

#if KVCORE_X86
// ---------------------------------------------------------------- AVX2

KV_AVX2_INLINE __m256i shift16(__m256i x, int s) {
    return s >= 0 ? _mm256_slli_epi16(x, s) : _mm256_srli_epi16(x, -s);
}

template <int S>
KV_AVX2_INLINE __m256i shift16c(__m256i x) {
    if constexpr (S > 0) return _mm256_slli_epi16(x, S);
    else if constexpr (S < 0) return _mm256_srli_epi16(x, -S);
    else return x;
}

// Code bits of component C (at code offset comp_offset) for output vector I,
// moved to bit TO of each byte; everything known at compile time.
template <unsigned W, unsigned C, unsigned I, unsigned TO>
KV_AVX2_INLINE __m256i take_field_c(const __m256i* V) {
    constexpr unsigned o = comp_offset(W, C), per = 8 / C, f = I % per;
    const __m256i v = shift16c<int(TO) - int(C * f)>(V[o + I / per]);
    return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(((1u << C) - 1) << TO)));
}

constexpr unsigned comp_of_bit(unsigned w, unsigned b) {
    for (unsigned c = 4; c >= 1; c >>= 1)
        if (has_comp(w, c) && comp_offset(w, c) <= b && b < comp_offset(w, c) + c) return c;
    return 0;
}

// Code bit B of output vector I moved to bit 7 of each byte (a blendv mask;
// the other bits are don't-care).
template <unsigned W, unsigned I, unsigned B>
KV_AVX2_INLINE __m256i code_bit_msb(const __m256i* V) {
    constexpr unsigned c = comp_of_bit(W, B);
    constexpr unsigned o = comp_offset(W, c), per = 8 / c;
    constexpr unsigned bytebit = c * (I % per) + (B - o);
    return shift16c<int(7 - bytebit)>(V[o + I / per]);
}

template <unsigned N>
KV_AVX2_INLINE void blend_level(__m256i* r, __m256i m) {
#pragma GCC unroll 8
    for (unsigned j = 0; j < N / 2; ++j) r[j] = _mm256_blendv_epi8(r[2 * j], r[2 * j + 1], m);
}

template <unsigned W, unsigned I>
KV_AVX2_INLINE __m256i decode_vec_avx2(const __m256i* V, const __m256i* T) {
    if constexpr (W <= 4) {
        __m256i code = _mm256_setzero_si256();
        if constexpr (has_comp(W, 4)) code = _mm256_or_si256(code, take_field_c<W, 4, I, comp_offset(W, 4)>(V));
        if constexpr (has_comp(W, 2)) code = _mm256_or_si256(code, take_field_c<W, 2, I, comp_offset(W, 2)>(V));
        if constexpr (has_comp(W, 1)) code = _mm256_or_si256(code, take_field_c<W, 1, I, comp_offset(W, 1)>(V));
        return _mm256_shuffle_epi8(T[0], code);
    } else {
        const __m256i lo4 = take_field_c<W, 4, I, 0>(V);
        constexpr unsigned ntab = 1u << (W - 4);
        __m256i r[ntab];
#pragma GCC unroll 8
        for (unsigned j = 0; j < ntab; ++j) r[j] = _mm256_shuffle_epi8(T[j], lo4);
        blend_level<ntab>(r, code_bit_msb<W, I, 4>(V));
        if constexpr (W >= 6) blend_level<ntab / 2>(r, code_bit_msb<W, I, 5>(V));
        if constexpr (W >= 7) blend_level<ntab / 4>(r, code_bit_msb<W, I, 6>(V));
        return r[0];
    }
}

// A row-progressive table (T[0] = the row starts): row start + low 4 bits, and
// the marker where the code is the escape (low bits 15 in the last row).
template <unsigned W, unsigned I>
KV_AVX2_INLINE __m256i decode_vec_rows_avx2(const __m256i* V, const __m256i* T, __m256i marker) {
    const __m256i lo4 = take_field_c<W, 4, I, 0>(V);
    __m256i row = _mm256_setzero_si256();  // code bits 4 and up, moved to bit 0
    if constexpr (has_comp(W, 2)) row = _mm256_or_si256(row, take_field_c<W, 2, I, comp_offset(W, 2) - 4>(V));
    if constexpr (has_comp(W, 1)) row = _mm256_or_si256(row, take_field_c<W, 1, I, comp_offset(W, 1) - 4>(V));
    const __m256i sym = _mm256_add_epi8(_mm256_shuffle_epi8(T[0], row), lo4);
    const __m256i esc = _mm256_and_si256(_mm256_cmpeq_epi8(lo4, _mm256_set1_epi8(15)),
                                         _mm256_cmpeq_epi8(row, _mm256_set1_epi8((1 << (W - 4)) - 1)));
    return _mm256_blendv_epi8(sym, marker, esc);
}

// Output vector I of a group, escapes as the marker.
template <unsigned W, bool kRows, unsigned I>
KV_AVX2_INLINE __m256i decode_any_avx2(const __m256i* V, const __m256i* T, __m256i marker) {
    if constexpr (kRows) return decode_vec_rows_avx2<W, I>(V, T, marker);
    else return decode_vec_avx2<W, I>(V, T);
}

// Decodes output vector I of a group: stores it, returns its escape mask.
template <unsigned W, bool kRows, unsigned I>
KV_AVX2_INLINE uint32_t decode_store(const __m256i* V, const __m256i* T, __m256i marker, uint8_t* out) {
    const __m256i r = decode_any_avx2<W, kRows, I>(V, T, marker);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * I), r);
    return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(r, marker)));
}

template <unsigned W, bool kRows, size_t... I>
KV_AVX2_INLINE void decode_group(const __m256i* V, const __m256i* T, __m256i marker, uint8_t* out, uint32_t* m,
                                 std::index_sequence<I...>) {
    ((m[I] = decode_store<W, kRows, I>(V, T, marker, out)), ...);
}

// Expands the next literals into the escape positions of r (bytes equal to the
// marker), 16 at a time: the inclusive prefix count of escapes in each 128-bit
// lane indexes a 16-byte load of literals. Reads lit[k, k + popcount + 16).
KV_AVX2_INLINE __m256i patch_vec(__m256i r, __m256i marker, const uint8_t* lit, uint64_t& k) {
    const __m256i eq = _mm256_cmpeq_epi8(r, marker);
    const uint32_t m = static_cast<uint32_t>(_mm256_movemask_epi8(eq));
    __m256i s = eq;  // -1 per escape: running sum = -(count so far)
    s = _mm256_add_epi8(s, _mm256_slli_si256(s, 1));
    s = _mm256_add_epi8(s, _mm256_slli_si256(s, 2));
    s = _mm256_add_epi8(s, _mm256_slli_si256(s, 4));
    s = _mm256_add_epi8(s, _mm256_slli_si256(s, 8));
    const __m256i idx = _mm256_xor_si256(s, _mm256_set1_epi8(-1));  // count - 1 at escapes
    const unsigned c0 = static_cast<unsigned>(_mm_popcnt_u32(m & 0xffff));
    const __m256i L = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(lit + k + c0),
                                          reinterpret_cast<const __m128i*>(lit + k));
    k += static_cast<unsigned>(_mm_popcnt_u32(m));
    return _mm256_blendv_epi8(r, _mm256_shuffle_epi8(L, idx), eq);
}

template <unsigned W, bool kRows, unsigned I>
KV_AVX2_INLINE void decode_patch_store(const __m256i* V, const __m256i* T, __m256i marker, uint8_t* out,
                                       const uint8_t* lit, uint64_t& k) {
    const __m256i r = patch_vec(decode_any_avx2<W, kRows, I>(V, T, marker), marker, lit, k);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * I), r);
}

template <unsigned W, bool kRows, size_t... I>
KV_AVX2_INLINE void decode_patch_group(const __m256i* V, const __m256i* T, __m256i marker, uint8_t* out,
                                       const uint8_t* lit, uint64_t& k, std::index_sequence<I...>) {
    (decode_patch_store<W, kRows, I>(V, T, marker, out, lit, k), ...);
}

Status decode_groups_avx512(const Parsed& p, const Table& t, uint64_t* k_io, uint8_t* dst) {
    if (!fastcode_detail::decode_groups_avx512(p.w, p.codes, p.groups, t.full, p.lit, p.nexc, k_io, dst))
        return corrupt("fastcode: more escapes than literals");
    return Status::ok();
}

// The lookup tables of decode_any_avx2: the row starts of a row-progressive table,
// else the table in 16-byte pieces, each in both lanes.
template <unsigned W, bool kRows>
KV_AVX2_INLINE void load_tables_avx2(const Table& t, __m256i* T) {
    if constexpr (kRows) {
        alignas(16) uint8_t starts[16] = {};
        for (unsigned j = 0; j < (1u << (W - 4)); ++j) starts[j] = t.full[16 * j];
        T[0] = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(starts)));
    } else {
        for (unsigned j = 0; j < 8; ++j)
            T[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.full + 16 * j)));
    }
}

// The W code vectors of group gi.
template <unsigned W>
KV_AVX2_INLINE void load_group_avx2(const uint8_t* codes, size_t gi, __m256i* V) {
    const uint8_t* g = codes + gi * 32 * W;
#pragma GCC unroll 8
    for (unsigned v = 0; v < W; ++v) V[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * v));
}

template <unsigned W, bool kRows = false>
KV_AVX2 Status decode_groups_avx2(const Parsed& p, const Table& t, uint64_t* k_io, uint8_t* dst) {
    __m256i T[8];
    load_tables_avx2<W, kRows>(t, T);
    const __m256i marker = _mm256_set1_epi8(static_cast<char>(t.marker));
    const uint8_t* lit = p.lit;
    const uint64_t nexc = p.nexc;
    // Escapes in most groups (rate >= 1/64): decode and patch in one pass while
    // a whole group's literal reads (<= 256 + 16 bytes) stay inside the stream;
    // else decode, and patch only groups that have escapes, after counting them.
    const bool one_pass = p.dense_escapes;
    uint64_t k = *k_io;
    size_t gi = 0;
    if (one_pass) {
        for (; gi < p.groups && k + kGroup + 16 <= p.after_lit; ++gi) {
            __m256i V[W];
            load_group_avx2<W>(p.codes, gi, V);
            decode_patch_group<W, kRows>(V, T, marker, dst + gi * kGroup, lit, k, std::make_index_sequence<8>{});
        }
        if (k > nexc) return corrupt("fastcode: more escapes than literals");
    }
    for (; gi < p.groups; ++gi) {
        uint8_t* out = dst + gi * kGroup;
        __m256i V[W];
        load_group_avx2<W>(p.codes, gi, V);
        uint32_t m[8];
        decode_group<W, kRows>(V, T, marker, out, m, std::make_index_sequence<8>{});
        uint64_t cnt = 0;
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; ++i) cnt += static_cast<unsigned>(_mm_popcnt_u32(m[i]));
        if (cnt == 0) continue;
        if (cnt > nexc - k) return corrupt("fastcode: more escapes than literals");
        // Reads stay inside the stream: k + cnt <= nexc, and the literals are
        // followed by at least 32 bytes of codes (this group).
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; ++i) {
            uint8_t* o = out + 32 * i;
            const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), patch_vec(r, marker, lit, k));
        }
    }
    *k_io = k;
    return Status::ok();
}

// A group's eight output vectors, escapes as the marker, kept in registers.
template <unsigned W, bool kRows, size_t... I>
KV_AVX2_INLINE void decode_vectors_avx2(const __m256i* V, const __m256i* T, __m256i marker, __m256i* r,
                                        std::index_sequence<I...>) {
    ((r[I] = decode_any_avx2<W, kRows, I>(V, T, marker)), ...);
}

// Fills the escapes of a group's eight output vectors from the literals (k
// advanced past those taken). kPatchAll: every vector is patched, untested, for
// streams with escapes in most groups; the caller keeps the reads inside the
// stream (k + kGroup + 16 <= after_lit) and checks k <= nexc at the end. Else
// only a group that has escapes is patched, once enough literals are known to be
// left (patch_vec's reads then stay inside the stream: the literals are followed
// by the codes, at least 32 bytes); false when they are not.
template <bool kPatchAll>
KV_AVX2_INLINE bool patch_group_avx2(__m256i* r, __m256i marker, const uint8_t* lit, uint64_t nexc, uint64_t& k) {
    if constexpr (!kPatchAll) {
        uint64_t cnt = 0;
#pragma GCC unroll 8
        for (unsigned i = 0; i < 8; ++i)
            cnt += static_cast<unsigned>(_mm_popcnt_u32(uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(r[i], marker)))));
        if (cnt == 0) return true;
        if (k > nexc || cnt > nexc - k) return false;
    }
#pragma GCC unroll 8
    for (unsigned i = 0; i < 8; ++i) r[i] = patch_vec(r[i], marker, lit, k);
    return true;
}

// One group of the high plane decoded, patched, merged with its 256 low bytes
// into elements, written and hashed (a stripe per output vector).
template <unsigned W, bool kRows, bool Rot, typename Stores, bool kPatchAll>
KV_AVX2_INLINE bool merge_group_avx2(const __m256i* V, const __m256i* T, __m256i marker, const uint8_t* lit,
                                     uint64_t nexc, uint64_t& k, const uint8_t* low, uint8_t* out,
                                     StripeFeedAvx2& feed, StripeAccAvx2& acc) {
    __m256i r[8];
    decode_vectors_avx2<W, kRows>(V, T, marker, r, std::make_index_sequence<8>{});
    if (!patch_group_avx2<kPatchAll>(r, marker, lit, nexc, k)) return false;
#pragma GCC unroll 8
    for (unsigned i = 0; i < 8; ++i) {
        __m256i a, b;
        shuffle::avx2::interleave2<Rot>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + 32 * i)), r[i], &a, &b);
        Stores::put(out + 64 * i, a);
        Stores::put(out + 64 * i + 32, b);
        feed.add(acc, a, b);
    }
    return true;
}

// decode_groups_avx2 for the high plane of 2-byte elements, merged with the low
// plane as it is decoded (fastcode.h, HighPlaneMerge): `groups` groups, each 512
// output bytes, eight stripes fed to hash.
template <unsigned W, bool kRows, bool Rot, typename Stores>
KV_AVX2 bool decode_groups_merged_avx2(const Parsed& p, const Table& t, size_t groups, uint64_t* k_io,
                                       const uint8_t* low, uint8_t* dst, Xxh3Stripes* hash) {
    static_assert(StripeFeedAvx2::kStripesPerBlock % 8 == 0, "a group must not straddle a block end");
    constexpr size_t kGroupsPerBlock = StripeFeedAvx2::kStripesPerBlock / 8;
    __m256i T[8];
    load_tables_avx2<W, kRows>(t, T);
    const __m256i marker = _mm256_set1_epi8(static_cast<char>(t.marker));
    StripeFeedAvx2 feed(hash);
    StripeAccAvx2 acc;
    feed.load(acc);
    uint64_t k = *k_io;
    size_t gi = 0;
    for (bool full = true; full;) {
        const size_t end = gi + std::min(kGroupsPerBlock, groups - gi);
        full = end - gi == kGroupsPerBlock;
        for (; gi < end; ++gi) {
            __m256i V[W];
            load_group_avx2<W>(p.codes, gi, V);
            const uint8_t* lo = low + gi * kGroup;
            uint8_t* out = dst + 2 * gi * kGroup;
            // As decode_groups_avx2: escapes in most groups are patched untested while a whole
            // group's literal reads stay inside the stream.
            const bool ok = p.dense_escapes && k + kGroup + 16 <= p.after_lit
                                ? merge_group_avx2<W, kRows, Rot, Stores, true>(V, T, marker, p.lit, p.nexc, k, lo,
                                                                               out, feed, acc)
                                : merge_group_avx2<W, kRows, Rot, Stores, false>(V, T, marker, p.lit, p.nexc, k, lo,
                                                                                out, feed, acc);
            if (!ok) return false;
        }
        if (full) feed.end_block(acc);
    }
    feed.store(acc);
    *k_io = k;
    return k <= p.nexc;
}

using MergedDecodeFn = bool (*)(const Parsed&, const Table&, size_t, uint64_t*, const uint8_t*, uint8_t*,
                                Xxh3Stripes*);

// The AVX2 merging decoders of a rotation and store kind, by width and table kind.
template <bool Rot, typename Stores>
MergedDecodeFn merged_avx2_for(unsigned w, bool rows) {
    static const MergedDecodeFn plain[8] = {
        nullptr,
        decode_groups_merged_avx2<1, false, Rot, Stores>,
        decode_groups_merged_avx2<2, false, Rot, Stores>,
        decode_groups_merged_avx2<3, false, Rot, Stores>,
        decode_groups_merged_avx2<4, false, Rot, Stores>,
        decode_groups_merged_avx2<5, false, Rot, Stores>,
        decode_groups_merged_avx2<6, false, Rot, Stores>,
        decode_groups_merged_avx2<7, false, Rot, Stores>};
    static const MergedDecodeFn by_rows[8] = {nullptr, nullptr, nullptr, nullptr, nullptr,
                                              decode_groups_merged_avx2<5, true, Rot, Stores>,
                                              decode_groups_merged_avx2<6, true, Rot, Stores>,
                                              decode_groups_merged_avx2<7, true, Rot, Stores>};
    return rows && w >= kRowsMinWidth ? by_rows[w] : plain[w];
}

// The AVX2 merging decoder for a width, table kind, rotation and store kind
// (streaming: non-temporal stores, which the caller fences).
MergedDecodeFn pick_merged_avx2(unsigned w, bool rows, bool rotate, bool streaming) {
    using shuffle::avx2::CachedStores;
    using shuffle::avx2::StreamingStores;
    if (rotate)
        return streaming ? merged_avx2_for<true, StreamingStores>(w, rows) : merged_avx2_for<true, CachedStores>(w, rows);
    return streaming ? merged_avx2_for<false, StreamingStores>(w, rows) : merged_avx2_for<false, CachedStores>(w, rows);
}

template <unsigned W>
KV_AVX2 void pack_group_avx2(const uint8_t* codes, uint8_t* g) {
    __m256i C[8];
#pragma GCC unroll 8
    for (unsigned i = 0; i < 8; ++i) C[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * i));
#pragma GCC unroll 4
    for (unsigned c = 4; c >= 1; c >>= 1) {
        if (!has_comp(W, c)) continue;
        const unsigned o = comp_offset(W, c), per = 8 / c;
#pragma GCC unroll 4
        for (unsigned j = 0; j < c; ++j) {
            __m256i x = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (unsigned f = 0; f < per; ++f) {
                const __m256i v = shift16(C[j * per + f], int(c * f) - int(o));
                x = _mm256_or_si256(x, _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(((1u << c) - 1) << (c * f)))));
            }
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + 32 * (o + j)), x);
        }
    }
}

template <unsigned W>
KV_AVX2 bool encode_groups_avx2(const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit,
                                uint64_t nexc, uint64_t* k_io, uint8_t* out) {
    const __m256i escv = _mm256_set1_epi8(static_cast<char>((1u << W) - 1));
    __m256i sym[15], flip[15];  // table symbols, code ^ escape
    if constexpr (W <= 4) {
        unsigned found = 0;
        for (unsigned v = 0; v < 256; ++v) {
            const unsigned c = code_of[v];
            if (c < (1u << W) - 1) {
                sym[c] = _mm256_set1_epi8(static_cast<char>(v));
                flip[c] = _mm256_set1_epi8(static_cast<char>(c ^ ((1u << W) - 1)));
                ++found;
            }
        }
        if (found != (1u << W) - 1) return false;  // every code has its symbol (encoder invariant)
    }
    alignas(32) uint8_t codes[kGroup];
    uint8_t lbuf[kGroup + 8];
    uint64_t k = *k_io;
    for (size_t gi = 0; gi < groups; ++gi) {
        const uint8_t* s = src + gi * kGroup;
        if constexpr (W <= 4) {
            // at most 15 table symbols: compare against each (they are distinct)
#pragma GCC unroll 8
            for (unsigned v = 0; v < 8; ++v) {
                const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32 * v));
                __m256i c = escv;
#pragma GCC unroll 15
                for (unsigned r = 0; r < (1u << W) - 1; ++r)
                    c = _mm256_xor_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(x, sym[r]), flip[r]));
                _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 32 * v), c);
            }
        } else {
            for (size_t i = 0; i < kGroup; i += 8) {
                const uint64_t x = load64(s + i);
                uint64_t c = 0;
#pragma GCC unroll 8
                for (unsigned b = 0; b < 8; ++b) c |= uint64_t(code_of[(x >> (8 * b)) & 0xff]) << (8 * b);
                store64(codes + i, c);
            }
        }
        uint32_t m[8], any = 0;
#pragma GCC unroll 8
        for (unsigned v = 0; v < 8; ++v) {
            const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 32 * v));
            m[v] = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(c, escv)));
            any |= m[v];
        }
        if (any) {
            size_t e = 0;
            for (unsigned v = 0; v < 8; ++v) {
#pragma GCC unroll 4
                for (unsigned q = 0; q < 4; ++q) {
                    const uint64_t m8 = (m[v] >> (8 * q)) & 0xff;
                    const uint64_t bytes = _pdep_u64(m8, 0x0101010101010101ull) * 0xff;
                    store64(lbuf + e, _pext_u64(load64(s + 32 * v + 8 * q), bytes));
                    e += static_cast<size_t>(_mm_popcnt_u64(m8));
                }
            }
            if (e > nexc - k) return false;
            std::memcpy(lit + k, lbuf, e);
            k += e;
        }
        pack_group_avx2<W>(codes, out + gi * 32 * W);
    }
    *k_io = k;
    return true;
}
#endif  // KVCORE_X86

// ---------------------------------------------------------------- dispatch

using DecodeFn = Status (*)(const Parsed&, const Table&, uint64_t*, uint8_t*);
using EncodeFn = bool (*)(const uint8_t*, size_t, const uint8_t*, uint8_t*, uint64_t, uint64_t*, uint8_t*);

// rows: the table is row-progressive (the AVX2 variants have a faster path for it).
DecodeFn pick_decoder(unsigned w, uint32_t isa, bool rows) {
#if KVCORE_X86
    if (isa & cpu::kIsaAvx512) return decode_groups_avx512;
    const bool avx2 = (isa & cpu::kIsaAvx2) != 0;
#else
    (void)isa;  // no SIMD level in this build
    (void)rows;
#endif
    static const DecodeFn scalar[8] = {nullptr,
                                       decode_groups_scalar<1>,
                                       decode_groups_scalar<2>,
                                       decode_groups_scalar<3>,
                                       decode_groups_scalar<4>,
                                       decode_groups_scalar<5>,
                                       decode_groups_scalar<6>,
                                       decode_groups_scalar<7>};
#if KVCORE_X86
    static const DecodeFn simd[8] = {nullptr,
                                     decode_groups_avx2<1>,
                                     decode_groups_avx2<2>,
                                     decode_groups_avx2<3>,
                                     decode_groups_avx2<4>,
                                     decode_groups_avx2<5>,
                                     decode_groups_avx2<6>,
                                     decode_groups_avx2<7>};
    static const DecodeFn simd_rows[8] = {nullptr, nullptr, nullptr, nullptr, nullptr,
                                          decode_groups_avx2<5, true>,
                                          decode_groups_avx2<6, true>,
                                          decode_groups_avx2<7, true>};
    if (avx2 && rows && w >= kRowsMinWidth) return simd_rows[w];
    return avx2 ? simd[w] : scalar[w];
#else
    return scalar[w];
#endif
}

#if KVCORE_X86
template <unsigned W>
bool encode_groups_avx512(const uint8_t* src, size_t groups, const uint8_t* code_of, uint8_t* lit, uint64_t nexc,
                          uint64_t* k_io, uint8_t* out) {
    return fastcode_detail::encode_groups_avx512(W, src, groups, code_of, lit, nexc, k_io, out);
}
#endif

EncodeFn pick_encoder(unsigned w, uint32_t isa) {
#if KVCORE_X86
    static const EncodeFn wide[8] = {nullptr,
                                     encode_groups_avx512<1>,
                                     encode_groups_avx512<2>,
                                     encode_groups_avx512<3>,
                                     encode_groups_avx512<4>,
                                     encode_groups_avx512<5>,
                                     encode_groups_avx512<6>,
                                     encode_groups_avx512<7>};
    if (isa & cpu::kIsaAvx512) return wide[w];
    const bool avx2 = (isa & cpu::kIsaAvx2) != 0;
#else
    (void)isa;  // no SIMD level in this build
#endif
    static const EncodeFn scalar[8] = {nullptr,
                                       encode_groups_scalar<1>,
                                       encode_groups_scalar<2>,
                                       encode_groups_scalar<3>,
                                       encode_groups_scalar<4>,
                                       encode_groups_scalar<5>,
                                       encode_groups_scalar<6>,
                                       encode_groups_scalar<7>};
#if KVCORE_X86
    static const EncodeFn simd[8] = {nullptr,
                                     encode_groups_avx2<1>,
                                     encode_groups_avx2<2>,
                                     encode_groups_avx2<3>,
                                     encode_groups_avx2<4>,
                                     encode_groups_avx2<5>,
                                     encode_groups_avx2<6>,
                                     encode_groups_avx2<7>};
    return avx2 ? simd[w] : scalar[w];
#else
    return scalar[w];
#endif
}

// ---------------------------------------------------------------- encoder helpers

void histogram64(const uint8_t* src, size_t n, uint64_t* hist) {
    uint32_t h[4][256] = {};
    size_t i = 0;
    std::fill(hist, hist + 256, 0);
    while (i < n) {
        // flush before a 32-bit counter can overflow
        const size_t end = std::min(n, i + (size_t(1) << 30));
        for (; i + 4 <= end; i += 4) {
            ++h[0][src[i]];
            ++h[1][src[i + 1]];
            ++h[2][src[i + 2]];
            ++h[3][src[i + 3]];
        }
        for (; i < end; ++i) ++h[0][src[i]];
        for (unsigned s = 0; s < 256; ++s) {
            hist[s] += uint64_t(h[0][s]) + h[1][s] + h[2][s] + h[3][s];
            h[0][s] = h[1][s] = h[2][s] = h[3][s] = 0;
        }
    }
}

struct Plan {
    unsigned w = 0;
    uint64_t nexc = 0;
    size_t size = 0;
    uint8_t order[256];  // codes 0..2^w-2 decode to order[code]: by decreasing count, or row-progressive
};

void plan_order(const uint64_t* hist, Plan* plan) {
    for (unsigned s = 0; s < 256; ++s) plan->order[s] = static_cast<uint8_t>(s);
    std::stable_sort(plan->order, plan->order + 256,
                     [hist](uint8_t a, uint8_t b) { return hist[a] > hist[b]; });
}

// A row-progressive table at width w (w >= kRowsMinWidth): 2^(w-4) disjoint runs
// of 16 consecutive values (mod 256) of the greatest total weight, found by
// dynamic programming over the values, on a circle cut where its lightest run
// starts (a run across that point would rarely pay); then the last row gives up
// the lightest end value of one run, for the escape. Writes order[0, 2^w - 1)
// row by row; returns the weight covered.
uint64_t plan_row_windows(const uint64_t* hist, unsigned w, uint8_t* order) {
    constexpr unsigned kRun = 16;
    const unsigned rows = 1u << (w - 4);
    uint64_t run = 0;  // weight of the run starting at a
    for (unsigned i = 0; i < kRun; ++i) run += hist[i];
    uint64_t lightest = run;
    unsigned cut = 0;
    for (unsigned a = 1; a < 256; ++a) {
        run += hist[(a + kRun - 1) & 255] - hist[a - 1];
        if (run < lightest) {
            lightest = run;
            cut = a;
        }
    }
    // best[k][t]: the most weight k runs can cover in values cut .. cut + t - 1.
    uint64_t prefix[257];
    prefix[0] = 0;
    for (unsigned t = 0; t < 256; ++t) prefix[t + 1] = prefix[t] + hist[(cut + t) & 255];
    uint64_t best[9][257];
    bool ends_run[9][257];  // the best for (k, t) has a run ending at t
    for (unsigned t = 0; t <= 256; ++t) best[0][t] = 0;
    for (unsigned k = 1; k <= rows; ++k) {
        for (unsigned t = 0; t <= 256; ++t) {
            ends_run[k][t] = false;
            if (t < k * kRun) {
                best[k][t] = 0;  // unreachable: never chosen, t never gets here when backtracking
                continue;
            }
            const uint64_t with_run = best[k - 1][t - kRun] + prefix[t] - prefix[t - kRun];
            best[k][t] = best[k][t - 1];
            if (t == k * kRun || with_run > best[k][t]) {
                best[k][t] = with_run;
                ends_run[k][t] = true;
            }
        }
    }
    unsigned start[8];
    for (unsigned k = rows, t = 256; k > 0;) {
        if (ends_run[k][t]) {
            t -= kRun;
            start[--k] = (cut + t) & 255;
        } else {
            --t;
        }
    }
    // The escape takes the last code: the run whose first or last value weighs
    // least goes in the last row without that value.
    unsigned short_run = 0;
    bool drop_first = false;
    uint64_t dropped = UINT64_MAX;
    for (unsigned r = 0; r < rows; ++r) {
        const uint64_t first = hist[start[r]], last = hist[(start[r] + kRun - 1) & 255];
        if (std::min(first, last) < dropped) {
            dropped = std::min(first, last);
            short_run = r;
            drop_first = first < last;
        }
    }
    std::swap(start[short_run], start[rows - 1]);
    if (drop_first) start[rows - 1] = (start[rows - 1] + 1) & 255;
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned i = 0; i < kRun && 16 * r + i < (1u << w) - 1; ++i)
            order[16 * r + i] = static_cast<uint8_t>(start[r] + i);
    return best[rows][256] - dropped;
}

// A row-progressive table is kept when its extra escapes (a literal byte each)
// add at most 1/kRowsSlack to the stream.
constexpr size_t kRowsSlack = 128;

// Fills w, nexc, size for width `width` (0: the smallest stream).
void plan_width(const uint64_t* hist, size_t n, unsigned width, Plan* plan) {
    plan_order(hist, plan);
    uint64_t covered = 0;
    size_t rank = 0;
    plan->size = SIZE_MAX;
    for (unsigned w = 1; w <= kMaxWidth; ++w) {
        const size_t entries = (size_t(1) << w) - 1;
        for (; rank < entries; ++rank) covered += hist[plan->order[rank]];
        const uint64_t nexc = n - covered;
        const size_t size = stream_size(w, n, nexc);
        if (width ? w == width : size < plan->size) {
            plan->w = w;
            plan->nexc = nexc;
            plan->size = size;
        }
    }
    if (plan->w >= kRowsMinWidth) {
        uint8_t rows[128];
        const uint64_t covered_rows = plan_row_windows(hist, plan->w, rows);
        const uint64_t nexc = n - std::min<uint64_t>(n, covered_rows);
        const size_t size = stream_size(plan->w, n, nexc);
        if (size <= plan->size + plan->size / kRowsSlack) {
            std::memcpy(plan->order, rows, (size_t(1) << plan->w) - 1);
            plan->nexc = nexc;
            plan->size = size;
        }
    }
}

void write_varint(uint8_t* p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = static_cast<uint8_t>(v | 0x80);
        v >>= 7;
    }
    *p = static_cast<uint8_t>(v);
}

}  // namespace

// ---------------------------------------------------------------- public API

size_t fastcode_bound(size_t n) { return kMaxHeader + n + code_bytes(kMaxWidth, n); }

size_t fastcode_estimate(const uint32_t* hist, size_t n, unsigned* width) {
    uint64_t h[256];
    uint64_t total = 0;
    for (unsigned s = 0; s < 256; ++s) total += h[s] = hist[s];
    if (total != n) {
        if (width) *width = 0;
        return SIZE_MAX;
    }
    Plan plan;
    plan_width(h, n, 0, &plan);
    if (width) *width = plan.w;
    return plan.size;
}

namespace {

// Writes the stream of src[0, n) for the code width and symbol order of plan.
// With plan.nexc known (exact counts), literals and codes go straight to their
// place in dst; else (a plan from estimated weights) they are coded into
// per-thread scratch first and placed once the escape count is known.
Status encode_planned(const uint8_t* src, size_t n, const Plan& plan, bool nexc_known, uint8_t* dst, size_t cap,
                      size_t* written) {
    const unsigned w = plan.w;
    const unsigned esc = (1u << w) - 1;
    uint8_t code_of[256];
    std::memset(code_of, static_cast<int>(esc), sizeof code_of);
    for (unsigned r = 0; r < esc; ++r) code_of[plan.order[r]] = static_cast<uint8_t>(r);

    thread_local std::vector<uint8_t> scratch;
    uint8_t* lit;
    uint8_t* codes_out;
    uint64_t lit_cap = plan.nexc;
    if (nexc_known) {
        lit = dst + header_size(w, plan.nexc);
        codes_out = lit + plan.nexc;
    } else {
        if (scratch.size() < n + code_bytes(w, n)) scratch.resize(n + code_bytes(w, n));
        lit = scratch.data();
        codes_out = lit + n;
        lit_cap = n;
    }
    const uint32_t isa = cpu::active_isa();
    uint64_t k = 0;
    const size_t groups = n / kGroup;
    if (!pick_encoder(w, isa)(src, groups, code_of, lit, lit_cap, &k, codes_out))
        return invalid("fastcode: histogram does not match the data");
    const size_t r = n % kGroup;
    if (r) {
        uint8_t codes[kGroup];
        const uint8_t* s = src + groups * kGroup;
        for (size_t i = 0; i < r; ++i) {
            codes[i] = code_of[s[i]];
            if (codes[i] == esc) {
                if (k >= lit_cap) return invalid("fastcode: histogram does not match the data");
                lit[k++] = s[i];
            }
        }
        uint8_t* t = codes_out + groups * 32 * w;
        const size_t bytes = (r * w + 7) / 8;
        std::memset(t, 0, bytes);
        uint64_t acc = 0;
        unsigned bits = 0;
        size_t o = 0;
        for (size_t j = 0; j < r; ++j) {
            acc |= uint64_t(codes[j]) << bits;
            bits += w;
            while (bits >= 8) {
                t[o++] = static_cast<uint8_t>(acc);
                acc >>= 8;
                bits -= 8;
            }
        }
        if (bits) t[o++] = static_cast<uint8_t>(acc);
    }
    if (nexc_known && k != plan.nexc) return invalid("fastcode: histogram does not match the data");
    const size_t size = stream_size(w, n, k);
    if (size > cap)
        return make_status(Code::kBufferTooSmall, "fastcode: stream of " + std::to_string(size) +
                                                      " bytes exceeds the capacity of " + std::to_string(cap));
    uint8_t* p = dst;
    *p++ = static_cast<uint8_t>(w);
    write_varint(p, k);
    p += varint_size(k);
    std::memcpy(p, plan.order, esc);
    p += esc;
    if (!nexc_known) {
        std::memcpy(p, lit, k);
        std::memcpy(p + k, codes_out, code_bytes(w, n));
    }
    *written = size;
    return Status::ok();
}

}  // namespace

Status fastcode_encode_width(const uint8_t* src, size_t n, const uint32_t* hist, unsigned width, uint8_t* dst,
                             size_t cap, size_t* written) {
    if (width > kMaxWidth) return invalid("fastcode: code width must be 0 (auto) or 1..7");
    if (n && !src) return invalid("fastcode: null source");
    if (!written) return invalid("fastcode: null size output");
    if (n > SIZE_MAX / 4) return invalid("fastcode: symbol count out of range");
    uint64_t h[256];
    bool have = false;
    if (hist && n <= UINT32_MAX) {
        uint64_t total = 0;
        for (unsigned s = 0; s < 256; ++s) total += h[s] = hist[s];
        have = total == n;
        if (!have) return invalid("fastcode: histogram does not sum to the symbol count");
    }
    if (!have) histogram64(src, n, h);
    Plan plan;
    plan_width(h, n, width, &plan);
    if (plan.size > cap)
        return make_status(Code::kBufferTooSmall, "fastcode: stream of " + std::to_string(plan.size) +
                                                      " bytes exceeds the capacity of " + std::to_string(cap));
    if (!dst) return invalid("fastcode: null destination");
    return encode_planned(src, n, plan, true, dst, cap, written);
}

Status fastcode_encode_estimated(const uint8_t* src, size_t n, const uint32_t* weights, uint8_t* dst, size_t cap,
                                 size_t* written) {
    if (n && !src) return invalid("fastcode: null source");
    if (!written || !weights) return invalid("fastcode: null size output or weights");
    if (n > SIZE_MAX / 4) return invalid("fastcode: symbol count out of range");
    uint64_t h[256];
    uint64_t total = 0;
    for (unsigned s = 0; s < 256; ++s) total += h[s] = weights[s];
    if (total == 0 && n) return invalid("fastcode: all weights are zero");
    Plan plan;
    plan_width(h, total, 0, &plan);  // the width and symbol order; the escapes are counted while coding
    if (!dst) return invalid("fastcode: null destination");
    return encode_planned(src, n, plan, false, dst, cap, written);
}

Status fastcode_encode(const uint8_t* src, size_t n, const uint32_t* hist, uint8_t* dst, size_t cap,
                       size_t* written) {
    return fastcode_encode_width(src, n, hist, 0, dst, cap, written);
}

Status fastcode_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n) {
    return fastcode_decode_hashed(src, src_size, dst, n, nullptr);
}

namespace {

// A stream being decoded: parsed, its table built; the decoders take the groups
// from `left` on and count the literals taken in k.
struct Decoding {
    Parsed p;
    Table t;
    Parsed left;  // the groups not decoded yet
    uint64_t k = 0;
    uint32_t isa = 0;
};

Status begin_decoding(const uint8_t* src, size_t src_size, size_t n, Decoding* d) {
    KVCORE_RETURN_IF_ERROR(parse(src, src_size, n, &d->p));
    build_table(d->p.w, d->p.table, &d->t);
    d->left = d->p;
    d->isa = cpu::active_isa();
    return Status::ok();
}

#if KVCORE_X86
// `groups` groups taken by a SIMD kernel (hashed or merged as decoded): the rest start after them.
void took_groups(Decoding& d, size_t groups) {
    d.left.codes += groups * 32 * d.p.w;
    d.left.groups -= groups;
}
#endif

// The groups left, then the tail, into dst (where the first group left goes).
Status finish_decoding(Decoding& d, uint8_t* dst) {
    KVCORE_RETURN_IF_ERROR(pick_decoder(d.p.w, d.isa, d.t.rows)(d.left, d.t, &d.k, dst));
    KVCORE_RETURN_IF_ERROR(decode_tail(d.p, d.t, &d.k, dst + d.left.groups * kGroup));
    if (d.k != d.p.nexc) return corrupt("fastcode: fewer escapes than literals");
    return Status::ok();
}

}  // namespace

Status fastcode_decode_hashed(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n, Xxh3Stripes* hash) {
    if (!src && src_size) return invalid("fastcode: null stream");
    if (!dst && n) return invalid("fastcode: null destination");
    Decoding d;
    KVCORE_RETURN_IF_ERROR(begin_decoding(src, src_size, n, &d));
    size_t hashed = 0;
#if KVCORE_X86
    if (hash != nullptr && (d.isa & cpu::kIsaAvx512) && hash->fed == 0 && hash->len == n) {
        // The groups before the plane's last 64 bytes are hashed as they are decoded.
        hashed = std::min<size_t>(d.p.groups, hash->regular() / 4);
        if (!fastcode_detail::decode_groups_avx512(d.p.w, d.p.codes, hashed, d.t.full, d.p.lit, d.p.nexc, &d.k, dst,
                                                   hash))
            return corrupt("fastcode: more escapes than literals");
        took_groups(d, hashed);
    }
#else
    (void)hash;  // hashed as decoded only by the AVX-512 decoder
#endif
    return finish_decoding(d, dst + hashed * kGroup);
}

Status fastcode_decode_merged(const uint8_t* src, size_t src_size, size_t n, const HighPlaneMerge& m, uint8_t* rest,
                              size_t* merged) {
    *merged = 0;
    if (!src && src_size) return invalid("fastcode: null stream");
    if ((!rest || !m.low || !m.dst || !m.hash) && n) return invalid("fastcode: null buffer");
    Decoding d;
    KVCORE_RETURN_IF_ERROR(begin_decoding(src, src_size, n, &d));
#if KVCORE_X86
    const bool avx512 = (d.isa & cpu::kIsaAvx512) != 0;
    if ((avx512 || (d.isa & cpu::kIsaAvx2)) && m.hash->fed == 0 && m.hash->len == 2 * n) {
        // Whole XXH3 blocks of output (two groups each) before its last byte.
        constexpr size_t kGroupsPerXxh3Block = 64 * Xxh3Stripes::kStripesPerBlock / (2 * kGroup);
        const size_t blocks = (2 * n - 1) / (2 * kGroup * kGroupsPerXxh3Block);
        const size_t groups = std::min(d.p.groups / kGroupsPerXxh3Block, blocks) * kGroupsPerXxh3Block;
        const bool streaming = m.streaming && reinterpret_cast<uintptr_t>(m.dst) % 64 == 0;
        const bool ok =
            avx512 ? fastcode_detail::decode_groups_merged_avx512(d.p.w, m.rotate, streaming, d.p.codes, groups,
                                                                  d.t.full, d.p.lit, d.p.nexc, &d.k, m.low, m.dst,
                                                                  m.hash)
                   : pick_merged_avx2(d.p.w, d.t.rows, m.rotate, streaming)(d.p, d.t, groups, &d.k, m.low, m.dst,
                                                                           m.hash);
        if (streaming) _mm_sfence();  // non-temporal stores are weakly ordered
        if (!ok) return corrupt("fastcode: more escapes than literals");
        took_groups(d, groups);
        *merged = groups * kGroup;
    }
#endif
    return finish_decoding(d, rest + *merged);
}

}  // namespace kvcore::entropy
