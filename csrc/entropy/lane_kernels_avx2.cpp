// The lane coder's passes, AVX2 (see lane_kernels.h): sixteen lanes a register
// in 16-bit words, so a step is eight registers, taken two at a time. The
// decoder first, then the encoder's rank and lay-out passes (the same tricks,
// run backwards, and a table of gathering shuffles in place of the refills').
//
// AVX2 has no 16-bit variable shift, no byte permute over 128 entries and no
// expand, and byte shuffles are few a cycle (one on many Intel cores), so:
// - a pair of registers keeps its lanes' bit counts as 32 bytes, in the order
//   that packing the pair's words to bytes gives, where the byte work is done;
// - shifts are multiplies by powers of two (looked up by count or by length);
// - the code is canonical, so a code's length grows with its 7-bit index:
//   the length is a count of thresholds passed (byte compares), and the code's
//   rank among all codes is its value (index >> (7 - length), a multiply high)
//   plus a per-length offset;
// - the symbol is looked up by rank, in 16 entries with one shuffle when there
//   are at most 16 codes, else in a tree of shuffles chosen among by blends;
// - a refill shuffles the next stream bytes into the lanes that take one with a
//   control from a table of the 256 masks of eight lanes.
// A lane holds at least one bit after every step, so a refill's multiplier
// (2^(8 - bits), at most 128) fits a byte; the first step, where lanes hold
// none, is decoded by the portable pass.
#include "common/arch.h"
#if KVCORE_X86
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "entropy/lane_kernels.h"

#define KV_AVX2 __attribute__((target("avx2,bmi,popcnt")))
#define KV_AVX2_INLINE inline __attribute__((target("avx2,bmi,popcnt"), always_inline))

namespace kvcore::entropy::lanes::detail {
namespace {

constexpr unsigned kVectors = kLanes / 16;
constexpr unsigned kThresholds = kMaxLen - 1;

// kRefill.control[m]: the shuffle control that puts, for the eight lanes of mask
// m, the k-th stream byte in the low byte of the k-th lane of m and zero elsewhere.
struct RefillTable {
    alignas(16) uint8_t control[256][16]{};
    constexpr RefillTable() {
        for (unsigned m = 0; m < 256; ++m)
            for (unsigned i = 0, k = 0; i < 8; ++i) {
                control[m][2 * i] = (m >> i) & 1 ? uint8_t(k++) : 0x80;
                control[m][2 * i + 1] = 0x80;
            }
    }
};
constexpr RefillTable kRefill;

// The decode tables by rank. A lane's count c of thresholds its index passes
// gives its length min_len + c; length[6 - c], power[6 - c] = 2^length and
// delta[6 - c] = the rank of that length's first code less its value.
struct RankTables {
    alignas(16) uint8_t sym[kCodeSpace]{};  // by rank
    alignas(16) uint8_t length[16]{};
    alignas(16) uint8_t power[16]{};
    alignas(16) uint8_t delta[16]{};
    uint8_t threshold[kThresholds];  // the first index of each length past the shortest, less one (127: none)
    unsigned thresholds = 0;         // those below 127: the longest length less the shortest
    unsigned codes = 0;
};

// False when t is not a canonical code (lengths not growing with the index).
bool rank_tables(const DecodeTables& t, RankTables* r) {
    const unsigned min_len = t.len[0];
    if (min_len == 0) return false;
    for (unsigned c = 0; c < kThresholds; ++c) r->threshold[c] = kCodeSpace - 1;
    for (unsigned c = 0; min_len + c <= kMaxLen; ++c) {
        r->length[kThresholds - c] = uint8_t(min_len + c);
        r->power[kThresholds - c] = uint8_t(1u << (min_len + c));
    }
    unsigned rank = 0, prev = 0;
    for (unsigned idx = 0; idx < kCodeSpace; ++rank) {
        const unsigned len = t.len[idx], span = kCodeSpace >> len;
        if (len < min_len || len < prev || len > kMaxLen || idx % span) return false;
        if (len != prev) {
            for (unsigned c = prev ? prev - min_len : 0; c < len - min_len; ++c) r->threshold[c] = uint8_t(idx - 1);
            r->delta[kThresholds - (len - min_len)] = uint8_t(rank - idx / span);
            prev = len;
        }
        r->sym[rank] = t.sym[idx];
        idx += span;
    }
    r->codes = rank;
    r->thresholds = prev - min_len;
    return true;
}

// A byte table of 16 kParts entries as 16-entry shuffle tables (each in both halves).
template <unsigned kParts>
struct ByteTable {
    __m256i part[kParts];
};

template <unsigned kParts>
KV_AVX2_INLINE ByteTable<kParts> byte_table(const uint8_t* entries) {
    ByteTable<kParts> t;
    for (unsigned j = 0; j < kParts; ++j)
        t.part[j] = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(entries + 16 * j)));
    return t;
}

// The entries of bytes x (< 16 kParts): shuffles by the low four bits, chosen
// among by the bits above with blends (each bit moved to the bytes' top).
template <unsigned kParts>
KV_AVX2_INLINE __m256i lookup(const ByteTable<kParts>& t, __m256i x) {
    static_assert(kParts == 1 || kParts == 2 || kParts == 4 || kParts == 8 || kParts == 16);
    // (a shuffle zeroes bytes whose index has its top bit set)
    const __m256i low = kParts == 16 ? _mm256_and_si256(x, _mm256_set1_epi8(15)) : x;
    __m256i r[kParts];
    for (unsigned j = 0; j < kParts; ++j) r[j] = _mm256_shuffle_epi8(t.part[j], low);
    unsigned shift = 3;
    for (unsigned n = kParts; n > 1; n /= 2, --shift) {
        const __m256i select = _mm256_slli_epi16(x, int(shift));
        for (unsigned j = 0; j < n / 2; ++j) r[j] = _mm256_blendv_epi8(r[2 * j], r[2 * j + 1], select);
    }
    return r[0];
}

// f(the table parts for `codes` byte entries: 1, 2, or 8 for up to 128; 64 take
// 8, being rare), as an integral_constant.
template <typename F>
inline auto with_table_parts(unsigned codes, F f) {
    if (codes <= 16) return f(std::integral_constant<unsigned, 1>{});
    if (codes <= 32) return f(std::integral_constant<unsigned, 2>{});
    return f(std::integral_constant<unsigned, 8>{});
}

// kFill[b] = 2^(8 - b): where a byte goes into a window holding b (1..7) bits.
alignas(16) constexpr uint8_t kFill[16] = {0, 128, 64, 32, 16, 8, 4, 2, 1};

// Lane of byte j of a pair's bit counts (see PairStep), from the pair's first lane.
constexpr unsigned pair_lane(unsigned j) { return (j & 7) + (j & 8) * 2 + (j & 16) / 2; }

// The refill of one register: the stream bytes at lo for its lanes 0-7 (mask
// m_lo) and at hi for lanes 8-15 (m_hi), each moved up by its multiplier.
KV_AVX2_INLINE __m256i refill(__m256i w, __m256i multiplier, const uint8_t* lo, const uint8_t* hi, unsigned m_lo,
                              unsigned m_hi) {
    const __m256i bytes = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo))),
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi)), 1);
    const __m256i control = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kRefill.control[m_lo]))),
        _mm_load_si128(reinterpret_cast<const __m128i*>(kRefill.control[m_hi])), 1);
    return _mm256_or_si256(w, _mm256_mullo_epi16(_mm256_shuffle_epi8(bytes, control), multiplier));
}

// Two registers' lanes (32: registers a and b) through one step: their refills
// from p (moved past them) and their symbols, in lane order. Their bit counts are
// bytes in pack order: a's lanes 0-7, b's 0-7, a's 8-15, b's 8-15.
template <unsigned kParts, unsigned kPassed>
struct PairStep {
    static_assert(kPassed <= kThresholds);
    ByteTable<kParts> sym;
    __m256i length, power, delta, fill, threshold[kThresholds];

    KV_AVX2 explicit PairStep(const RankTables& r) : sym(byte_table<kParts>(r.sym)) {
        length = broadcast(r.length);
        power = broadcast(r.power);
        delta = broadcast(r.delta);
        fill = broadcast(kFill);
        for (unsigned c = 0; c < kThresholds; ++c) threshold[c] = _mm256_set1_epi8(char(r.threshold[c]));
    }

    KV_AVX2 static __m256i broadcast(const uint8_t* table) {
        return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(table)));
    }

    KV_AVX2_INLINE __m256i operator()(__m256i& wa, __m256i& wb, __m256i& bits, const uint8_t*& p) const {
        const __m256i zero = _mm256_setzero_si256(), eight = _mm256_set1_epi8(8);
        const __m256i b = bits;
        const __m256i take = _mm256_cmpgt_epi8(eight, b);
        const unsigned m = unsigned(_mm256_movemask_epi8(take));
        const unsigned a0 = m & 0xff, b0 = (m >> 8) & 0xff, a1 = (m >> 16) & 0xff, b1 = m >> 24;
        const uint8_t* pa1 = p + _mm_popcnt_u32(a0);
        const uint8_t* pb0 = pa1 + _mm_popcnt_u32(a1);
        const uint8_t* pb1 = pb0 + _mm_popcnt_u32(b0);
        const __m256i f = _mm256_shuffle_epi8(fill, b);
        wa = refill(wa, _mm256_unpacklo_epi8(f, zero), p, pa1, a0, a1);
        wb = refill(wb, _mm256_unpackhi_epi8(f, zero), pb0, pb1, b0, b1);
        p = pb1 + _mm_popcnt_u32(b1);
        // Both registers' 7-bit indices as bytes, in pack order.
        const __m256i idx =
            _mm256_packus_epi16(_mm256_srli_epi16(wa, 16 - kMaxLen), _mm256_srli_epi16(wb, 16 - kMaxLen));
        // 6 less the thresholds passed, of the first kPassed (the others are 127).
        __m256i left = _mm256_set1_epi8(kThresholds);
        for (unsigned j = 0; j + 1 < kPassed; j += 2)
            left = _mm256_add_epi8(left, _mm256_add_epi8(_mm256_cmpgt_epi8(idx, threshold[j]),
                                                         _mm256_cmpgt_epi8(idx, threshold[j + 1])));
        if (kPassed % 2) left = _mm256_add_epi8(left, _mm256_cmpgt_epi8(idx, threshold[kPassed - 1]));
        const __m256i pw = _mm256_shuffle_epi8(power, left);
        const __m256i pa = _mm256_unpacklo_epi8(pw, zero), pb = _mm256_unpackhi_epi8(pw, zero);
        // The codes' values (the index's top `length` bits), then their ranks.
        const __m256i top7 = _mm256_set1_epi16(int16_t(0xfe00));
        const __m256i code = _mm256_packus_epi16(_mm256_mulhi_epu16(_mm256_and_si256(wa, top7), pa),
                                                 _mm256_mulhi_epu16(_mm256_and_si256(wb, top7), pb));
        const __m256i rank = _mm256_add_epi8(code, _mm256_shuffle_epi8(delta, left));
        wa = _mm256_mullo_epi16(wa, pa);
        wb = _mm256_mullo_epi16(wb, pb);
        bits = _mm256_sub_epi8(_mm256_add_epi8(b, _mm256_and_si256(take, eight)), _mm256_shuffle_epi8(length, left));
        return _mm256_permute4x64_epi64(lookup(sym, rank), 0xd8);  // a's 16, then b's 16
    }
};

// The hits word (Escapes) of 64 output bytes lo, hi: where they hold the placeholder.
KV_AVX2_INLINE uint64_t escape_hits(__m256i lo, __m256i hi, __m256i mark) {
    return uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, mark))) |
           uint64_t(uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, mark)))) << 32;
}

template <unsigned kParts, unsigned kPassed>
KV_AVX2 size_t decode_steps(const uint8_t** pos, const uint8_t* end, const RankTables& r, LaneState& s,
                            size_t step, size_t whole, uint8_t* dst, const Escapes& esc) {
    const PairStep<kParts, kPassed> pair(r);
    alignas(32) uint8_t bits[kLanes];  // in pack order
    for (unsigned l = 0; l < kLanes; ++l) bits[l] = uint8_t(s.bits[(l & ~31u) + pair_lane(l & 31)]);
    __m256i w[kVectors], b[kVectors / 2];
    for (unsigned v = 0; v < kVectors; ++v) w[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.window + 16 * v));
    for (unsigned q = 0; q < kVectors / 2; ++q) b[q] = _mm256_load_si256(reinterpret_cast<const __m256i*>(bits + 32 * q));
    const __m256i mark = _mm256_set1_epi8(char(esc.placeholder));
    const uint8_t* p = *pos;
    // Each half register reads 8 bytes from where its lanes' bytes start and takes
    // at most 8: a step reads below p + kLanes.
    for (; step < whole && size_t(end - p) >= kLanes; ++step) {
        uint8_t* out = dst + step * kLanes;
#pragma GCC unroll 2
        for (unsigned v = 0; v < kVectors; v += 4) {  // 64 symbols
            const __m256i x0 = pair(w[v], w[v + 1], b[v / 2], p);
            const __m256i x1 = pair(w[v + 2], w[v + 3], b[v / 2 + 1], p);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * v), x0);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * v + 32), x1);
            if (esc.count) esc.hits[(out - dst) / 64 + v / 4] = escape_hits(x0, x1, mark);
        }
    }
    for (unsigned v = 0; v < kVectors; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(s.window + 16 * v), w[v]);
    for (unsigned q = 0; q < kVectors / 2; ++q) _mm256_store_si256(reinterpret_cast<__m256i*>(bits + 32 * q), b[q]);
    for (unsigned l = 0; l < kLanes; ++l) s.bits[(l & ~31u) + pair_lane(l & 31)] = bits[l];
    *pos = p;
    return step;
}

// Marks the placeholders of dst[0, 64 * words) in esc.hits.
KV_AVX2 void mark_escapes(const uint8_t* dst, unsigned words, const Escapes& esc) {
    const __m256i mark = _mm256_set1_epi8(char(esc.placeholder));
    for (unsigned k = 0; k < words; ++k)
        esc.hits[k] = escape_hits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + 64 * k)),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(dst + 64 * k + 32)), mark);
}

// The kernel for r's thresholds: 4, 5 or 6 (lengths 2 to 7 take 5; each costs
// about 3.5% of the decode on kvdata, Zen 4).
template <unsigned kParts>
KV_AVX2 size_t decode_parts(const uint8_t** pos, const uint8_t* end, const RankTables& r, LaneState& s, size_t step,
                            size_t n, uint8_t* dst, const Escapes& esc) {
    if (r.thresholds <= 4) return decode_steps<kParts, 4>(pos, end, r, s, step, n / kLanes, dst, esc);
    if (r.thresholds == 5) return decode_steps<kParts, 5>(pos, end, r, s, step, n / kLanes, dst, esc);
    return decode_steps<kParts, 6>(pos, end, r, s, step, n / kLanes, dst, esc);
}

}  // namespace

KV_AVX2 size_t decode_steps_avx2(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                                 size_t step, size_t n, uint8_t* dst, const Escapes& esc) {
    if (step == 0 && n >= kLanes) {  // (lanes start empty: see the top)
        LaneState first = s;  // s untouched when the stream ends within the step
        if (!decode_steps_portable(pos, end, t, first, 0, kLanes, dst)) return 0;
        s = first;
        if (esc.count) mark_escapes(dst, kLanes / 64, esc);
        step = 1;
    }
    RankTables r;
    if (step == 0 || !rank_tables(t, &r)) return step;
    return with_table_parts(r.codes, [&](auto parts) {
        return decode_parts<decltype(parts)::value>(pos, end, r, s, step, n, dst, esc);
    });
}


// ---- the encoder's passes ----

namespace {

// kGather.control[m]: the shuffle control that puts the low bytes of the words of
// the lanes in m (eight lanes) at the top of 16 bytes, in lane order.
struct GatherTable {
    alignas(16) uint8_t control[256][16]{};
    constexpr GatherTable() {
        for (unsigned m = 0; m < 256; ++m) {
            unsigned k = 16 - unsigned(__builtin_popcount(m));
            for (unsigned i = 0; i < 16; ++i) control[m][i] = 0x80;
            for (unsigned i = 0; i < 8; ++i)
                if ((m >> i) & 1) control[m][k++] = uint8_t(2 * i);
        }
    }
};
constexpr GatherTable kGather;

template <unsigned kParts>
KV_AVX2 void rank_pass(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                       uint8_t** escaped) {
    const ByteTable<16> rank = byte_table<16>(t.rank);
    const ByteTable<kParts> len = byte_table<kParts>(t.len);
    // No escape code: an index no rank has.
    const __m256i esc = _mm256_set1_epi8(char(t.esc_rank < kCodeSpace ? t.esc_rank : 0xff));
    __m256i sum[kLanes / 32];
    for (auto& x : sum) x = _mm256_setzero_si256();
    uint8_t* x = *escaped;
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (unsigned u = 0; u < kLanes / 32; ++u) {
            const uint8_t* in = src + i + 32 * u;
            const __m256i r = lookup(rank, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ranks + i + 32 * u), r);
            sum[u] = _mm256_add_epi8(sum[u], lookup(len, r));
            for (unsigned hits = unsigned(_mm256_movemask_epi8(_mm256_cmpeq_epi8(r, esc))); hits; hits &= hits - 1)
                *x++ = in[__builtin_ctz(hits)];
        }
    for (unsigned u = 0; u < kLanes / 32; ++u) _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane_bits + 32 * u), sum[u]);
    for (; i < n; ++i) {  // the last, partial step
        const uint8_t r = t.rank[src[i]];
        ranks[i] = r;
        lane_bits[i % kLanes] = uint8_t(lane_bits[i % kLanes] + t.len[r]);
        *x = src[i];
        x += r == t.esc_rank;
    }
    *escaped = x;
}

// Writes below q the low bytes of x's words whose lanes are in m_lo (lanes 0-7)
// and m_hi (8-15), in lane order: each half's 16 bytes end at q, then q moves
// down past the bytes it keeps.
KV_AVX2_INLINE void put_taken(__m256i x, unsigned m_lo, unsigned m_hi, uint8_t*& q) {
    const __m256i control = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kGather.control[m_lo]))),
        _mm_load_si128(reinterpret_cast<const __m128i*>(kGather.control[m_hi])), 1);
    const __m256i packed = _mm256_shuffle_epi8(x, control);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q - 16), _mm256_extracti128_si256(packed, 1));
    q -= _mm_popcnt_u32(m_hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q - 16), _mm256_castsi256_si128(packed));
    q -= _mm_popcnt_u32(m_lo);
}

// 32 ranks in pack order (see PairStep).
KV_AVX2_INLINE __m256i ranks_in_pack_order(const uint8_t* at) {
    return _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)), 0xd8);
}

// lay_steps_portable's arithmetic on a pair of registers (32 lanes): shifts are
// multiplies by powers of two, looked up by rank (2^(8 - len), taken as the high
// byte of a word: 2^(16 - len)) or by bit count (2^(-bits mod 8)); the pair's
// ranks, lengths and bit counts are bytes in pack order (see PairStep), so that
// unpacking them gives the two registers' words in lane order.
template <unsigned kParts>
KV_AVX2 void lay_out_whole(const uint8_t* ranks, size_t whole, const EncodeTables& t, LayState& s, uint8_t*& q) {
    alignas(16) uint8_t raise[kCodeSpace];  // 2^(8 - len) by rank
    for (unsigned r = 0; r < kCodeSpace; ++r) raise[r] = t.len[r] ? uint8_t(1u << (8 - t.len[r])) : 0;
    const ByteTable<kParts> len = byte_table<kParts>(t.len), code = byte_table<kParts>(t.code),
                            shift = byte_table<kParts>(raise);
    alignas(16) static constexpr uint8_t kPowers[16] = {1, 2, 4, 8, 16, 32, 64, 128};
    const __m256i powers = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kPowers)));
    const __m256i zero = _mm256_setzero_si256(), seven = _mm256_set1_epi8(7), eight = _mm256_set1_epi8(8);
    alignas(32) uint8_t bit[kLanes];
    for (unsigned l = 0; l < kLanes; ++l) bit[l] = s.bit[(l & ~31u) + pair_lane(l & 31)];
    for (size_t step = whole; step-- > 0;) {
        const size_t base = step * kLanes;
        for (unsigned v = kLanes / 32; v-- > 0;) {  // pairs, the last first
            const __m256i rank = ranks_in_pack_order(ranks + base + 32 * v);
            const __m256i lens = lookup(len, rank), sh = lookup(shift, rank), codes = lookup(code, rank);
            const __m256i prev = step ? lookup(len, ranks_in_pack_order(ranks + base - kLanes + 32 * v)) : eight;
            __m256i* wp = reinterpret_cast<__m256i*>(s.window + 32 * v);
            const __m256i sa = _mm256_unpacklo_epi8(zero, sh), sb = _mm256_unpackhi_epi8(zero, sh);
            const __m256i wa = _mm256_or_si256(_mm256_mulhi_epu16(_mm256_loadu_si256(wp), sa),
                                               _mm256_mullo_epi16(_mm256_unpacklo_epi8(codes, zero), sa));
            const __m256i wb = _mm256_or_si256(_mm256_mulhi_epu16(_mm256_loadu_si256(wp + 1), sb),
                                               _mm256_mullo_epi16(_mm256_unpackhi_epi8(codes, zero), sb));
            _mm256_storeu_si256(wp, wa);
            _mm256_storeu_si256(wp + 1, wb);
            __m256i* bp = reinterpret_cast<__m256i*>(bit + 32 * v);
            const __m256i b = _mm256_sub_epi8(_mm256_load_si256(bp), lens);
            _mm256_store_si256(bp, b);
            const __m256i take = _mm256_cmpgt_epi8(prev, _mm256_and_si256(_mm256_add_epi8(b, seven), seven));
            const __m256i up = _mm256_shuffle_epi8(powers, _mm256_and_si256(_mm256_sub_epi8(zero, b), seven));
            const __m256i ba = _mm256_srli_epi16(_mm256_mullo_epi16(wa, _mm256_unpacklo_epi8(up, zero)), 8);
            const __m256i bb = _mm256_srli_epi16(_mm256_mullo_epi16(wb, _mm256_unpackhi_epi8(up, zero)), 8);
            // Bits 0-7: a's lanes 0-7, 8-15: b's 0-7, 16-23: a's 8-15, 24-31: b's 8-15.
            const unsigned m = unsigned(_mm256_movemask_epi8(take));
            put_taken(bb, (m >> 8) & 0xff, m >> 24, q);
            put_taken(ba, m & 0xff, (m >> 16) & 0xff, q);
        }
    }
}

}  // namespace

KV_AVX2 void rank_pass_avx2(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                            uint8_t** escaped) {
    with_table_parts(t.codes, [&](auto parts) {
        rank_pass<decltype(parts)::value>(src, n, t, ranks, lane_bits, escaped);
    });
}

KV_AVX2 void lay_out_avx2(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                          uint8_t** stream) {
    LayState s{};
    std::copy(lane_bits, lane_bits + kLanes, s.bit);
    const size_t steps = (n + kLanes - 1) / kLanes, whole = n / kLanes;
    uint8_t* q = *stream;
    lay_steps_portable(ranks, n, t, s, whole, steps, &q);  // a partial last step
    with_table_parts(t.codes, [&](auto parts) {
        lay_out_whole<decltype(parts)::value>(ranks, whole, t, s, q);
    });
    *stream = q;
}

}  // namespace kvcore::entropy::lanes::detail
#endif  // KVCORE_X86
