// Byte-plane shuffle, AVX-512 variant (64-byte vectors; F, BW, VBMI).
//
// Mirrors the AVX2 variant with the cross-lane byte permute of VBMI
// (vpermt2b) doing each deinterleave/interleave in one instruction:
// 2-byte elements: split picks even / odd bytes of two vectors; merge picks
// alternately from the low and high plane.
// 4-byte elements: split picks planes 0|1 and 2|3 of 32 elements from two
// vectors, then joins 256-bit halves of two such results with shuffle_i64x2;
// merge splits halves back with shuffle_i64x2 and interleaves with vpermt2b.
// Leftover elements (fewer than a block) go through the scalar reference.
#include "common/arch.h"
#if KVCORE_X86
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/avx512_target.h"
// (after avx512_target.h, which defines KV_AVX512)
#include "common/aligned_buffer.h"
#include "checksum/xxh3_stripes_avx512.h"
#include "shuffle/interleave_avx512.h"
#include "shuffle/shuffle_internal.h"

namespace kvcore::shuffle::detail {
namespace {

KV_AVX512 inline __m512i ld(const uint8_t* p) { return _mm512_loadu_si512(p); }
KV_AVX512 inline void st(uint8_t* p, __m512i v) { _mm512_storeu_si512(p, v); }

// A merge kernel writes its output through a CachedStores or StreamingStores
// (interleave_avx512.h) and hands each 64-byte output vector, in order, to a Feed:
// NoStripeFeed, or a StripeFeed that checksums the output from registers.

// A byte-index vector for vpermt2b: idx[j] = f(j), each in [0, 128).
template <typename F>
KV_AVX512 inline __m512i index_vector(F f) {
    alignas(64) uint8_t idx[64];
    for (int j = 0; j < 64; ++j) idx[j] = static_cast<uint8_t>(f(j));
    return _mm512_load_si512(idx);
}

KV_AVX512 inline __m512i rotl8(__m512i x) {
    return _mm512_or_si512(_mm512_add_epi8(x, x), _mm512_and_si512(_mm512_srli_epi16(x, 7), _mm512_set1_epi8(1)));
}
KV_AVX512 inline __m512i rotr8(__m512i x) {
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(x, 1), _mm512_set1_epi8(0x7f)),
                           _mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi8(static_cast<char>(0x80))));
}
// One VBMI2 funnel shift (see rotr16 in interleave_avx512.h).
KV_AVX512 inline __m512i rotl16(__m512i x) { return _mm512_shldi_epi16(x, x, 1); }

// ---- 1-byte elements ----

// A split kernel hands each plane's 64-byte vectors, in order, to its output:
// CachedPlanes stores them in place; StreamedPlanes (below) as whole cache lines
// around the caches. It returns the elements done; the caller splits the rest.
struct CachedPlanes {
    uint8_t* const* planes;
    KV_AVX512 void put(unsigned p, size_t i, __m512i v) const { st(planes[p] + i, v); }
};

// A split kernel also hands the stripes of its input, in order, to a Feed
// (NoStripeFeed: none): each step, the vectors it loaded from `at` bytes into its
// source. Where that source starts at the hashed input (kFromVectors), they are
// the input's stripes and are fed from registers. Where aligning the planes'
// stores moved the source on (split_hashed_avx512), the stripes are loaded again
// at multiples of 64 bytes from the input's start (`stripes`); the kernel has just
// read those lines, so they are in L1. (Feeding from registers made split_hashed's
// 2-byte kernel 1.08x faster with the rotation and 1.27x without, in cache on
// Zen 4: the second loads were what bound it.)
template <typename FeedType, bool kFromVectors = false>
struct SplitFeed {
    using Feed = FeedType;
    Feed feed;
    const uint8_t* stripes = nullptr;  // the hashed input (read only when !kFromVectors)
    KV_AVX512 StripeAcc load() const { return feed.load(); }
    KV_AVX512 void store(StripeAcc acc) const { feed.store(acc); }
    template <typename... V>
    KV_AVX512 __attribute__((always_inline)) StripeAcc add(StripeAcc acc, [[maybe_unused]] size_t at,
                                                           [[maybe_unused]] V... loaded) {
        if constexpr (kFromVectors)
            ((acc = feed.add(acc, loaded)), ...);
        else if constexpr (!std::is_same_v<Feed, NoStripeFeed>)
            for (size_t k = 0; k < sizeof...(V); ++k) acc = feed.add(acc, ld(stripes + at + 64 * k));
        return acc;
    }
    KV_AVX512 __attribute__((always_inline)) StripeAcc end_block(StripeAcc acc) { return feed.end_block(acc); }
};

template <bool Rot, bool Res, typename Out, typename Fed>
KV_AVX512 size_t split1(const uint8_t* src, size_t n, const PlaneTransform& t, Out& out, Fed& fed_to) {
    Fed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 128;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    StripeAcc acc = feed.load();
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, typename Fed::Feed>(i, n, &full); i < end; i += B) {
            __m512i a = ld(src + i), b = ld(src + i + 64);
            acc = feed.add(acc, i, a, b);
            if (Rot) a = rotl8(a), b = rotl8(b);
            if (Res) {
                const uint8_t* r = res.bytes() + pos;
                a = _mm512_sub_epi8(a, ld(r));
                b = _mm512_sub_epi8(b, ld(r + 64));
                res.advance(pos, step);
            }
            out.put(0, i, a);
            out.put(0, i + 64, b);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    return i;
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX512 void merge1(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 128;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    StripeAcc acc = feed.load();
    size_t pos = 0, i = 0;
    const uint8_t* in = planes[0];
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, Feed>(i, n, &full); i < end; i += B) {
            __m512i a = ld(in + i), b = ld(in + i + 64);
            if (Res) {
                const uint8_t* r = res.bytes() + pos;
                a = _mm512_add_epi8(a, ld(r));
                b = _mm512_add_epi8(b, ld(r + 64));
                res.advance(pos, step);
            }
            if (Rot) a = rotr8(a), b = rotr8(b);
            Stores::put(dst + i, a);
            Stores::put(dst + i + 64, b);
            acc = feed.add(acc, a);
            acc = feed.add(acc, b);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 1, t, dst);
}

// ---- 2-byte elements ----

template <bool Rot, bool Res, typename Out, typename Fed>
KV_AVX512 size_t split2(const uint8_t* src, size_t n, const PlaneTransform& t, Out& out, Fed& fed_to) {
    Fed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    const __m512i even = index_vector([](int j) { return 2 * j; });
    const __m512i odd = index_vector([](int j) { return 2 * j + 1; });
    StripeAcc acc = feed.load();
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, typename Fed::Feed>(i, n, &full); i < end; i += B) {
            const uint8_t* s = src + 2 * i;
            __m512i a = ld(s), b = ld(s + 64);
            acc = feed.add(acc, 2 * i, a, b);
            if (Rot) a = rotl16(a), b = rotl16(b);
            const __m512i lo = _mm512_permutex2var_epi8(a, even, b);
            __m512i hi = _mm512_permutex2var_epi8(a, odd, b);
            if (Res) {
                hi = _mm512_sub_epi8(hi, ld(res.bytes() + pos));
                res.advance(pos, step);
            }
            out.put(0, i, lo);
            out.put(1, i, hi);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    return i;
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX512 void merge2(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    StripeAcc acc = feed.load();
    const Interleave2 interleave;
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, Feed>(i, n, &full); i < end; i += B) {
            const __m512i lo = ld(planes[0] + i);
            __m512i hi = ld(planes[1] + i);
            if (Res) {
                hi = _mm512_add_epi8(hi, ld(res.bytes() + pos));
                res.advance(pos, step);
            }
            __m512i a, b;
            interleave.apply<Rot>(lo, hi, &a, &b);
            Stores::put(dst + 2 * i, a);
            Stores::put(dst + 2 * i + 64, b);
            acc = feed.add(acc, a);
            acc = feed.add(acc, b);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 2, t, dst);
}

// ---- 4-byte elements ----

template <bool Rot, bool Res, typename Out, typename Fed>
KV_AVX512 size_t split4(const uint8_t* src, size_t n, const PlaneTransform& t, Out& out, Fed& fed_to) {
    Fed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    // From two vectors (elements 0..31): bytes 0..31 = plane 0 (or 2), bytes 32..63 = plane 1 (or 3).
    const __m512i p01 = index_vector([](int j) { return j < 32 ? 4 * j : 4 * (j - 32) + 1; });
    const __m512i p23 = index_vector([](int j) { return j < 32 ? 4 * j + 2 : 4 * (j - 32) + 3; });
    StripeAcc acc = feed.load();
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 4, typename Fed::Feed>(i, n, &full); i < end; i += B) {
            const uint8_t* s = src + 4 * i;
            __m512i v0 = ld(s), v1 = ld(s + 64), v2 = ld(s + 128), v3 = ld(s + 192);
            acc = feed.add(acc, 4 * i, v0, v1, v2, v3);
            if (Rot) {
                v0 = _mm512_rol_epi32(v0, 1), v1 = _mm512_rol_epi32(v1, 1);
                v2 = _mm512_rol_epi32(v2, 1), v3 = _mm512_rol_epi32(v3, 1);
            }
            const __m512i a01 = _mm512_permutex2var_epi8(v0, p01, v1), a23 = _mm512_permutex2var_epi8(v0, p23, v1);
            const __m512i b01 = _mm512_permutex2var_epi8(v2, p01, v3), b23 = _mm512_permutex2var_epi8(v2, p23, v3);
            // 0x44: low 256 bits of a, then low 256 bits of b; 0xEE: the high halves.
            const __m512i q0 = _mm512_shuffle_i64x2(a01, b01, 0x44);
            const __m512i q1 = _mm512_shuffle_i64x2(a01, b01, 0xEE);
            const __m512i q2 = _mm512_shuffle_i64x2(a23, b23, 0x44);
            __m512i q3 = _mm512_shuffle_i64x2(a23, b23, 0xEE);
            if (Res) {
                q3 = _mm512_sub_epi8(q3, ld(res.bytes() + pos));
                res.advance(pos, step);
            }
            out.put(0, i, q0);
            out.put(1, i, q1);
            out.put(2, i, q2);
            out.put(3, i, q3);
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    return i;
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX512 void merge4(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before acc, which no call may cross in a register)
    const size_t step = res.step(B);
    StripeAcc acc = feed.load();
    // Sources: x = (plane 0 | plane 1) and y = (plane 2 | plane 3) of 32 elements,
    // each plane 32 bytes. Output byte 4e + p of element e (+16 for the second vector).
    const __m512i first = index_vector([](int j) {
        const int e = j / 4, p = j % 4;
        return (p >= 2 ? 64 : 0) + (p & 1) * 32 + e;
    });
    const __m512i second = index_vector([](int j) {
        const int e = j / 4 + 16, p = j % 4;
        return (p >= 2 ? 64 : 0) + (p & 1) * 32 + e;
    });
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 4, Feed>(i, n, &full); i < end; i += B) {
            const __m512i q0 = ld(planes[0] + i), q1 = ld(planes[1] + i), q2 = ld(planes[2] + i);
            __m512i q3 = ld(planes[3] + i);
            if (Res) {
                q3 = _mm512_add_epi8(q3, ld(res.bytes() + pos));
                res.advance(pos, step);
            }
            const __m512i x0 = _mm512_shuffle_i64x2(q0, q1, 0x44), x1 = _mm512_shuffle_i64x2(q0, q1, 0xEE);
            const __m512i y0 = _mm512_shuffle_i64x2(q2, q3, 0x44), y1 = _mm512_shuffle_i64x2(q2, q3, 0xEE);
            __m512i o[4] = {
                _mm512_permutex2var_epi8(x0, first, y0),
                _mm512_permutex2var_epi8(x0, second, y0),
                _mm512_permutex2var_epi8(x1, first, y1),
                _mm512_permutex2var_epi8(x1, second, y1),
            };
            uint8_t* d = dst + 4 * i;
            for (int k = 0; k < 4; ++k) {
                const __m512i v = Rot ? _mm512_ror_epi32(o[k], 1) : o[k];
                Stores::put(d + 64 * k, v);
                acc = feed.add(acc, v);
            }
        }
        if (full) acc = feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 4, t, dst);
}

}  // namespace

namespace {

// Writes each plane's vectors as whole, aligned cache lines with streaming
// stores. A plane that starts `head` bytes (1-63) before a line boundary writes
// each line from the last 64 - head bytes of one vector and the first head bytes
// of the next (one byte permute); its first head bytes, and the bytes after its
// last whole line, are left to the caller (split_streamed_avx512).
struct StreamedPlanes {
    struct Plane {
        uint8_t* base = nullptr;
        size_t head = 0;
        __m512i join{};  // byte j of a line: vector byte head + j, then the next vector's byte j - (64 - head)
        __m512i prev{};
    };
    Plane plane[4];

    KV_AVX512 StreamedPlanes(uint8_t* const* planes, unsigned count) {
        for (unsigned p = 0; p < count; ++p) {
            Plane& q = plane[p];
            q.base = planes[p];
            q.head = (kCacheLine - reinterpret_cast<uintptr_t>(planes[p]) % kCacheLine) % kCacheLine;
            const size_t h = q.head;
            q.join = index_vector([h](int j) { return size_t(j) + h; });  // (>= 64: the next vector)
        }
    }
    // v: bytes [i, i + 64) of plane p, i a multiple of 64, given in order from 0.
    KV_AVX512 void put(unsigned p, size_t i, __m512i v) {
        Plane& q = plane[p];
        if (q.head == 0) {
            _mm512_stream_si512(reinterpret_cast<__m512i*>(q.base + i), v);
            return;
        }
        if (i > 0)
            _mm512_stream_si512(reinterpret_cast<__m512i*>(q.base + i - kCacheLine + q.head),
                                _mm512_permutex2var_epi8(q.prev, q.join, v));
        q.prev = v;
    }
};

// The split kernel for elem_size and t's transform; returns the elements done.
template <typename Out, typename Fed>
KV_AVX512 size_t split_kernel(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, Out& out,
                              Fed& feed) {
    const bool rot = t.rotate, res = t.residual != nullptr;
#define KV_SPLIT(fn)                                                                                        \
    (rot ? (res ? fn<true, true, Out, Fed>(src, n, t, out, feed) : fn<true, false, Out, Fed>(src, n, t, out, feed)) \
         : (res ? fn<false, true, Out, Fed>(src, n, t, out, feed) : fn<false, false, Out, Fed>(src, n, t, out, feed)))
    switch (elem_size) {
        case 1: return KV_SPLIT(split1);
        case 2: return KV_SPLIT(split2);
        case 4: return KV_SPLIT(split4);
        default: return n;
    }
#undef KV_SPLIT
}

}  // namespace

KV_AVX512 void split_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                            uint8_t* const* planes) {
    if (elem_size == 1 && !t.rotate && t.residual == nullptr) {
        std::memcpy(planes[0], src, n);
        return;
    }
    CachedPlanes out{planes};
    SplitFeed<NoStripeFeed> none;
    split_rest(src, n, split_kernel(src, n, elem_size, t, out, none), elem_size, t, planes);
}

KV_AVX512 size_t split_hashed_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                                     uint8_t* const* planes, const uint8_t* input, Xxh3Stripes* hash) {
    // Whole steps only, and no more stripes than the input's (len - 1) / 64 in-order ones.
    const size_t step_bytes = elem_size == 4 ? 256 : 128;
    const size_t steps = std::min<uint64_t>(uint64_t(n) * elem_size / step_bytes, hash->regular() * 64 / step_bytes);
    CachedPlanes out{planes};
    if (src == input) {
        SplitFeed<StripeFeed, true> feed{StripeFeed(hash)};
        return split_kernel(src, steps * step_bytes / elem_size, elem_size, t, out, feed);
    }
    SplitFeed<StripeFeed> feed{StripeFeed(hash), input};
    return split_kernel(src, steps * step_bytes / elem_size, elem_size, t, out, feed);
}

KV_AVX512 void split_streamed_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                                     uint8_t* const* planes) {
    StreamedPlanes out(planes, elem_size);
    SplitFeed<NoStripeFeed> none;
    const size_t done = split_kernel(src, n, elem_size, t, out, none);
    _mm_sfence();
    // A plane's byte i belongs to element i: the bytes no whole line took are
    // among the first 64 elements and those from done - 64 on.
    split_rest(src, std::min<size_t>(n, kCacheLine), 0, elem_size, t, planes);
    split_rest(src, n, done >= kCacheLine ? done - kCacheLine : 0, elem_size, t, planes);
}

namespace {

// The merge kernel for elem_size and t's transform, each output vector handed to feed.
template <typename Feed, typename Stores = CachedStores>
KV_AVX512 void merge_feeding(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                             uint8_t* dst, Feed& feed) {
    const bool rot = t.rotate, res = t.residual != nullptr;
#define KV_MERGE(fn)                                                                  \
    (rot ? (res ? fn<true, true, Feed, Stores>(planes, n, t, dst, feed)               \
                : fn<true, false, Feed, Stores>(planes, n, t, dst, feed))             \
         : (res ? fn<false, true, Feed, Stores>(planes, n, t, dst, feed)              \
                : fn<false, false, Feed, Stores>(planes, n, t, dst, feed)))
    switch (elem_size) {
        case 1:
            if (!rot && !res) std::memcpy(dst, planes[0], n);  // (fed nothing: the hash reads it after)
            else KV_MERGE(merge1);
            break;
        case 2: KV_MERGE(merge2); break;
        case 4: KV_MERGE(merge4); break;
        default: break;
    }
#undef KV_MERGE
}

}  // namespace

KV_AVX512 void merge_avx512(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                            uint8_t* dst) {
    NoStripeFeed none;
    merge_feeding(planes, n, elem_size, t, dst, none);
}

KV_AVX512 void merge_hashed_avx512(const uint8_t* const* planes, size_t n, unsigned elem_size,
                                   const PlaneTransform& t, uint8_t* dst, Xxh3Stripes* hash, bool streaming) {
    StripeFeed feed(hash);
    if (streaming)
        merge_feeding<StripeFeed, StreamingStores>(planes, n, elem_size, t, dst, feed);
    else
        merge_feeding(planes, n, elem_size, t, dst, feed);
}

}  // namespace kvcore::shuffle::detail

#endif  // KVCORE_X86
