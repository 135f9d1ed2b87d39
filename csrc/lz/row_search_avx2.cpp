// find_copies in AVX2. The scalar search branches on whether each row repeats
// an earlier one; where repeats and new rows interleave (a fifth to a half of
// the rows repeating, as in stories260K's KV planes) most of those branches
// mispredict, and a row's search took about twice as long in the codec as in a
// loop that repeats one plane (which trains the predictor). Here a row's first
// look costs no data-dependent branch:
//  - rows are hashed a batch at a time, per 32 bytes one vpmuludq for four
//    words (lo32 * hi32 + w, as XXH3 accumulates), four rows' lanes summed together;
//  - the table is buckets of eight 32-bit slots (the hash's high bits, marked,
//    over the distinct row's index + 1; 0 is empty), one compare each for the
//    tag and for an empty slot;
//  - the first slot whose tag matches names the candidate, compared with the
//    row by vector compares (the row itself where none matches); the outcome
//    selects, without a branch, whether the row is stored as the next distinct
//    row (it is written there anyway) or listed as a copy.
// Only a tag that matches a different row, or a full bucket, takes the slow
// path, which probes slot by slot as a linear table would.
#include "common/arch.h"
#if KVCORE_X86
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/aligned_buffer.h"
#include "common/little_endian.h"
#include "lz/row_search.h"

#define KV_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))

namespace kvcore::lz::detail {
namespace {

constexpr uint64_t kKey = 0x9E3779B97F4A7C15ull, kStep = 0x6A09E667F3BCC908ull;
constexpr size_t kBucket = 8;          // slots a bucket
constexpr uint32_t kUsed = 1u << 31;   // set in every stored slot
constexpr size_t kBatch = 256, kAhead = 8;

KV_AVX2 inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
KV_AVX2 inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Rows of a length fixed at compile time (kLen; 0: the run-time one), so that
// the common short ones unroll.
template <size_t kLen>
struct Rows {
    const uint8_t* plane;
    size_t run_time_len;

    size_t len() const { return kLen ? kLen : run_time_len; }
    const uint8_t* row(size_t r) const { return plane + r * len(); }

    // The row's 32- and 16-byte pieces (xor position keys), in four lanes.
    KV_AVX2 __m256i lanes(const uint8_t* p) const {
        const __m256i step = _mm256_set1_epi64x(int64_t(4 * kStep));
        __m256i acc = _mm256_setzero_si256();
        __m256i key = _mm256_add_epi64(_mm256_set1_epi64x(int64_t(kKey)),
                                       _mm256_set_epi64x(int64_t(3 * kStep), int64_t(2 * kStep), int64_t(kStep), 0));
        size_t i = 0;
        for (; i + 32 <= len(); i += 32, key = _mm256_add_epi64(key, step)) {
            const __m256i w = load32(p + i);
            const __m256i x = _mm256_xor_si256(w, key);
            acc = _mm256_add_epi64(acc, _mm256_add_epi64(_mm256_mul_epu32(x, _mm256_srli_epi64(x, 32)), w));
        }
        if (i + 16 <= len()) {
            const __m128i w = load16(p + i);
            const __m128i x = _mm_xor_si128(w, _mm256_castsi256_si128(key));
            acc = _mm256_add_epi64(acc, _mm256_zextsi128_si256(_mm_add_epi64(_mm_mul_epu32(x, _mm_srli_epi64(x, 32)), w)));
        }
        return acc;
    }

    // The hash from the sum of the lanes and the row's last bytes (fewer than 16).
    KV_AVX2 uint64_t finish(const uint8_t* p, uint64_t h) const {
        h += len();
        for (size_t i = len() & ~size_t(15); i < len(); i += 8) {
            uint64_t w = 0;
            std::memcpy(&w, p + i, std::min<size_t>(8, len() - i));
            h += (w ^ kKey) * (0xBF58476D1CE4E5B9ull + i / 8 * kStep);
        }
        return mix_row_hash(h);
    }

    // Hashes of rows [first, first + count).
    KV_AVX2 void hash(size_t first, size_t count, uint64_t* out) const {
        size_t k = 0;
        for (; k + 4 <= count; k += 4) {
            const uint8_t* p = row(first + k);
            const __m256i a = lanes(p), b = lanes(p + len()), c = lanes(p + 2 * len()), d = lanes(p + 3 * len());
            // Each row's four lanes summed: {a, b, c, d}.
            const __m256i ab = _mm256_add_epi64(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
            const __m256i cd = _mm256_add_epi64(_mm256_unpacklo_epi64(c, d), _mm256_unpackhi_epi64(c, d));
            alignas(32) uint64_t sum[4];
            _mm256_store_si256(reinterpret_cast<__m256i*>(sum),
                               _mm256_add_epi64(_mm256_permute2x128_si256(ab, cd, 0x20),
                                                _mm256_permute2x128_si256(ab, cd, 0x31)));
            for (size_t j = 0; j < 4; ++j) out[k + j] = finish(p + j * len(), sum[j]);
        }
        for (; k < count; ++k) {
            const uint8_t* p = row(first + k);
            const __m256i a = lanes(p);
            const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
            out[k] = finish(p, uint64_t(_mm_cvtsi128_si64(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s)))));
        }
    }

    // Whether rows a and b hold the same bytes: whole vectors, the last one
    // overlapping the one before it (len >= 16).
    KV_AVX2 bool same(const uint8_t* a, const uint8_t* b) const {
        if (len() < 32) {
            const __m128i d = _mm_or_si128(_mm_xor_si128(load16(a), load16(b)),
                                           _mm_xor_si128(load16(a + len() - 16), load16(b + len() - 16)));
            return _mm_testz_si128(d, d);
        }
        __m256i d = _mm256_xor_si256(load32(a + len() - 32), load32(b + len() - 32));
        for (size_t i = 0; i + 32 < len(); i += 32) d = _mm256_or_si256(d, _mm256_xor_si256(load32(a + i), load32(b + i)));
        return _mm256_testz_si256(d, d);
    }

    // dst[0, len) = src[0, len), by the same pieces.
    KV_AVX2 void copy(uint8_t* dst, const uint8_t* src) const {
        if (len() < 32) {
            const __m128i head = load16(src), tail = load16(src + len() - 16);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), head);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + len() - 16), tail);
            return;
        }
        const __m256i tail = load32(src + len() - 32);
        for (size_t i = 0; i + 32 < len(); i += 32) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), load32(src + i));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + len() - 32), tail);
    }
};

struct Table {
    uint32_t* slot;
    uint32_t* sink;  // a slot outside the table
    size_t bucket_mask;  // buckets - 1
    uint32_t index_mask;  // the low bits that hold a distinct row's index + 1

    size_t bucket_of(uint64_t h) const { return (h & bucket_mask) * kBucket; }
    uint32_t tag_of(uint64_t h) const { return (uint32_t(h >> 32) | kUsed) & ~index_mask; }
};

// The slow path: slot by slot from the row's bucket on, as a linear table.
// Returns the distinct row it repeats, or inserts it as distinct row `next`
// and returns next.
template <size_t kLen>
KV_AVX2 size_t probe(Table t, Rows<kLen> rows, const uint8_t* distinct, const uint8_t* row, uint64_t h,
                     size_t next) {
    const uint32_t tag = t.tag_of(h);
    const size_t mask = (t.bucket_mask + 1) * kBucket - 1;
    for (size_t s = t.bucket_of(h);; s = (s + 1) & mask) {
        const uint32_t e = t.slot[s];
        if (e == 0) {
            t.slot[s] = tag | uint32_t(next + 1);
            return next;
        }
        const size_t index = (e & t.index_mask) - 1;
        if ((e & ~t.index_mask) == tag && rows.same(distinct + index * rows.len(), row)) return index;
    }
}

// (Everything the loop reads is copied to locals first: the row copies and slot
// stores go through byte and word pointers, which could alias c's or t's fields
// and made the compiler reload them every row.)
template <size_t kLen>
KV_AVX2 CopySearchResult search(const CopySearch& c, const Table& table) {
    const Table t = table;
    const Rows<kLen> rows{c.plane, c.row_bytes};
    const size_t len = rows.len(), n_rows = c.rows;
    uint8_t* const distinct = c.distinct;
    uint8_t* const bitmap = c.bitmap;
    uint32_t* const index_of_copy = c.index_of_copy;
    uint32_t* const slot = t.slot;
    uint32_t* const sink = t.sink;
    const uint32_t index_mask = t.index_mask;
    const __m256i tag_bits = _mm256_set1_epi32(int(~index_mask));
    alignas(32) uint64_t hash[kBatch + kAhead];
    size_t next = 0, copies = 0;  // next: distinct rows so far
    uint64_t bits = 0;            // the bitmap's current 64 rows, stored whole
    rows.hash(0, std::min(n_rows, kBatch + kAhead), hash);
    for (size_t begin = 0; begin < n_rows; begin += kBatch) {
        const size_t end = std::min(n_rows, begin + kBatch);
        if (begin != 0) {  // the last batch's look-ahead rows, then this batch's others
            std::memcpy(hash, hash + kBatch, kAhead * sizeof(uint64_t));
            if (begin + kAhead < n_rows)
                rows.hash(begin + kAhead, std::min(n_rows, end + kAhead) - begin - kAhead, hash + kAhead);
        }
        for (size_t r = begin; r < end; ++r) {
            if (r + kAhead < n_rows) __builtin_prefetch(slot + t.bucket_of(hash[r + kAhead - begin]), 1);
            const uint8_t* row = rows.row(r);
            const uint64_t h = hash[r - begin];
            uint32_t* bucket = slot + t.bucket_of(h);
            const uint32_t tag = t.tag_of(h);
            const __m256i e = _mm256_load_si256(reinterpret_cast<const __m256i*>(bucket));
            const __m256i tags = _mm256_and_si256(tag_bits, e);
            const unsigned match = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(tags, _mm256_set1_epi32(int(tag))))));
            const unsigned empty = unsigned(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(e, _mm256_setzero_si256()))));
            // The candidate: the first slot whose tag matches, else the row itself.
            const unsigned first = unsigned(__builtin_ctz(match | 0x100));
            const size_t index = (bucket[first & 7] & index_mask) - 1;
            const uint8_t* candidate = match ? distinct + index * len : row;
            const bool same = rows.same(candidate, row);
            rows.copy(distinct + next * len, row);  // kept only where the row is new
            size_t found;
            bool repeat;
            if ((match && !same) || (!match && !empty)) [[unlikely]] {
                found = probe(t, rows, distinct, row, h, next);
                repeat = found != next;
            } else {
                repeat = match != 0;
                found = index;
                // A new row takes the bucket's first empty slot; a repeat writes the sink
                // (a store into the bucket would hold up the next load of it, a whole
                // vector that the store can not forward to, in a run of repeats).
                uint32_t* to = repeat ? sink : bucket + (unsigned(__builtin_ctz(empty | 0x100)) & 7);
                *to = tag | uint32_t(next + 1);
            }
            bits |= uint64_t(repeat) << (r % 64);
            index_of_copy[copies] = static_cast<uint32_t>(found);
            copies += repeat;
            next += !repeat;
            if (r % 64 == 63) {
                put_u64(bitmap + r / 64 * 8, bits);
                bits = 0;
            }
        }
    }
    return CopySearchResult{copies, next, bits};
}

}  // namespace

size_t avx2_search_buckets(size_t rows) {
    // Buckets hold four rows on average when every row is distinct (a full
    // bucket, then the slow path, is rare); 32-bit slots keep the table at a
    // byte a plane byte or less for rows of 16 bytes and more.
    size_t buckets = 1;
    while (buckets * 4 < rows) buckets *= 2;
    return buckets;
}

KV_AVX2 void hash_rows_avx2(const uint8_t* plane, size_t rows, size_t row_bytes, uint64_t* hash) {
    Rows<0>{plane, row_bytes}.hash(0, rows, hash);
}

KV_AVX2 CopySearchResult find_copies_avx2(const CopySearch& c) {
    const size_t buckets = avx2_search_buckets(c.rows);
    unsigned index_bits = 1;
    while ((uint64_t(1) << index_bits) <= c.rows) ++index_bits;
    thread_local AlignedBuffer table;
    table.ensure((buckets + 1) * kBucket * sizeof(uint32_t));  // and a bucket's room for the sink
    std::memset(table.data(), 0, buckets * kBucket * sizeof(uint32_t));
    uint32_t* const slot = reinterpret_cast<uint32_t*>(table.data());
    const Table t{slot, slot + buckets * kBucket, buckets - 1,
                  index_bits >= 31 ? kUsed - 1 : uint32_t((uint64_t(1) << index_bits) - 1)};
    switch (c.row_bytes) {
        case 16: return search<16>(c, t);
        case 32: return search<32>(c, t);
        case 64: return search<64>(c, t);
        default: return search<0>(c, t);
    }
}

}  // namespace kvcore::lz::detail
#endif  // KVCORE_X86
