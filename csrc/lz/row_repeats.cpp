#include "lz/row_repeats.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/arch.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"
#include "lz/row_join.h"
#include "lz/row_search.h"

namespace kvcore::lz {
namespace {

constexpr size_t kTableHead = 8;  // row_bytes(4) copies(4)

unsigned index_width(size_t distinct) {
    unsigned w = 0;
    while (distinct > 1 && (size_t(1) << w) < distinct) ++w;
    return w;
}

size_t bitmap_bytes(size_t rows) { return (rows + 7) / 8; }
size_t index_bytes(size_t copies, unsigned width) { return (copies * width + 7) / 8; }

// A row's hash; equal rows are then confirmed with same_row. Each 8-byte word
// gets its own multiply (by a multiplier that depends on its position, so that
// rows whose words are permuted differ) and the products are summed: the hash
// is a few multiplies deep whatever the row's length. (A chain of multiplies
// through the row kept split_rows at one row per chain's latency.)
uint64_t row_hash(const uint8_t* p, size_t len) {
    constexpr uint64_t kKey = 0x9E3779B97F4A7C15ull, kStep = 0x6A09E667F3BCC908ull;  // kStep even: odd multipliers
    uint64_t h = len, m = 0xBF58476D1CE4E5B9ull;
    size_t i = 0;
    for (; i + 8 <= len; i += 8, m += kStep) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h += (w ^ kKey) * m;
    }
    if (i < len) {
        uint64_t w = 0;
        std::memcpy(&w, p + i, len - i);
        h += (w ^ kKey) * m;
    }
    return detail::mix_row_hash(h);
}

unsigned popcount8(uint64_t x) {  // SWAR: no popcnt instruction in the baseline ISA
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return static_cast<unsigned>((x * 0x0101010101010101ull) >> 56);
}

size_t count_set_bits(const uint8_t* p, size_t bytes) {
    size_t n = 0, i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        n += popcount8(w);
    }
    uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    return n + popcount8(w);
}

// Calls f with the row length as a compile-time constant where it is one of the
// common short ones (16, 32 or 64 bytes: hashing, comparing and copying a row
// unroll to straight-line code), else with 0 (the length known at run time).
template <typename F>
auto with_row_length(size_t row_bytes, F&& f) {
    switch (row_bytes) {
        case 16: return f(std::integral_constant<size_t, 16>());
        case 32: return f(std::integral_constant<size_t, 32>());
        case 64: return f(std::integral_constant<size_t, 64>());
        default: return f(std::integral_constant<size_t, 0>());
    }
}

// One row: rows are short (tens of bytes), where a call to memcpy costs more than the copy.
inline void copy_row(uint8_t* dst, const uint8_t* src, size_t len) {
    if (len % 16 == 0) {
        for (size_t i = 0; i < len; i += 16) std::memcpy(dst + i, src + i, 16);
    } else {
        std::memcpy(dst, src, len);
    }
}

// Rows of at least 8 bytes compare their last word overlapping the one before it:
// a call to memcmp for the rest would cost more than the row.
bool same_row(const uint8_t* a, const uint8_t* b, size_t len) {
    if (len < 8) return std::memcmp(a, b, len) == 0;
    uint64_t diff = 0;
    for (size_t i = 0; i + 8 < len; i += 8) diff |= load64(a + i) ^ load64(b + i);
    return (diff | (load64(a + len - 8) ^ load64(b + len - 8))) == 0;
}

// w bits at bit position pos of p[0, bytes), LSB first (w <= 32).
uint32_t read_index(const uint8_t* p, size_t bytes, size_t pos, unsigned w) {
    const size_t b = pos >> 3;
    uint64_t v = 0;
    if (b + 8 <= bytes) {
        std::memcpy(&v, p + b, 8);
    } else {
        for (size_t i = 0; i < 8 && b + i < bytes; ++i) v |= uint64_t(p[b + i]) << (8 * i);
    }
    return static_cast<uint32_t>((v >> (pos & 7)) & ((uint64_t(1) << w) - 1));
}

Status bad(const std::string& what) { return corrupt("rows plane: " + what); }

}  // namespace

size_t row_table_bound(size_t rows) { return kTableHead + bitmap_bytes(rows) + 4 * rows; }

namespace detail {
namespace {

// The portable search (lz/row_search.h): open addressing, slot = (distinct row + 1)
// | 32 bits of its hash << 32; 0 is empty. kLen: the row length fixed at compile
// time (with_row_length; 0: row_bytes).
template <size_t kLen>
CopySearchResult search(const CopySearch& c, uint64_t* slot, size_t mask) {
    const size_t len = kLen ? kLen : c.row_bytes, rows = c.rows;
    // (Locals: the row copies go through byte pointers, which could alias c's fields.)
    const uint8_t* const plane = c.plane;
    uint8_t* const distinct = c.distinct;
    uint8_t* const bitmap = c.bitmap;
    uint32_t* const index_of_copy = c.index_of_copy;
    // The table outgrows L1 and its probes are random: each row's hash is computed
    // kAhead rows early and its slot prefetched, so the probe finds it in cache.
    constexpr size_t kAhead = 8;
    uint64_t ahead[kAhead];
    const auto hash_row = [&](size_t r) {
        const uint64_t h = row_hash(plane + r * len, len);
        __builtin_prefetch(slot + (h & mask), 1);
        ahead[r % kAhead] = h;
    };
    for (size_t r = 0; r < rows && r < kAhead; ++r) hash_row(r);
    size_t n_distinct = 0, copies = 0;
    uint64_t bits = 0;  // the bitmap's current 64 rows, stored whole (no read-modify-write per row)
    for (size_t r = 0; r < rows; ++r) {
        const uint8_t* row = plane + r * len;
        const uint64_t h = ahead[r % kAhead];
        if (r + kAhead < rows) hash_row(r + kAhead);
        const uint64_t tag = h >> 32 << 32;
        for (size_t s = h & mask;; s = (s + 1) & mask) {
            const uint64_t e = slot[s];
            if (e == 0) {
                slot[s] = tag | (n_distinct + 1);
                copy_row(distinct + n_distinct * len, row, len);
                ++n_distinct;
                break;
            }
            const size_t index = uint32_t(e) - 1;
            if ((e >> 32 << 32) == tag && same_row(distinct + index * len, row, len)) {
                bits |= uint64_t(1) << (r % 64);
                index_of_copy[copies++] = static_cast<uint32_t>(index);
                break;
            }
        }
        if (r % 64 == 63) {
            put_u64(bitmap + r / 64 * 8, bits);
            bits = 0;
        }
    }
    return CopySearchResult{copies, n_distinct, bits};
}

}  // namespace

CopySearchResult find_copies_scalar(const CopySearch& c) {
    size_t slots = 16;
    while (slots < 2 * c.rows) slots *= 2;
    thread_local std::vector<uint64_t> slot_buf;
    slot_buf.assign(slots, 0);
    uint64_t* slot = slot_buf.data();  // a plain pointer: no TLS lookups in the loop
    return with_row_length(c.row_bytes, [&](auto len) { return search<decltype(len)::value>(c, slot, slots - 1); });
}

}  // namespace detail

size_t split_rows(const uint8_t* plane, size_t n, size_t row_bytes, uint8_t* distinct, uint8_t* table,
                  size_t* table_size) {
    const size_t rows = n / row_bytes;
    thread_local std::vector<uint32_t> index_buf;
    if (index_buf.size() < rows) index_buf.resize(rows);
    uint8_t* bitmap = table + kTableHead;
    detail::CopySearch c;
    c.plane = plane;
    c.rows = rows;
    c.row_bytes = row_bytes;
    c.distinct = distinct;
    c.index_of_copy = index_buf.data();
    c.bitmap = bitmap;
#if KVCORE_X86
    const detail::CopySearchResult found =
        row_bytes >= detail::kAvx2SearchMinRow && (cpu::active_isa() & cpu::kIsaAvx2) ? detail::find_copies_avx2(c)
                                                                                       : detail::find_copies_scalar(c);
#else
    const detail::CopySearchResult found = detail::find_copies_scalar(c);
#endif
    const size_t copies = found.copies;
    uint64_t bits = found.last_bits;
    for (size_t b = rows / 64 * 8; b < bitmap_bytes(rows); ++b, bits >>= 8) bitmap[b] = static_cast<uint8_t>(bits);
    const unsigned w = index_width(found.distinct);
    uint8_t* idx = bitmap + bitmap_bytes(rows);
    size_t o = 0;
    if (w == 8) {  // (an index a byte: planes with at most 256 distinct rows)
        for (size_t k = 0; k < copies; ++k) idx[k] = static_cast<uint8_t>(c.index_of_copy[k]);
        o = copies;
    } else if (w != 0) {
        // 32 bits stored at a time (w <= 32 and fewer than 32 bits pending: they fit 64).
        uint64_t acc = 0;
        unsigned pending = 0;
        for (size_t k = 0; k < copies; ++k) {
            acc |= uint64_t(c.index_of_copy[k]) << pending;
            pending += w;
            if (pending >= 32) {
                put_u32(idx + o, static_cast<uint32_t>(acc));
                o += 4;
                acc >>= 32;
                pending -= 32;
            }
        }
        for (; pending > 0; pending -= std::min(pending, 8u), acc >>= 8) idx[o++] = static_cast<uint8_t>(acc);
    }
    put_u32(table, static_cast<uint32_t>(row_bytes));
    put_u32(table + 4, static_cast<uint32_t>(copies));
    *table_size = kTableHead + bitmap_bytes(rows) + o;
    return copies;
}

Status parse_row_table(const uint8_t* payload, size_t size, size_t n, RowTable* t) {
    if (size < kTableHead) return bad("payload too short for its row table");
    t->row_bytes = get_u32(payload);
    t->copies = get_u32(payload + 4);
    if (t->row_bytes == 0 || n % t->row_bytes) return bad("row length does not divide the block");
    t->rows = n / t->row_bytes;
    if (t->copies > t->rows) return bad("more repeated rows than rows");
    t->distinct = t->rows - t->copies;
    if (t->rows != 0 && t->distinct == 0) return bad("no distinct row to repeat");
    t->width = index_width(t->distinct);
    const size_t bm = bitmap_bytes(t->rows), ib = index_bytes(t->copies, t->width);
    if (size - kTableHead < bm || size - kTableHead - bm < ib) return bad("row table runs past its payload");
    t->bitmap = payload + kTableHead;
    t->indices = t->bitmap + bm;
    t->size = kTableHead + bm + ib;
    if (count_set_bits(t->bitmap, bm) != t->copies) return bad("bitmap does not mark as many rows as it declares");
    if (t->rows % 8 && (t->bitmap[bm - 1] >> (t->rows % 8))) return bad("nonzero bitmap padding");
    const size_t used = t->copies * t->width;
    if (used % 8 && (t->indices[ib - 1] >> (used % 8))) return bad("nonzero index padding");
    return Status::ok();
}

namespace {

// The copies' indices unpacked to one entry each (T: uint8_t when they are at
// most 8 bits wide), plus kIndexPad zeros so that a branch-free loop may read the
// next index before knowing whether the row needs it, and a vector a word's worth
// (eight at a time with AVX-512). Corrupt when an index does not name a distinct row.
template <typename T>
Status unpack_indices(const RowTable& t, std::vector<T>& idx, bool avx512) {
    idx.resize(t.copies + detail::kIndexPad);
    std::fill(idx.begin() + t.copies, idx.end(), T(0));
    if (t.width == 0) {  // one distinct row
        std::fill(idx.begin(), idx.end(), T(0));
        return Status::ok();
    }
    size_t top = 0;
#if KVCORE_X86
    if (t.width != 8 && avx512) {
        top = detail::unpack_indices_avx512(t.indices, index_bytes(t.copies, t.width), t.copies, t.width, idx.data());
    } else
#else
    (void)avx512;  // never set in this build
#endif
    if (t.width == 8) {
        std::memcpy(idx.data(), t.indices, t.copies);
        if (t.copies != 0) top = *std::max_element(idx.begin(), idx.begin() + t.copies);
    } else {
        const size_t ib = index_bytes(t.copies, t.width);
        const uint64_t mask = (uint64_t(1) << t.width) - 1;
        size_t k = 0, pos = 0;
        // 8-byte reads while they stay inside the field, then the careful read.
        for (const size_t fast = ib < 8 ? 0 : ((ib - 8) * 8) / t.width + 1; k < std::min(fast, t.copies);
             ++k, pos += t.width) {
            uint64_t v;
            std::memcpy(&v, t.indices + (pos >> 3), 8);
            const size_t i = (v >> (pos & 7)) & mask;
            idx[k] = static_cast<T>(i);
            top = std::max(top, i);
        }
        for (; k < t.copies; ++k, pos += t.width) {
            const size_t i = read_index(t.indices, ib, pos, t.width);
            idx[k] = static_cast<T>(i);
            top = std::max(top, i);
        }
    }
    if (t.copies != 0 && top >= t.distinct) return bad("a row repeats a row that does not exist");
    return Status::ok();
}

// Bits [64 word, 64 word + 64) of the repeat bitmap (zero past its end).
inline uint64_t bitmap_word(const RowTable& t, size_t word) {
    const size_t bm = bitmap_bytes(t.rows);
    uint64_t bits = 0;
    if (word * 8 + 8 <= bm) {
        std::memcpy(&bits, t.bitmap + word * 8, 8);
    } else {
        for (size_t i = word * 8; i < bm; ++i) bits |= uint64_t(t.bitmap[i]) << (8 * (i - word * 8));
    }
    return bits;
}

// A run of new rows: the next distinct rows in order, one copy.
inline void copy_new_rows(uint8_t* out, const uint8_t* distinct, size_t rb, size_t& r, size_t& next, size_t end) {
    if (end <= r) return;
    std::memcpy(out + r * rb, distinct + next * rb, (end - r) * rb);
    next += end - r;
    r = end;
}

// Rows [0, count) of out, where bit j of bits says row j repeats distinct row
// idx[k] (k counting the repeats) and is otherwise the next new row. Branch-free:
// the choice is a mask, as repeats and new rows interleave unpredictably. RB: the
// row length when fixed at compile time (0: rb). False when a row repeats a
// distinct row that no earlier row brought in (see join_rows).
template <size_t RB, typename T>
inline bool repeat_rows(uint8_t* out, const uint8_t* distinct, size_t rb, uint64_t bits, size_t count, const T* idx,
                        size_t& k, size_t& next) {
    const size_t len = RB ? RB : rb;
    size_t kk = k, nn = next;  // locals: stores through out (uint8_t) may alias the references
    size_t ahead = 0;  // a row's source is always below the distinct rows brought in with it
    for (size_t j = 0; j < count; ++j) {
        const size_t repeat = (bits >> j) & 1;
        const size_t src = nn ^ ((size_t(idx[kk]) ^ nn) & (0 - repeat));
        kk += repeat;
        nn += repeat ^ 1;
        ahead |= size_t(src >= nn);
        copy_row(out + j * len, distinct + src * len, len);
    }
    k = kk;
    next = nn;
    return ahead == 0;
}

Status repeats_ahead() { return bad("a row repeats a distinct row that no earlier row brought in"); }

// Planes where few rows repeat: the new rows between repeats are one copy per run,
// each repeat's index read where it is stored.
Status join_few_repeats(const RowTable& t, const uint8_t* distinct, uint8_t* out) {
    const size_t rb = t.row_bytes, bm = bitmap_bytes(t.rows), ib = index_bytes(t.copies, t.width);
    size_t next = 0, r = 0, pos = 0;  // next distinct row; first row not yet written; index bit position
    for (size_t word = 0; word * 8 < bm; ++word) {
        for (uint64_t bits = bitmap_word(t, word); bits; bits &= bits - 1) {
            const size_t rep = word * 64 + size_t(__builtin_ctzll(bits));
            copy_new_rows(out, distinct, rb, r, next, rep);
            const uint32_t i = t.width ? read_index(t.indices, ib, pos, t.width) : 0;
            pos += t.width;
            if (i >= next) return i >= t.distinct ? bad("a row repeats a row that does not exist") : repeats_ahead();
            copy_row(out + rep * rb, distinct + size_t(i) * rb, rb);
            r = rep + 1;
        }
    }
    copy_new_rows(out, distinct, rb, r, next, t.rows);
    return Status::ok();
}

// Planes where many rows repeat, their indices unpacked to idx: per 64 rows
// either the runs of new rows (few repeats) or a branch-free copy per row (many:
// mispredicted run ends would cost more than the rows), each row's source picked
// 16 rows at a time under AVX-512 (lz/row_join.h). RB: the row length when fixed
// at compile time (0: t.row_bytes).
template <size_t RB, typename T>
Status join_unpacked(const RowTable& t, const T* idx, const uint8_t* distinct, uint8_t* out, bool avx512) {
    const size_t rb = RB ? RB : t.row_bytes, bm = bitmap_bytes(t.rows);
    size_t next = 0, r = 0, k = 0;  // next distinct row; first row not yet written; next index
    for (size_t word = 0; word * 8 < bm; ++word) {
        uint64_t bits = bitmap_word(t, word);
        const size_t first = word * 64, count = std::min<size_t>(64, t.rows - first);
        if (popcount8(bits) * (avx512 ? 8 : 2) < count) {
            for (; bits; bits &= bits - 1) {
                const size_t rep = first + size_t(__builtin_ctzll(bits));
                copy_new_rows(out, distinct, rb, r, next, rep);
                if (idx[k] >= next) return repeats_ahead();
                copy_row(out + rep * rb, distinct + size_t(idx[k++]) * rb, rb);
                r = rep + 1;
            }
            continue;
        }
        copy_new_rows(out, distinct, rb, r, next, first);
#if KVCORE_X86
        if (avx512) {
            uint32_t src[64];
            if (!detail::word_sources_avx512(bits, count, idx + k, next, src)) return repeats_ahead();
            for (size_t j = 0; j < count; ++j) copy_row(out + (first + j) * rb, distinct + size_t(src[j]) * rb, rb);
            const size_t repeats = popcount8(bits);
            k += repeats;
            next += count - repeats;
        } else
#endif
        if (!repeat_rows<RB>(out + first * rb, distinct, rb, bits, count, idx, k, next)) {
            return repeats_ahead();
        }
        r = first + count;
    }
    copy_new_rows(out, distinct, rb, r, next, t.rows);
    return Status::ok();
}

template <typename T>
Status join_many_repeats(const RowTable& t, const uint8_t* distinct, uint8_t* out, bool avx512) {
    thread_local std::vector<T> idx;
    KVCORE_RETURN_IF_ERROR(unpack_indices(t, idx, avx512));
    // (Element rows are row_bytes x element size where the planes share their rows, frame/codec.cpp.)
    return with_row_length(t.row_bytes, [&](auto len) {
        return join_unpacked<decltype(len)::value>(t, idx.data(), distinct, out, avx512);
    });
}

}  // namespace

// A repeat must name a distinct row that an earlier row brought in: the encoder
// only writes such tables, and a decoder that accepted a repeat of the next new
// row (bits of a new row and its repeat swapped) would decode an edited frame to
// the same bytes without an error.
Status join_rows(const RowTable& t, const uint8_t* distinct, uint8_t* out) {
    // The AVX-512 join costs about the same per row at any share of repeats: it takes
    // planes from an eighth of them (the portable one from a quarter, and words from half).
    const bool avx512 = KVCORE_X86 && (cpu::active_isa() & cpu::kIsaAvx512) != 0;
    if (t.copies * (avx512 ? 8 : 4) < t.rows) return join_few_repeats(t, distinct, out);
    return t.width <= 8 ? join_many_repeats<uint8_t>(t, distinct, out, avx512)
                        : join_many_repeats<uint32_t>(t, distinct, out, avx512);
}

}  // namespace kvcore::lz
