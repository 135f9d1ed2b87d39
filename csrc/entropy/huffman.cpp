// Order-0 canonical Huffman coder for one byte plane (see huffman.h).
//
// Stream layout (all integers little endian):
//
//   tag 0  "empty"     [0]                               n must be 0
//   tag 1  "constant"  [1][symbol]                       n >= 1 copies of symbol
//   tag 5  "compact"   [5][range map: 2 + ceil(span/2) bytes]
//                      [size of streams 0..4: 5 x W bytes][stream 0]...[stream 5]
//   tag 3  "huffman"   [3][bitmap: 32 bytes][lengths: ceil(m/2) bytes]
//                      [size of streams 0..4: 5 x u32][stream 0]...[stream 5]
//   tag 2  "huffman, 4 forward streams" (written until 2026-12; still read)
//                      [2][bitmap][lengths][size of streams 0..2: 3 x u32][stream 0]...[stream 3]
//   tag 4  "lanes"     codes of at most 7 bits in 128 lanes (lane_code.h); written
//                      where the caller's lanes_allowance takes it
//
// bitmap bit s (byte s/8, bit s%8) marks symbol s as present; m = number of
// present symbols (>= 2). `lengths` holds the code length (1..kMaxLen) of each
// present symbol in increasing symbol order, two per byte, low nibble first; an
// odd m leaves the last high nibble 0. Tag 5 carries the same lengths as a range
// map (code_lengths.h: the values from the first coded one to the last, circular,
// a nibble each, 0 for one not coded) and its stream sizes in W bytes each, W the
// fewest bytes that hold the largest size a stream can have, ceil(11 L / 8) for
// the longest segment's L symbols: 2 bytes for a 16 KiB plane, whose tag 3
// header takes some 40 bytes more. The encoder writes whichever header is smaller
// (tag 5 on a tie); they code the streams alike. The lengths must form a complete
// prefix code (Kraft sum exactly 1). Codes are canonical: sorted by (length,
// symbol), assigned in increasing order.
//
// The n symbols are cut into S consecutive segments (S = 6 for tags 3 and 5, 4
// for tag 2; segment k has n / S + (k < n % S) symbols). Tags 3 and 5 code segment k into
// stream k from its last symbol to its first; tag 2 from its first to its last.
// Codes are written MSB-first, and a stream is zero-padded to a whole byte. The
// last stream's size is what remains of the input; every stream must end exactly
// at its size (no missing or extra byte, zero pad).
//
// Decoding reads the streams interleaved (instruction-level parallelism)
// through a kTableBits-wide table whose entries hold every whole code that fits
// in the next kTableBits bits (up to kMaxSyms symbols per lookup). Tag 3 fills
// each segment from its end down: a table entry is then stored whole below the
// output position with its bit count in the low byte, which saves two operations
// a lookup (about 1.2x the symbols a second of tag 2's loop).
#include "entropy/huffman.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/arch.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"
#include "entropy/code_chunks.h"
#include "entropy/code_lengths.h"
#include "entropy/histogram.h"
#include "entropy/lane_code.h"
#include "entropy/pair_index.h"

#if KVCORE_X86
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define KV_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define KV_ALWAYS_INLINE inline
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the decoder stores table entries little endian");

namespace kvcore::entropy {
namespace {

constexpr unsigned kMaxLen = 11;     // code length limit
constexpr unsigned kTableBits = 11;  // decode table width (>= kMaxLen)
constexpr unsigned kTableSize = 1u << kTableBits;
constexpr unsigned kStreams = 6;        // tag 3, written
constexpr unsigned kForwardStreams = 4;  // tag 2, read only
constexpr unsigned kMaxSyms = 6;  // symbols per multi-symbol table entry
constexpr unsigned kRound = 64 / kTableBits - (64 % kTableBits < 7 ? 1 : 0);  // lookups per refill
static_assert(7 + kRound * kTableBits <= 64, "a refill must cover a whole round");

constexpr uint8_t kTagEmpty = 0;
constexpr uint8_t kTagConst = 1;
constexpr uint8_t kTagForward = 2;
constexpr uint8_t kTagHuffman = 3;
constexpr uint8_t kTagCompact = 5;

size_t header_size(unsigned m, unsigned streams = kStreams) {
    return 1 + kSymbolBitmapBytes + (m + 1) / 2 + 4 * (streams - 1);
}

KV_ALWAYS_INLINE uint64_t load_be64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}
KV_ALWAYS_INLINE void store_be64(uint8_t* p, uint64_t v) {
    v = __builtin_bswap64(v);
    std::memcpy(p, &v, 8);
}
KV_ALWAYS_INLINE void store_le64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

size_t segment_size(size_t n, unsigned k, unsigned streams = kStreams) {
    return n / streams + (k < n % streams ? 1 : 0);
}

// The most bytes a stream of len symbols takes: kMaxLen bits each, padded to a byte.
size_t max_stream_bytes(size_t len) { return (len / 8) * kMaxLen + ((len % 8) * kMaxLen + 7) / 8; }

// Bytes of each stream size in a tag 5 header for n symbols (segment 0 is the longest).
unsigned compact_size_width(size_t n) {
    unsigned w = 1;
    for (size_t most = max_stream_bytes(segment_size(n, 0)); most >> (8 * w); ++w) {
    }
    return w;
}

// The smaller of the two headers for codes of these lengths (m coded symbols).
struct Header {
    uint8_t tag;
    size_t size;
    SymbolRange range;  // tag 5's
};
Header choose_header(const uint8_t* lens, unsigned m, size_t n) {
    const SymbolRange r = symbol_range(lens);
    const size_t compact = 1 + range_map_bytes(r.span) + (kStreams - 1) * size_t(compact_size_width(n));
    const size_t bitmap = header_size(m);
    return compact <= bitmap ? Header{kTagCompact, compact, r} : Header{kTagHuffman, bitmap, r};
}

// Bytes a segment of len symbols may take while coded, fast-loop slack included.
size_t segment_bound(size_t len) { return (len * kMaxLen + 7) / 8 + 16; }

// Payload bytes to plan for: bits coded from exact counts, or, when the code was built
// from weights of a sample (total of them for n symbols), their scaled estimate plus a
// 1/64 margin (see huffman_encode).
size_t planned_bytes(uint64_t bits, size_t n, uint64_t total, bool exact_counts) {
    if (exact_counts) return size_t((bits + 7) / 8);
    const double estimated = double(bits) * double(n) / double(total) / 8;
    return size_t(estimated + estimated / 64) + 1;
}

// ---------------------------------------------------------------- code lengths

// Canonical order of the m present symbols syms[] (increasing, lengths 1..kMaxLen):
// by (length, symbol), a counting sort over them alone (a pass over all 256
// symbols costs more than a small plane's table on its dependent counter updates).
void canonical_order(const uint8_t* lens, const uint8_t* syms, unsigned m, uint8_t* order) {
    unsigned first[kMaxLen + 2] = {};
    for (unsigned i = 0; i < m; ++i) ++first[lens[syms[i]] + 1];
    for (unsigned len = 2; len <= kMaxLen + 1; ++len) first[len] += first[len - 1];
    for (unsigned i = 0; i < m; ++i) order[first[lens[syms[i]]]++] = syms[i];
}

// ---------------------------------------------------------------- encoder

// Codes for the encoder, by symbol or by pair index: code[i] = the code
// left-aligned in 64 bits with nothing below it, len[i] its length. (An entry
// that also held its length in its low byte saved a load, but left that byte in
// the writer's accumulator and the codes in its bit count, to be masked off at
// every flush: two operations a flush, without which MiniLM's bf16 dense
// compress ran 1.03-1.12x faster. A 16-byte entry of both costs two operations
// a lookup more: x86 addressing scales an index by 8 at most.)
struct CodeTable {
    const uint64_t* code;
    const uint8_t* len;
};

struct EncTable {
    uint64_t code[256];
    uint8_t len[256];
    CodeTable table() const { return {code, len}; }
};

// One segment's coding job and, once done, its result.
struct SegmentJob {
    const uint8_t* src;
    size_t len;
    uint8_t* out;
    const uint8_t* out_end;
    size_t written = 0;   // bytes
    uint64_t nbits = 0;   // coded bits
};

// MSB-first bit writer: the pending bits left-aligned in acc, their count in
// bits (< 64 between flushes).
struct BitWriter {
    uint8_t* o;
    uint64_t acc = 0;
    uint64_t bits = 0;
};

KV_ALWAYS_INLINE void put_code(BitWriter& w, const CodeTable& t, size_t i) {
    w.acc |= t.code[i] >> w.bits;
    w.bits += t.len[i];
}
// Stores 8 bytes at o and moves on by the whole bytes pending (the others are
// stored again by the next flush).
KV_ALWAYS_INLINE void flush(BitWriter& w) {
    store_be64(w.o, w.acc);
    w.o += w.bits >> 3;
    w.acc <<= w.bits & 0x38;
    w.bits &= 7;
}
// The eight symbols before p, last first (p[-1] .. p[-8]): stores 8 bytes at o
// and at o + <= 6, and advances o by <= 12 bytes.
KV_ALWAYS_INLINE void put8_symbols(BitWriter& w, const CodeTable& t, const uint8_t* p) {
    put_code(w, t, p[-1]);
    put_code(w, t, p[-2]);
    put_code(w, t, p[-3]);
    put_code(w, t, p[-4]);
    flush(w);  // <= 7 + 4 * 11 = 51 pending bits
    put_code(w, t, p[-5]);
    put_code(w, t, p[-6]);
    put_code(w, t, p[-7]);
    put_code(w, t, p[-8]);
    flush(w);
}

// Codes the segment's symbols that the fast loop left (the first len - i, last
// first), byte by byte with bounds checks.
KV_ALWAYS_INLINE bool finish_segment(SegmentJob& job, size_t i, BitWriter& w, const CodeTable& t) {
    unsigned bits = unsigned(w.bits);  // <= 7 after a flush
    uint64_t acc = w.acc;
    uint8_t* o = w.o;
    for (; i < job.len; ++i) {
        const uint8_t s = job.src[job.len - 1 - i];
        acc |= t.code[s] >> bits;
        bits += t.len[s];
        while (bits >= 8) {
            if (o >= job.out_end) return false;
            *o++ = uint8_t(acc >> 56);
            acc <<= 8;
            bits -= 8;
        }
    }
    job.nbits = uint64_t(o - job.out) * 8 + bits;
    if (bits) {
        if (o >= job.out_end) return false;
        *o++ = uint8_t(acc >> 56);  // the bits below the pending ones are zero
    }
    job.written = size_t(o - job.out);
    return true;
}

// Two segments coded in one loop: their dependency chains (acc, bits) interleave,
// which roughly doubles the symbols per cycle of one chain alone. put8(w, j, i)
// codes the eight symbols of segment j (0: a, 1: b) that come i symbols before
// its end, last first; the rest go one by one (t: the symbols' codes).
template <typename Put8>
KV_ALWAYS_INLINE bool encode_two(SegmentJob& a, SegmentJob& b, const CodeTable& t, Put8 put8) {
    BitWriter wa{a.out}, wb{b.out};
    size_t i = 0;
    if (a.out_end - a.out >= 16 && b.out_end - b.out >= 16) {
        const uint8_t* a_end = a.out_end - 16;
        const uint8_t* b_end = b.out_end - 16;
        const size_t both = std::min(a.len, b.len);
        BitWriter x = wa, y = wb;
        while (i + 8 <= both && x.o <= a_end && y.o <= b_end) {
            put8(x, 0, i);
            put8(y, 1, i);
            i += 8;
        }
        wa = x;
        wb = y;
    }
    return finish_segment(a, i, wa, t) && finish_segment(b, i, wb, t);
}

template <int kVariant>
KV_ALWAYS_INLINE bool encode_pair_impl(SegmentJob& a, SegmentJob& b, const EncTable& t) {
    // Locals: the byte stores may alias the jobs, which would force reloads.
    const uint8_t* const a_end = a.src + a.len;
    const uint8_t* const b_end = b.src + b.len;
    const CodeTable codes = t.table();
    return encode_two(a, b, codes,
                      [=](BitWriter& w, int j, size_t i) { put8_symbols(w, codes, (j ? b_end : a_end) - i); });
}

bool encode_pair_scalar(SegmentJob& a, SegmentJob& b, const EncTable& t) { return encode_pair_impl<0>(a, b, t); }

#if KVCORE_X86
__attribute__((target("avx2,bmi,bmi2"))) bool encode_pair_bmi2(SegmentJob& a, SegmentJob& b, const EncTable& t) {
    return encode_pair_impl<1>(a, b, t);
}
#endif

// ---- two symbols per lookup, for small alphabets
//
// Exponent planes of KV data have them (a channel group spans about 20 exponents; a
// float16 sign and exponent, its low bits split off, spans under 64), so one
// table lookup can code two symbols: half the loads and bit-buffer updates of
// the loop above. The symbols are first turned into pair indices
// index_of[a] + index_of[b] * stride of the pairs (a, b) in plane order, which name
// each pair uniquely: index_of[s] = s & (stride - 1) when every present symbol lies
// in one window of stride = 32 or 64 values, else s's rank among the present symbols
// (below). The bits written are the same.

// A plane's symbols shifted right by `shift`, the low zero bits they all share,
// lie in one window of 2^bits consecutive values, counted mod 256 >> shift:
// planes of per-channel residuals wrap through 0, and 2^bits divides 256 >> shift
// (or that range is 32 values at most, where 5 bits always fit), so such a window
// still maps to distinct indices. The shift serves the low planes of values cast
// up from a narrower float (fp16 cast to fp32: a byte of three mantissa bits,
// multiples of 32).
struct PairWindow {
    unsigned bits;  // 0: no window fits
    unsigned shift;
};

PairWindow pair_window(const uint64_t* counts) {
    unsigned all = 0;
    for (unsigned s = 0; s < 256; ++s) all |= counts[s] ? s : 0;
    const unsigned shift = all ? unsigned(__builtin_ctz(all)) : 0;
    const int range = 256 >> shift;
    int first = -1, prev = -1;
    int max_gap = 0;
    for (int v = 0; v < range; ++v) {
        if (!counts[v << shift]) continue;
        if (prev < 0) first = v;
        else max_gap = std::max(max_gap, v - prev);
        prev = v;
    }
    max_gap = std::max(max_gap, first + range - prev);  // the gap that wraps around
    const int width = range - max_gap + 1;
    return {width <= 32 ? 5u : width <= 64 ? 6u : 0u, shift};
}

// counts[s] = hist[s] for every s; syms = the present symbols, increasing; returns their number.
unsigned present_symbols(const uint32_t* hist, uint64_t* counts, uint8_t* syms) {
    unsigned m = 0;
    for (unsigned s = 0; s < 256; ++s) {
        counts[s] = hist[s];
        if (hist[s]) syms[m++] = uint8_t(s);
    }
    return m;
}

// Symbols in no such window but at most 127 of them (a float16 sign, exponent and
// one mantissa bit: about 38 values of each sign, 54-74 in a channel group of
// MiniLM) are paired by rank instead, the most frequent first, so the pairs coded
// most often sit together at the table's start. The ranks are looked up with
// AVX-512 VBMI byte permutes (pair_index_avx512.cpp), and the table's m * m
// entries are worth building only on planes of several times that many symbols.
constexpr unsigned kMaxRanked = 127;  // the stride is a signed byte weight of the index kernel
constexpr size_t kRankedSymbolsPerEntry = 8;

struct PairIndex {
    unsigned stride = 0;  // 0: symbols are coded one by one
    bool ranked = false;
    PairWindow window{};
    uint8_t index_of[256];  // of the present symbols
};

// syms: the m present symbols.
void choose_pair_index(const uint64_t* counts, const uint8_t* syms, unsigned m, size_t n, bool bmi2, bool vbmi,
                       PairIndex* p) {
    p->window = pair_window(counts);
    if (bmi2 && n >= 256 && p->window.bits) {
        p->stride = 1u << p->window.bits;
        for (unsigned s = 0; s < 256; ++s) p->index_of[s] = uint8_t((s >> p->window.shift) & (p->stride - 1));
    } else if (vbmi && m <= kMaxRanked && n >= kRankedSymbolsPerEntry * m * m) {
        p->stride = m;
        p->ranked = true;
        uint8_t by_count[256];
        std::copy(syms, syms + m, by_count);
        std::stable_sort(by_count, by_count + m, [&](uint8_t x, uint8_t y) { return counts[x] > counts[y]; });
        std::memset(p->index_of, 0, sizeof(p->index_of));
        for (unsigned i = 0; i < m; ++i) p->index_of[by_count[i]] = uint8_t(i);
    }
}

// code[index_of[a] + index_of[b] * stride] = code b then code a (segments are coded
// last symbol first), left-aligned, and len[...] their summed length (<= 22), for
// the m present symbols syms; code and len hold stride * stride entries (a
// window's indices that no present symbol has are zero).
void build_pairs(const EncTable& t, const uint8_t* syms, unsigned m, const PairIndex& p, uint64_t* code,
                 uint8_t* len) {
    if (!p.ranked) {
        std::memset(code, 0, sizeof(uint64_t) * p.stride * p.stride);
        std::memset(len, 0, size_t(p.stride) * p.stride);
    }
    for (unsigned i = 0; i < m; ++i) {
        const uint8_t a = syms[i];
        for (unsigned j = 0; j < m; ++j) {
            const uint8_t b = syms[j];
            const size_t at = p.index_of[a] + size_t(p.index_of[b]) * p.stride;
            code[at] = t.code[b] | t.code[a] >> t.len[b];
            len[at] = uint8_t(t.len[a] + t.len[b]);
        }
    }
}

#if KVCORE_X86
// idx[j] = pair index of src[2j], src[2j + 1] (symbols shifted right by the window's
// shift) for the first 16 * (pairs / 16) pairs; returns that count. The 16-bit shift
// moves the second symbol's low `shift` bits into the first's top bits: those bits
// are zero in every symbol, so the mask leaves the first symbol's shifted bits alone.
__attribute__((target("avx2"))) size_t window_pair_indices_avx2(const uint8_t* src, size_t pairs, PairWindow window,
                                                                uint16_t* idx) {
    const unsigned mask = (1u << window.bits) - 1;
    const __m256i vmask = _mm256_set1_epi8(char(mask));
    const __m256i weights = _mm256_set1_epi16(int16_t(1 | (mask + 1) << 8));  // a * 1 + b * 2^bits
    const __m128i count = _mm_cvtsi32_si128(int(window.shift));
    size_t j = 0;
    for (; j + 16 <= pairs; j += 16) {
        const __m256i v = _mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * j)), count);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + j), _mm256_maddubs_epi16(_mm256_and_si256(v, vmask), weights));
    }
    return j;
}

void pair_indices(const uint8_t* src, size_t pairs, const PairIndex& p, uint16_t* idx) {
    size_t j = p.ranked ? detail::ranked_pair_indices_avx512(src, pairs, p.index_of, p.stride, idx)
                        : window_pair_indices_avx2(src, pairs, p.window, idx);
    for (; j < pairs; ++j) idx[j] = uint16_t(p.index_of[src[2 * j]] + p.index_of[src[2 * j + 1]] * p.stride);
}

// The four pairs (eight symbols) before p, last first; stores like put8_symbols.
KV_ALWAYS_INLINE void put4_pairs(BitWriter& w, const CodeTable& pairs, const uint16_t* p) {
    put_code(w, pairs, p[-1]);
    put_code(w, pairs, p[-2]);
    flush(w);  // <= 7 + 2 * 22 = 51 pending bits
    put_code(w, pairs, p[-3]);
    put_code(w, pairs, p[-4]);
    flush(w);
}

// encode_two over pair indices: a_idx_end / b_idx_end end the indices of the
// pairs that end each segment; the symbols before them go one by one.
__attribute__((target("avx2,bmi,bmi2"))) bool encode_pairs_indexed(SegmentJob& a, SegmentJob& b, const EncTable& t,
                                                                  const CodeTable& pair_codes,
                                                                  const uint16_t* a_idx_end, const uint16_t* b_idx_end) {
    const CodeTable pairs = pair_codes;  // (a local: the byte stores may alias the caller's)
    return encode_two(a, b, t.table(),
                      [=](BitWriter& w, int j, size_t i) { put4_pairs(w, pairs, (j ? b_idx_end : a_idx_end) - i / 2); });
}
#endif  // KVCORE_X86

// The ISA levels the coder's loops need, as active now (KVCORE_DISABLE_ISA masks them).
#if KVCORE_X86
bool use_bmi2() { return (cpu::active_isa() & cpu::kIsaAvx2) != 0; }
bool use_vbmi() { return (cpu::active_isa() & cpu::kIsaAvx512) != 0; }  // the AVX-512 level includes VBMI
#else
bool use_bmi2() { return false; }  // no SIMD level in this build: symbols are coded one by one
bool use_vbmi() { return false; }
#endif

// ---- four or eight symbols per put, at the AVX-512 level
//
// code_chunks_avx512 looks up 32 symbols' codes at a time and joins them into
// chunks of four or eight symbols, so one put and one flush code four or eight
// symbols (the pair tables above take two puts and a flush for four), and no pair
// index is built or computed. The bits written are the same.

// Sets t's layout (tables, select) to the fewest tables under which each of the
// m present symbols syms keeps an entry of its own; false where two do not do.
bool chunk_layout(const uint8_t* syms, unsigned m, detail::ChunkTable* t) {
    const auto fits = [&](unsigned select) {  // select: the bit that picks one of two tables, 0: one table
        uint64_t taken[2] = {0, 0};
        for (unsigned i = 0; i < m; ++i) {
            const unsigned s = syms[i], table = select ? (s >> select) & 1 : 0;
            const uint64_t bit = uint64_t(1) << (s & 63);
            if (taken[table] & bit) return false;
            taken[table] |= bit;
        }
        return true;
    };
    t->tables = fits(0) ? 1 : 2;
    t->select = t->tables == 1 ? 0 : fits(7) ? 7 : fits(6) ? 6 : 0;
    return t->tables == 1 || t->select != 0;
}

// Fills the entries of t (its layout set by chunk_layout) with the codes of syms.
void fill_chunk_table(const EncTable& enc, const uint8_t* syms, unsigned m, detail::ChunkTable* t) {
    std::memset(t->entry, 0, sizeof(t->entry));
    for (unsigned i = 0; i < m; ++i) {
        const unsigned s = syms[i], len = enc.len[s];
        const unsigned table = t->tables == 2 ? (s >> t->select) & 1 : 0;
        t->entry[64 * table + (s & 63)] = uint16_t(enc.code[s] >> (64 - len) | len << detail::kChunkLenShift);
    }
}

// How huffman_encode codes the m present symbols syms of a plane of n symbols on
// the active ISA: in chunks (true; *chunks' layout set), or else two per lookup
// through *pairs (stride 0: one per lookup). At the AVX-512 level, symbols that
// fit one or two 64-entry tables go in chunks. (Four tables, looked up by four
// permutes, cost the chunk kernel more than it saved on the wide alphabet of a
// float32's second byte.)
bool choose_coding(const uint64_t* counts, const uint8_t* syms, unsigned m, size_t n, detail::ChunkTable* chunks,
                   PairIndex* pairs) {
    if (use_vbmi() && chunk_layout(syms, m, chunks)) return true;
    choose_pair_index(counts, syms, m, n, use_bmi2(), use_vbmi(), pairs);
    return false;
}

#if KVCORE_X86
constexpr size_t kChunkBatch = 512;  // symbols of each segment per kernel call

KV_ALWAYS_INLINE void put_chunk(BitWriter& w, uint64_t chunk, unsigned len) {
    w.acc |= chunk >> w.bits;  // <= 7 + kMaxChunkBits pending bits
    w.bits += len;
    flush(w);
}

__attribute__((target("avx2,bmi,bmi2"))) bool encode_chunked(SegmentJob& a, SegmentJob& b, const EncTable& t,
                                                            const detail::ChunkTable& chunk_table) {
    alignas(64) uint64_t chunks_a[kChunkBatch / 4], chunks_b[kChunkBatch / 4];
    uint8_t lens_a[kChunkBatch / 4], lens_b[kChunkBatch / 4];
    const uint8_t* const a_end = a.src + a.len;
    const uint8_t* const b_end = b.src + b.len;
    const size_t both = std::min(a.len, b.len);
    BitWriter x{a.out}, y{b.out};
    size_t i = 0;
    for (;;) {
        const size_t groups = std::min(kChunkBatch, both - i) / 32;
        // Each flush stores 8 bytes at o, and o advances by at most kMaxLen bits a symbol.
        const size_t room = groups * 32 * kMaxLen / 8 + 16;
        if (groups == 0 || size_t(a.out_end - x.o) < room || size_t(b.out_end - y.o) < room) break;
        const size_t na = detail::code_chunks_avx512(a_end - i, groups, chunk_table, chunks_a, lens_a);
        const size_t nb = detail::code_chunks_avx512(b_end - i, groups, chunk_table, chunks_b, lens_b);
        const size_t nboth = std::min(na, nb);
        for (size_t j = 0; j < nboth; ++j) {
            put_chunk(x, chunks_a[j], lens_a[j]);
            put_chunk(y, chunks_b[j], lens_b[j]);
        }
        for (size_t j = nboth; j < na; ++j) put_chunk(x, chunks_a[j], lens_a[j]);
        for (size_t j = nboth; j < nb; ++j) put_chunk(y, chunks_b[j], lens_b[j]);
        i += 32 * groups;
    }
    return finish_segment(a, i, x, t.table()) && finish_segment(b, i, y, t.table());
}
#endif  // KVCORE_X86

// ---------------------------------------------------------------- decoder

// Table entries hold every whole code in the next kTableBits bits (at least one,
// as kTableBits = kMaxLen), in one of two layouts:
// - forward (tag 2): symbols in bytes 0..5 (first in byte 0), bits in byte 6,
//   count in byte 7; stored at the output position, which then advances;
// - backward (tag 3): bits in byte 0, count in byte 1, symbols in bytes 7..2
//   (first in byte 7); stored just below the output position, which then moves
//   down by the count. Adding the whole entry to the bit position adds its bits.
struct Tables {
    alignas(64) uint64_t multi[kTableSize];
    const uint8_t* lens;  // code length of each symbol: the first symbol of an entry, alone
};

template <bool kBackward>
struct Entry {
    static constexpr uint64_t kMeta = kBackward ? 0xffffull : 0xffff000000000000ull;
    static constexpr unsigned kCountShift = kBackward ? 8 : 56;
    static constexpr unsigned kBitsShift = kBackward ? 0 : 48;
    // The symbols that stay when one is put in front: masked before (forward) or
    // after (backward) the byte shift that makes room for it.
    static constexpr uint64_t kStaying = kBackward ? 0x00ffffffffff0000ull : 0x0000ffffffffffffull;
    static unsigned count(uint64_t r) { return unsigned(r >> kCountShift) & 0xff; }
    static unsigned bits(uint64_t r) { return unsigned(r >> kBitsShift) & 0xff; }
    // The i-th symbol of r, and symbol s placed as the first one.
    static unsigned symbol(uint64_t r, unsigned i) { return unsigned(r >> (kBackward ? 56 - 8 * i : 8 * i)) & 0xff; }
    static uint64_t first(unsigned s) { return uint64_t(s) << (kBackward ? 56 : 0); }
    // r with a code of len bits put in front, its symbol still zero: `grown` when r
    // holds fewer than kMaxSyms symbols, else `kept` (r's last symbol dropped with its bits).
    static KV_ALWAYS_INLINE uint64_t moved(uint64_t r) {
        return kBackward ? (r >> 8) & kStaying : (r & kStaying) << 8;
    }
    static KV_ALWAYS_INLINE uint64_t grown(uint64_t r, unsigned len) {
        return moved(r) + (r & kMeta) + (uint64_t(len) << kBitsShift) + (uint64_t(1) << kCountShift);
    }
    static uint64_t kept(uint64_t r, unsigned len, const uint8_t* lens) {
        const unsigned kept_bits = bits(r) + len - lens[symbol(r, kMaxSyms - 1)];
        return (moved(r) & ~kMeta) | uint64_t(kept_bits) << kBitsShift | uint64_t(kMaxSyms) << kCountShift;
    }
};

// behind[j] = rest[j] with a code of len bits put in front, for from <= j < span:
// Entry::grown, or Entry::kept where rest[j] is full (holds kMaxSyms symbols).
// The portable loop, then the same in AVX2.
template <bool kBackward>
KV_ALWAYS_INLINE void grow_tail(const uint64_t* rest, uint64_t* behind, uint32_t from, uint32_t span, unsigned len,
                                const uint8_t* lens) {
    using E = Entry<kBackward>;
    for (uint32_t j = from; j < span; ++j)
        behind[j] = E::count(rest[j]) == kMaxSyms ? E::kept(rest[j], len, lens) : E::grown(rest[j], len);
}

#if KVCORE_X86
// lens64[s] = the length of symbol s (coded symbols; 0 for others), which the
// full entries' last symbols gather: short codes fill most wide entries, and a
// scalar pass over them took some 40% of building a table of exponents.
template <bool kBackward>
__attribute__((target("avx2"))) void grow_avx2(const uint64_t* rest, uint64_t* behind, uint32_t span, unsigned len,
                                               const uint8_t* lens, const long long* lens64) {
    using E = Entry<kBackward>;
    constexpr int kLastShift = kBackward ? 56 - 8 * (kMaxSyms - 1) : 8 * (kMaxSyms - 1);
    const __m256i staying = _mm256_set1_epi64x(int64_t(E::kStaying));
    const __m256i meta = _mm256_set1_epi64x(int64_t(E::kMeta));
    const __m256i plus = _mm256_set1_epi64x(int64_t(uint64_t(len) << E::kBitsShift | uint64_t(1) << E::kCountShift));
    const __m256i count_mask = _mm256_set1_epi64x(int64_t(uint64_t(0xff) << E::kCountShift));
    const __m256i full_count = _mm256_set1_epi64x(int64_t(uint64_t(kMaxSyms) << E::kCountShift));
    const __m256i byte = _mm256_set1_epi64x(0xff);
    const __m256i kept_len = _mm256_set1_epi64x(int64_t(len));
    uint32_t j = 0;
    for (; j + 4 <= span; j += 4) {
        const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rest + j));
        const __m256i moved = kBackward ? _mm256_and_si256(_mm256_srli_epi64(r, 8), staying)
                                        : _mm256_slli_epi64(_mm256_and_si256(r, staying), 8);
        __m256i e = _mm256_add_epi64(_mm256_add_epi64(moved, _mm256_and_si256(r, meta)), plus);
        const __m256i full = _mm256_cmpeq_epi64(_mm256_and_si256(r, count_mask), full_count);
        if (!_mm256_testz_si256(full, full)) {
            // kept: the last symbol and its bits dropped, the count stays kMaxSyms
            const __m256i last = _mm256_and_si256(_mm256_srli_epi64(r, kLastShift), byte);
            const __m256i last_len = _mm256_mask_i64gather_epi64(_mm256_setzero_si256(), lens64, last, full, 8);
            const __m256i bits = _mm256_sub_epi64(
                _mm256_add_epi64(_mm256_and_si256(_mm256_srli_epi64(r, E::kBitsShift), byte), kept_len), last_len);
            const __m256i kept = _mm256_or_si256(_mm256_andnot_si256(meta, moved),
                                                 _mm256_or_si256(_mm256_slli_epi64(bits, E::kBitsShift), full_count));
            e = _mm256_blendv_epi8(e, kept, full);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(behind + j), e);
    }
    grow_tail<kBackward>(rest, behind, j, span, len, lens);
}
#endif

// The multi-symbol table by dynamic programming over suffix widths: the entry of
// a w-bit string x is x's first code (when it fits in w bits) followed by the
// entry of the w - len bits after it, kept to kMaxSyms symbols. The strings that
// start with a code of length len are a contiguous range per symbol, in canonical
// order, and the part after the code is the same for every symbol of that length:
// it is computed once per (w, len) and each symbol's range is that run plus the
// symbol, one add per entry (about 4096 entries in all, with no call per symbol).
template <bool kBackward, bool kAvx2>
KV_ALWAYS_INLINE void build_multi_impl(const uint8_t* lens, const uint8_t* order, const uint32_t* start, unsigned m,
                                       uint64_t* multi) {
    // by_width[(1 << w) + x] = entry of the w-bit string x, for w < kTableBits.
    alignas(64) uint64_t by_width[kTableSize];
    alignas(64) uint64_t behind[kTableSize / 2];
#if KVCORE_X86
    alignas(32) long long lens64[256];
    if constexpr (kAvx2) {
        std::fill(lens64, lens64 + 256, 0);
        for (unsigned i = 0; i < m; ++i) lens64[order[i]] = lens[order[i]];
    }
#endif
    by_width[1] = 0;  // width 0: nothing decoded
    for (unsigned w = 1; w <= kTableBits; ++w) {
        uint64_t* row = w == kTableBits ? multi : by_width + (1u << w);
        uint32_t covered = 0;
        unsigned i = 0;
        while (i < m && lens[order[i]] <= w) {
            const unsigned len = lens[order[i]];
            const uint32_t span = 1u << (w - len);
            const uint64_t* rest = by_width + span;  // entries of width w - len
#if KVCORE_X86
            if constexpr (kAvx2)
                grow_avx2<kBackward>(rest, behind, span, len, lens, lens64);
            else
#endif
                grow_tail<kBackward>(rest, behind, 0, span, len, lens);
            uint64_t* out = row + (start[i] >> (kTableBits - w));
            for (; i < m && lens[order[i]] == len; ++i, out += span) {
                const uint64_t sym = Entry<kBackward>::first(order[i]);
                for (uint32_t j = 0; j < span; ++j) out[j] = behind[j] + sym;
            }
            covered = uint32_t(out - row);
        }
        // Strings whose first code is longer than w decode nothing at this width.
        for (uint32_t j = covered; j < (1u << w); ++j) row[j] = 0;
    }
}

template <bool kBackward>
void build_multi_portable(const uint8_t* lens, const uint8_t* order, const uint32_t* start, unsigned m,
                          uint64_t* multi) {
    build_multi_impl<kBackward, false>(lens, order, start, m, multi);
}

#if KVCORE_X86
// The same with 4-entry vector adds (the runs are mostly long).
template <bool kBackward>
__attribute__((target("avx2"))) void build_multi_avx2(const uint8_t* lens, const uint8_t* order, const uint32_t* start,
                                                      unsigned m, uint64_t* multi) {
    build_multi_impl<kBackward, true>(lens, order, start, m, multi);
}
#endif

// Builds the tables from canonical order and lengths (avx2: with the AVX2 build);
// false when the code is not complete.
template <bool kBackward>
bool build_tables(const uint8_t* lens, const uint8_t* order, unsigned m, bool avx2, Tables* t) {
    uint32_t start[256];
    uint32_t pos = 0;
    for (unsigned i = 0; i < m; ++i) {
        const unsigned s = order[i], len = lens[s];
        const uint32_t span = 1u << (kTableBits - len);
        if (pos + span > kTableSize) return false;
        start[i] = pos;
        pos += span;
    }
    if (pos != kTableSize) return false;
    t->lens = lens;
#if KVCORE_X86
    if (avx2)
        build_multi_avx2<kBackward>(lens, order, start, m, t->multi);
    else
#else
    (void)avx2;  // never set in this build
#endif
        build_multi_portable<kBackward>(lens, order, start, m, t->multi);
    return true;
}

// One stream's reader and its segment. Forward streams fill [out, limit) upwards;
// backward streams fill [limit, out) downwards from out.
struct StreamState {
    size_t pos;       // byte offset in src of the bit reader
    unsigned bitpos;  // bits consumed at pos (0..63)
    uint8_t* out;
    uint8_t* limit;
};

template <bool kBackward>
KV_ALWAYS_INLINE size_t room(const StreamState& s) {
    return kBackward ? size_t(s.out - s.limit) : size_t(s.limit - s.out);
}

// Decodes the rest of one stream with bounds checks on every access (bytes past
// src_size read as zero; the final size check rejects such streams).
template <bool kBackward>
KV_ALWAYS_INLINE void decode_tail(const uint8_t* src, size_t src_size, const Tables& t, StreamState& s) {
    using E = Entry<kBackward>;
    while (room<kBackward>(s)) {
        s.pos += s.bitpos >> 3;
        s.bitpos &= 7;
        uint64_t buf;
        if (s.pos <= src_size && src_size - s.pos >= 8) {
            buf = load_be64(src + s.pos);
        } else {
            buf = 0;
            for (unsigned b = 0; b < 8; ++b)
                buf = (buf << 8) | (s.pos + b < src_size ? src[s.pos + b] : 0);
        }
        const uint32_t idx = uint32_t((buf << s.bitpos) >> (64 - kTableBits));
        const uint64_t e = t.multi[idx];
        const size_t count = E::count(e);
        if (count <= room<kBackward>(s)) {
            // Little endian: the symbols are bytes 0.. (forward) or ..7 (backward) of e.
            if (kBackward) {
                s.out -= count;
                std::memcpy(s.out, reinterpret_cast<const uint8_t*>(&e) + 8 - count, count);
            } else {
                std::memcpy(s.out, &e, count);
                s.out += count;
            }
            s.bitpos += E::bits(e);
        } else {
            const unsigned sym = E::symbol(e, 0);
            *(kBackward ? --s.out : s.out++) = uint8_t(sym);
            s.bitpos += t.lens[sym];
        }
    }
    s.pos += s.bitpos >> 3;
    s.bitpos &= 7;
}

// Per refill round a stream advances <= 7 input bytes and <= kMaxSyms * kRound output bytes,
// and writes 8 bytes at (forward) or below (backward) its last output position.
constexpr size_t kOutPerRound = kMaxSyms * kRound;
constexpr size_t kOutSlack = kMaxSyms * (kRound - 1) + 8;
constexpr size_t kInPerRound = (7 + kRound * kTableBits) / 8;

// Refill rounds stream s can run with no bounds check (0: too close to an end).
template <bool kBackward>
KV_ALWAYS_INLINE size_t safe_rounds(size_t src_size, const StreamState& s) {
    const size_t pos = s.pos + (s.bitpos >> 3);
    if (pos > src_size || src_size - pos < 8) return 0;
    const size_t out_room = room<kBackward>(s);
    if (out_room < kOutSlack) return 0;
    return std::min((src_size - pos - 8) / kInPerRound + 1, (out_room - kOutSlack) / kOutPerRound + 1);
}

// Forward (tag 2) lookup: b = bits consumed since the refill in its low byte
// (<= 7 + kRound * kTableBits < 64); what entries add above it is dropped at each
// refill. 8 operations.
KV_ALWAYS_INLINE void forward_step(const uint64_t* tab, uint64_t w, uint64_t& b, uint8_t*& o) {
    const uint64_t e = tab[(w << (b & 63)) >> (64 - kTableBits)];
    store_le64(o, e);
    o += e >> 56;
    b += e >> 48;  // bits into the low byte, count above it
}

// Backward (tag 3) lookup on a window w whose next bit is its top bit: the entry
// is stored whole below o, and its bit count (its low byte) shifts w left: 6
// operations, and a chain of shift, load, shift from one lookup to the next (the
// bit count no longer passes through an add and a variable shift of the window).
// A marker bit below the window's bits (see refill_window) counts the bits
// consumed, so a stream's state in the round is two values, w and o, not three:
// GCC spills fewer of the six streams' registers. On MiniLM's bf16 exponent and
// fp16 top-byte planes (Zen 4, 256 KiB pieces) this loop decoded 1.09-1.24x the
// symbols a second of the three-value one (three alternating pairs each); an
// assembly version of the six-stream rounds with no spills measured the same,
// so what remains is presumably the chains' latency.
KV_ALWAYS_INLINE void backward_step(const uint64_t* tab, uint64_t& w, uint8_t*& o) {
    const uint64_t e = tab[w >> (64 - kTableBits)];
    store_le64(o - 8, e);
    o -= (e >> 8) & 0xff;
    w <<= (e & 63);
}

// Backward refill: the marker's rise since the last refill (the bits consumed)
// advances the stream's bit position `at`, and w takes the 64 bits from at's byte,
// shifted past at's bits in that byte, with the marker set at bit 0. A round
// consumes at most kRound * kTableBits bits, so the marker stays below every bit
// a lookup reads (bits 63 .. 64 - 7 - kRound * kTableBits, all above bit 0) and is
// w's lowest set bit: the shifts fill zeros in below it.
KV_ALWAYS_INLINE void refill_window(const uint8_t* src, uint64_t& at, uint64_t& w) {
    at += unsigned(__builtin_ctzll(w));
    w = (load_be64(src + (at >> 3)) << (at & 7)) | 1;
}

// Refill rounds all kS streams can run with no bounds check.
template <bool kBackward, unsigned kS>
KV_ALWAYS_INLINE size_t common_rounds(size_t src_size, const StreamState* st) {
    size_t rounds = SIZE_MAX;
    for (unsigned k = 0; k < kS; ++k) rounds = std::min(rounds, safe_rounds<kBackward>(src_size, st[k]));
    return rounds;
}

template <unsigned kS>
KV_ALWAYS_INLINE void decode_forward_impl(const uint8_t* src, size_t src_size, const Tables& t, StreamState* st) {
    const uint64_t* tab = t.multi;
    for (size_t rounds; (rounds = common_rounds<false, kS>(src_size, st)) != 0;) {
        const uint8_t* in[kS];
        uint64_t b[kS];
        uint8_t* o[kS];
        for (unsigned k = 0; k < kS; ++k) {
            in[k] = src + st[k].pos;
            b[k] = st[k].bitpos;
            o[k] = st[k].out;
        }
        do {
            uint64_t w[kS];
#pragma GCC unroll 8
            for (unsigned k = 0; k < kS; ++k) {
                in[k] += (b[k] & 0xff) >> 3;
                b[k] &= 7;
                w[k] = load_be64(in[k]);
            }
#pragma GCC unroll 8
            for (unsigned r = 0; r < kRound; ++r)
#pragma GCC unroll 8
                for (unsigned k = 0; k < kS; ++k) forward_step(tab, w[k], b[k], o[k]);
        } while (--rounds);
        for (unsigned k = 0; k < kS; ++k) {
            st[k].pos = size_t(in[k] - src);
            st[k].bitpos = unsigned(b[k] & 0xff);
            st[k].out = o[k];
        }
    }
}

template <unsigned kS>
KV_ALWAYS_INLINE void decode_backward_impl(const uint8_t* src, size_t src_size, const Tables& t, StreamState* st) {
    const uint64_t* tab = t.multi;
    for (size_t rounds; (rounds = common_rounds<true, kS>(src_size, st)) != 0;) {
        uint64_t at[kS];  // bit position in src of w's first bit
        uint64_t w[kS];
        uint8_t* o[kS];
        for (unsigned k = 0; k < kS; ++k) {
            at[k] = uint64_t(st[k].pos) * 8 + st[k].bitpos;
            w[k] = 1;  // the marker alone: nothing consumed yet
            o[k] = st[k].out;
        }
        do {
#pragma GCC unroll 8
            for (unsigned k = 0; k < kS; ++k) refill_window(src, at[k], w[k]);
#pragma GCC unroll 8
            for (unsigned r = 0; r < kRound; ++r)
#pragma GCC unroll 8
                for (unsigned k = 0; k < kS; ++k) backward_step(tab, w[k], o[k]);
        } while (--rounds);
        for (unsigned k = 0; k < kS; ++k) {
            const uint64_t end = at[k] + unsigned(__builtin_ctzll(w[k]));
            st[k].pos = size_t(end >> 3);
            st[k].bitpos = unsigned(end & 7);
            st[k].out = o[k];
        }
    }
}

template <unsigned kS, bool kBackward>
KV_ALWAYS_INLINE void decode_streams_impl(const uint8_t* src, size_t src_size, const Tables& t, StreamState* st) {
    if constexpr (kBackward)
        decode_backward_impl<kS>(src, src_size, t, st);
    else
        decode_forward_impl<kS>(src, src_size, t, st);
    // The streams end a few hundred symbols apart: finish each alone at full
    // speed, so only the last few dozen symbols of each take decode_tail's checks.
    for (unsigned k = 0; k < kS; ++k) {
        if constexpr (kBackward)
            decode_backward_impl<1>(src, src_size, t, st + k);
        else
            decode_forward_impl<1>(src, src_size, t, st + k);
    }
}

// The interleaved fast loop over a tag 3 (backward) or tag 2 (forward) stream set.
template <bool kBackward>
void decode_streams_scalar(const uint8_t* src, size_t src_size, const Tables& t, StreamState* st) {
    decode_streams_impl<kBackward ? kStreams : kForwardStreams, kBackward>(src, src_size, t, st);
}

#if KVCORE_X86
template <bool kBackward>
__attribute__((target("avx2,bmi,bmi2"))) void decode_streams_bmi2(const uint8_t* src, size_t src_size,
                                                                   const Tables& t, StreamState* st) {
    decode_streams_impl<kBackward ? kStreams : kForwardStreams, kBackward>(src, src_size, t, st);
}
#endif


// Decodes every stream of a tag 3 (backward) or tag 2 (forward) stream set to
// its end; false when the code lengths do not form a complete code.
template <bool kBackward>
bool decode_streams(const uint8_t* src, size_t src_size, const uint8_t* lens, const uint8_t* order, unsigned m,
                    StreamState* st) {
    const bool bmi2 = use_bmi2();
    Tables tables;
    if (!build_tables<kBackward>(lens, order, m, bmi2, &tables)) return false;
#if KVCORE_X86
    if (bmi2)
        decode_streams_bmi2<kBackward>(src, src_size, tables, st);
    else
#endif
        decode_streams_scalar<kBackward>(src, src_size, tables, st);
    for (unsigned k = 0; k < (kBackward ? kStreams : kForwardStreams); ++k)
        decode_tail<kBackward>(src, src_size, tables, st[k]);
    return true;
}

// Whether lanes_allowance takes the lane code for these weights over a
// six-stream stream estimated at six_stream bytes; *size = its estimate.
bool lanes_chosen(const uint64_t* counts, size_t n, uint64_t total, bool exact_counts, size_t six_stream,
                  double lanes_allowance, lanes::Plan* plan, size_t* size) {
    if (lanes_allowance < 0 || !lanes::plan(counts, plan)) return false;
    *size = lanes::estimate(*plan, n, total, exact_counts);
    // (Within the bound too, which the lanes' last bytes exceed on small planes.)
    return double(*size) <= double(six_stream) * (1 + lanes_allowance) && *size <= huffman_bound(n);
}

}  // namespace

// ---------------------------------------------------------------- public API

size_t huffman_bound(size_t n) {
    // Largest header (256 symbols) plus kMaxLen bits a symbol plus one pad byte a stream.
    return header_size(256) + (n / 8) * kMaxLen + ((n % 8) * kMaxLen + 7) / 8 + kStreams;
}

size_t huffman_estimate(const uint32_t* hist, size_t n, bool exact_counts, double lanes_allowance) {
    if (n == 0) return 1;
    uint64_t counts[256];
    uint64_t total = 0;
    unsigned m = 0;
    for (unsigned s = 0; s < 256; ++s) {
        counts[s] = hist[s];
        total += hist[s];
        m += hist[s] != 0;
    }
    if ((exact_counts && total != n) || m == 0) return huffman_bound(n);  // inconsistent counts: the encoder refuses them
    if (m == 1) return 2;
    uint8_t lens[256];
    limited_lengths(counts, kMaxLen, lens);
    uint64_t bits = 0;
    for (unsigned s = 0; s < 256; ++s) bits += counts[s] * lens[s];
    const size_t six_stream =
        choose_header(lens, m, n).size + planned_bytes(bits, n, total, exact_counts) + (kStreams - 1);
    lanes::Plan plan;
    size_t lane_size = 0;
    if (lanes_chosen(counts, n, total, exact_counts, six_stream, lanes_allowance, &plan, &lane_size))
        return lane_size;
    return six_stream;
}

Status huffman_encode(const uint8_t* src, size_t n, const uint32_t* hist, uint8_t* dst, size_t cap, size_t* written,
                      bool exact_counts, double lanes_allowance) {
    if (written == nullptr) return invalid("huffman_encode: written is null");
    *written = 0;
    if ((src == nullptr && n) || (dst == nullptr && cap)) return invalid("huffman_encode: null buffer");
    if (n > UINT32_MAX) return invalid("huffman_encode: plane larger than 2^32-1 symbols");
    if (n == 0) {
        if (cap < 1) return make_status(Code::kBufferTooSmall, "huffman_encode: capacity below 1 byte");
        dst[0] = kTagEmpty;
        *written = 1;
        return Status::ok();
    }
    uint32_t own_hist[256];
    if (hist == nullptr) {
        histogram(src, n, own_hist);
        hist = own_hist;
    }
    uint64_t counts[256];
    uint8_t syms[256];  // the present symbols, increasing
    const unsigned m = present_symbols(hist, counts, syms);
    const uint64_t total = std::accumulate(counts, counts + 256, uint64_t(0));
    if (exact_counts ? total != n : total == 0) return invalid("huffman_encode: histogram does not sum to n");
    if (m == 1) {
        if (cap < 2) return make_status(Code::kBufferTooSmall, "huffman_encode: capacity below 2 bytes");
        dst[0] = kTagConst;
        dst[1] = syms[0];
        *written = 2;
        return Status::ok();
    }

    uint8_t lens[256];
    limited_lengths(counts, kMaxLen, lens);
    for (unsigned i = 0; i < m; ++i)
        if (lens[syms[i]] == 0) return make_status(Code::kBackendError, "huffman: code length failure");
    uint64_t total_bits = 0;
    for (unsigned s = 0; s < 256; ++s) total_bits += counts[s] * lens[s];
    const Header header = choose_header(lens, m, n);
    const size_t hsize = header.size;
    // With weights from a sample the size is an estimate (scaled to n symbols) that runs
    // up to about 1% low on near-uniform planes (a byte plane of mantissas): it must come
    // in 1/64 under the capacity, or the plane is refused before it is coded.
    const uint64_t expected_bytes = planned_bytes(total_bits, n, total, exact_counts);
    lanes::Plan plan;
    size_t lane_size = 0;
    if (lanes_chosen(counts, n, total, exact_counts, hsize + expected_bytes + (kStreams - 1), lanes_allowance, &plan,
                     &lane_size)) {
        if (cap < lane_size) return make_status(Code::kBufferTooSmall, "huffman_encode: stream would exceed the capacity");
        return lanes::encode(src, n, plan, dst, cap, written);
    }
    if (cap < hsize || cap - hsize < expected_bytes)
        return make_status(Code::kBufferTooSmall, "huffman_encode: stream would exceed the capacity");

    // Canonical codes.
    uint8_t order[256];
    canonical_order(lens, syms, m, order);
    EncTable enc;
    std::memset(&enc, 0, sizeof(enc));
    uint32_t pos = 0;  // in kTableBits space
    for (unsigned i = 0; i < m; ++i) {
        const unsigned s = order[i], len = lens[s];
        enc.code[s] = uint64_t(pos) << (64 - kTableBits);  // code << (64 - len)
        enc.len[s] = uint8_t(len);
        pos += 1u << (kTableBits - len);
    }
    if (pos != kTableSize) return make_status(Code::kBackendError, "huffman: incomplete code");

    // Header.
    uint8_t* h = dst;
    *h++ = header.tag;
    if (header.tag == kTagCompact) {
        write_range_map(lens, header.range, h);
    } else {
        write_symbol_map(lens, 0, h);
    }
    const unsigned size_width = header.tag == kTagCompact ? compact_size_width(n) : 4;
    uint8_t* sizes = dst + hsize - (kStreams - 1) * size_width;
    h = dst + hsize;

    // Streams: 0 straight into dst, 1..3 into scratch (their offsets are known only
    // once the earlier ones are coded), then moved up behind stream 0.
#if KVCORE_X86
    const bool bmi2 = use_bmi2();
#endif
    uint8_t* out = h;
    const uint8_t* out_end = dst + cap;
    thread_local std::vector<uint8_t> scratch;
    SegmentJob jobs[kStreams];
    size_t scratch_need = 0;
    for (unsigned k = 1; k < kStreams; ++k) scratch_need += segment_bound(segment_size(n, k));
    if (scratch.size() < scratch_need) scratch.resize(scratch_need);
    const uint8_t* seg = src;
    uint8_t* spare = scratch.data();
    for (unsigned k = 0; k < kStreams; ++k) {
        const size_t len = segment_size(n, k);
        jobs[k].src = seg;
        jobs[k].len = len;
        jobs[k].out = k == 0 ? out : spare;
        jobs[k].out_end = k == 0 ? out_end : spare + segment_bound(len);
        if (k) spare += segment_bound(len);
        seg += len;
    }
    // Symbols in chunks of four or eight per put (AVX-512); else symbols that lie in one
    // window of 32 or 64 values (their shared low zero bits shifted out), or number at
    // most 127, two per lookup.
    detail::ChunkTable chunk_table;
    PairIndex pair_index;
    const bool chunked = choose_coding(counts, syms, m, n, &chunk_table, &pair_index);
    if (chunked) fill_chunk_table(enc, syms, m, &chunk_table);
    const bool paired = pair_index.stride != 0;
    thread_local std::vector<uint16_t> pair_idx;
    thread_local std::vector<uint64_t> pair_code;
    thread_local std::vector<uint8_t> pair_len;
    if (paired) {
        // (Each sized on its own: a resize that throws leaves the other as it was.)
        const size_t entries = size_t(pair_index.stride) * pair_index.stride;
        if (pair_code.size() < entries) pair_code.resize(entries);
        if (pair_len.size() < entries) pair_len.resize(entries);
        build_pairs(enc, syms, m, pair_index, pair_code.data(), pair_len.data());
        if (pair_idx.size() < n / 2 + kStreams) pair_idx.resize(n / 2 + kStreams);
    }
    for (unsigned k = 0; k < kStreams; k += 2) {
        bool ok;
#if KVCORE_X86
        if (chunked) {
            ok = encode_chunked(jobs[k], jobs[k + 1], enc, chunk_table);
        } else if (paired) {
            // Each segment pairs back from its own end, where its coding starts.
            const size_t pairs_a = std::min(jobs[k].len, jobs[k + 1].len) / 2;
            uint16_t* a_idx = pair_idx.data();
            uint16_t* b_idx = a_idx + pairs_a;
            pair_indices(jobs[k].src + jobs[k].len - 2 * pairs_a, pairs_a, pair_index, a_idx);
            pair_indices(jobs[k + 1].src + jobs[k + 1].len - 2 * pairs_a, pairs_a, pair_index, b_idx);
            ok = encode_pairs_indexed(jobs[k], jobs[k + 1], enc, {pair_code.data(), pair_len.data()}, a_idx + pairs_a,
                                      b_idx + pairs_a);
        } else {
            ok = bmi2 ? encode_pair_bmi2(jobs[k], jobs[k + 1], enc) : encode_pair_scalar(jobs[k], jobs[k + 1], enc);
        }
#else
        ok = encode_pair_scalar(jobs[k], jobs[k + 1], enc);  // chunked and paired need a SIMD level
#endif
        if (!ok) return make_status(Code::kBufferTooSmall, "huffman_encode: stream would exceed the capacity");
    }
    uint64_t coded_bits = 0;
    for (unsigned k = 0; k < kStreams; ++k) {
        const size_t w = jobs[k].written;
        if (w > UINT32_MAX) return invalid("huffman_encode: stream larger than 4 GiB");
        if (size_t(out_end - out) < w)
            return make_status(Code::kBufferTooSmall, "huffman_encode: stream would exceed the capacity");
        if (k) std::memcpy(out, jobs[k].out, w);
        if (k + 1 < kStreams) {
            if (size_width < 4 && w >> (8 * size_width)) return make_status(Code::kBackendError, "huffman: stream size");
            put_le(sizes + size_width * k, w, size_width);
        }
        coded_bits += jobs[k].nbits;
        out += w;
    }
    // A caller histogram that does not describe src shows up as a different bit count.
    if (exact_counts && coded_bits != total_bits) return invalid("huffman_encode: histogram does not match the data");
    *written = size_t(out - dst);
    return Status::ok();
}

const char* huffman_pairing(const uint32_t* hist, size_t n) {
    uint64_t counts[256];
    uint8_t syms[256];
    const unsigned m = present_symbols(hist, counts, syms);
    if (m < 2) return "single";
    detail::ChunkTable layout;
    PairIndex p;
    if (choose_coding(counts, syms, m, n, &layout, &p)) return "chunks";
    return p.stride == 0 ? "single" : p.ranked ? "rank" : "window";
}

Status huffman_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n) {
    if ((src == nullptr && src_size) || (dst == nullptr && n)) return invalid("huffman_decode: null buffer");
    if (src_size < 1) return corrupt("huffman: empty stream");
    const uint8_t tag = src[0];
    if (tag == kTagEmpty) {
        if (src_size != 1) return corrupt("huffman: empty-plane stream has trailing bytes");
        if (n != 0) return corrupt("huffman: empty-plane stream but symbols expected");
        return Status::ok();
    }
    if (tag == kTagConst) {
        if (src_size != 2) return corrupt("huffman: constant-plane stream must be 2 bytes");
        if (n == 0) return corrupt("huffman: constant-plane stream for an empty plane");
        std::memset(dst, src[1], n);
        return Status::ok();
    }
    if (tag == lanes::kTag) return lanes::decode(src, src_size, dst, n);
    if (tag != kTagHuffman && tag != kTagForward && tag != kTagCompact) return corrupt("huffman: unknown stream tag");
    const bool backward = tag != kTagForward;
    const unsigned streams = backward ? kStreams : kForwardStreams;
    uint8_t syms[256];  // the present symbols, increasing
    uint8_t lens[256];
    unsigned m = 0;
    size_t hsize = 0;
    unsigned size_width = 4;
    if (tag == kTagCompact) {
        size_t map_size = 0;
        m = read_range_map(src + 1, src_size - 1, kMaxLen, lens, syms, &map_size);
        if (m == 0) return corrupt("huffman: bad or truncated symbol range");
        if (m < 2) return corrupt("huffman: fewer than two symbols in a Huffman stream");
        size_width = compact_size_width(n);
        hsize = 1 + map_size + (kStreams - 1) * size_width;
        if (src_size < hsize) return corrupt("huffman: truncated header");
    } else {
        if (src_size < 1 + kSymbolBitmapBytes) return corrupt("huffman: truncated header");
        const uint8_t* bitmap = src + 1;
        m = read_symbol_bitmap(bitmap, syms);
        if (m < 2) return corrupt("huffman: fewer than two symbols in a Huffman stream");
        hsize = header_size(m, streams);
        if (src_size < hsize) return corrupt("huffman: truncated header");
        const uint8_t* nib = bitmap + kSymbolBitmapBytes;
        for (unsigned j = 0; j < m; ++j) {
            const unsigned len = length_nibble(nib, j);
            if (len < 1 || len > kMaxLen) return corrupt("huffman: code length out of range");
            lens[syms[j]] = uint8_t(len);
        }
        if ((m & 1) && (nib[m >> 1] >> 4) != 0) return corrupt("huffman: nonzero pad nibble");
    }
    const uint8_t* size_bytes = src + hsize - (streams - 1) * size_width;

    size_t start[kStreams], size[kStreams];
    size_t off = hsize;
    for (unsigned k = 0; k < streams; ++k) {
        const size_t sz = k + 1 < streams ? size_t(get_le(size_bytes + size_width * k, size_width)) : src_size - off;
        if (sz > src_size - off) return corrupt("huffman: stream sizes exceed the input");
        start[k] = off;
        size[k] = sz;
        off += sz;
    }

    StreamState st[kStreams];
    uint8_t* o = dst;
    for (unsigned k = 0; k < streams; ++k) {
        const size_t len = segment_size(n, k, streams);
        if ((len == 0) != (size[k] == 0)) return corrupt("huffman: stream size inconsistent with symbol count");
        // A stream of len symbols holds between len and len * kMaxLen bits.
        if (size[k] > max_stream_bytes(len) || size[k] < (len + 7) / 8)
            return corrupt("huffman: stream size inconsistent with symbol count");
        st[k] = backward ? StreamState{start[k], 0, o + len, o} : StreamState{start[k], 0, o, o + len};
        o += len;
    }

    uint8_t order[256];
    canonical_order(lens, syms, m, order);
    const bool complete = backward ? decode_streams<true>(src, src_size, lens, order, m, st)
                                   : decode_streams<false>(src, src_size, lens, order, m, st);
    if (!complete) return corrupt("huffman: code lengths do not form a complete code");
    for (unsigned k = 0; k < streams; ++k) {
        // The stream must end in its last byte, and the pad bits must be zero.
        const size_t end = start[k] + size[k];
        const size_t used = st[k].pos + (st[k].bitpos ? 1 : 0);
        if (used != end) return corrupt("huffman: stream does not end at its declared size");
        if (st[k].bitpos && (src[st[k].pos] & (0xffu >> st[k].bitpos)) != 0)
            return corrupt("huffman: nonzero pad bits");
    }
    return Status::ok();
}

}  // namespace kvcore::entropy
