// Byte-plane shuffle, AVX2 variant (32-byte vectors, 32 or 64 elements per step).
//
// 2-byte elements: split masks/shifts each 16-bit lane into its low and high
// byte, packs two vectors with packus (which interleaves 64-bit quarters) and
// restores element order with one cross-lane permute; merge does the inverse
// with a permute and unpacklo/unpackhi.
// 4-byte elements: split gathers each byte position of 4 elements with one
// in-lane byte shuffle, groups each plane's dwords into one 64-bit quarter with
// a dword permute, then transposes the quarters of 4 vectors (unpack epi64 +
// permute2x128). merge is two rounds of byte/word unpacks and a 128-bit permute.
// The residual of a block is one unaligned load from the ResidualPattern.
// Leftover elements (fewer than a block) go through the scalar reference.
#include "common/arch.h"
#if KVCORE_X86
#include <immintrin.h>

#include <cstring>

#include "shuffle/shuffle_internal.h"

#define KV_AVX2 __attribute__((target("avx2,bmi,bmi2")))

#include "checksum/xxh3_stripes_avx2.h"
#include "shuffle/interleave_avx2.h"

namespace kvcore::shuffle::detail {
namespace {

KV_AVX2 inline __m256i ld(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
KV_AVX2 inline void st(uint8_t* p, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }

// A merge kernel writes its output through the caches, or around them with
// non-temporal stores (interleave_avx2.h).
using avx2::CachedStores;
using avx2::StreamingStores;

// A merge kernel hands each 64-byte stripe of its output (two vectors), in order,
// to a Feed: NoFeed, or a StripeFeedAvx2 that checksums the output from registers.
struct NoFeed {
    KV_AVX2 void load(StripeAccAvx2& acc) const { acc = StripeAccAvx2{}; }
    KV_AVX2 void store(const StripeAccAvx2&) const {}
    static constexpr unsigned kStripesPerBlock = 1u << 30;
    KV_AVX2 void add(StripeAccAvx2&, __m256i, __m256i) {}
    KV_AVX2 void end_block(StripeAccAvx2&) {}
};

// Rotations by one bit within 8-, 16- and 32-bit lanes.
KV_AVX2 inline __m256i rotl8(__m256i x) {
    return _mm256_or_si256(_mm256_add_epi8(x, x), _mm256_and_si256(_mm256_srli_epi16(x, 7), _mm256_set1_epi8(1)));
}
KV_AVX2 inline __m256i rotr8(__m256i x) {
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 1), _mm256_set1_epi8(0x7f)),
                           _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi8(static_cast<char>(0x80))));
}
KV_AVX2 inline __m256i rotl16(__m256i x) { return _mm256_or_si256(_mm256_slli_epi16(x, 1), _mm256_srli_epi16(x, 15)); }
KV_AVX2 inline __m256i rotl32(__m256i x) { return _mm256_or_si256(_mm256_slli_epi32(x, 1), _mm256_srli_epi32(x, 31)); }
KV_AVX2 inline __m256i rotr32(__m256i x) { return _mm256_or_si256(_mm256_srli_epi32(x, 1), _mm256_slli_epi32(x, 31)); }

// ---- 1-byte elements: a copy with the optional rotate and residual ----

template <bool Rot, bool Res>
KV_AVX2 void split1(const uint8_t* src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);
    const size_t step = res.step(B);
    size_t pos = 0, i = 0;
    uint8_t* out = planes[0];
    for (; i + B <= n; i += B) {
        __m256i a = ld(src + i), b = ld(src + i + 32);
        if (Rot) a = rotl8(a), b = rotl8(b);
        if (Res) {
            const uint8_t* r = res.bytes() + pos;
            a = _mm256_sub_epi8(a, ld(r));
            b = _mm256_sub_epi8(b, ld(r + 32));
            res.advance(pos, step);
        }
        st(out + i, a);
        st(out + i + 32, b);
    }
    split_rest(src, n, i, 1, t, planes);
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX2 void merge1(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before the accumulators, which no call may cross in registers)
    const size_t step = res.step(B);
    StripeAccAvx2 acc;
    feed.load(acc);
    size_t pos = 0, i = 0;
    const uint8_t* in = planes[0];
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 1, Feed>(i, n, &full); i < end; i += B) {
            __m256i a = ld(in + i), b = ld(in + i + 32);
            if (Res) {
                const uint8_t* r = res.bytes() + pos;
                a = _mm256_add_epi8(a, ld(r));
                b = _mm256_add_epi8(b, ld(r + 32));
                res.advance(pos, step);
            }
            if (Rot) a = rotr8(a), b = rotr8(b);
            Stores::put(dst + i, a);
            Stores::put(dst + i + 32, b);
            feed.add(acc, a, b);
        }
        if (full) feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 1, t, dst);
}

// ---- 2-byte elements (bf16, fp16) ----

template <bool Rot, bool Res>
KV_AVX2 void split2(const uint8_t* src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);
    const size_t step = res.step(B);
    const __m256i low_mask = _mm256_set1_epi16(0x00ff);
    uint8_t* p0 = planes[0];
    uint8_t* p1 = planes[1];
    size_t pos = 0, i = 0;
    for (; i + B <= n; i += B) {
        const uint8_t* s = src + 2 * i;
        __m256i a = ld(s), b = ld(s + 32), c = ld(s + 64), d = ld(s + 96);
        if (Rot) a = rotl16(a), b = rotl16(b), c = rotl16(c), d = rotl16(d);
        // packus interleaves 64-bit quarters as (a0 b0 a1 b1); 0xD8 restores (a0 a1 b0 b1).
        __m256i lo0 = _mm256_packus_epi16(_mm256_and_si256(a, low_mask), _mm256_and_si256(b, low_mask));
        __m256i hi0 = _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
        __m256i lo1 = _mm256_packus_epi16(_mm256_and_si256(c, low_mask), _mm256_and_si256(d, low_mask));
        __m256i hi1 = _mm256_packus_epi16(_mm256_srli_epi16(c, 8), _mm256_srli_epi16(d, 8));
        lo0 = _mm256_permute4x64_epi64(lo0, 0xD8);
        hi0 = _mm256_permute4x64_epi64(hi0, 0xD8);
        lo1 = _mm256_permute4x64_epi64(lo1, 0xD8);
        hi1 = _mm256_permute4x64_epi64(hi1, 0xD8);
        if (Res) {
            const uint8_t* r = res.bytes() + pos;
            hi0 = _mm256_sub_epi8(hi0, ld(r));
            hi1 = _mm256_sub_epi8(hi1, ld(r + 32));
            res.advance(pos, step);
        }
        st(p0 + i, lo0);
        st(p0 + i + 32, lo1);
        st(p1 + i, hi0);
        st(p1 + i + 32, hi1);
    }
    split_rest(src, n, i, 2, t, planes);
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX2 void merge2(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 64;
    const ResidualPattern res(t, n);  // (may allocate: before the accumulators, which no call may cross in registers)
    const size_t step = res.step(B);
    StripeAccAvx2 acc;
    feed.load(acc);
    const uint8_t* p0 = planes[0];
    const uint8_t* p1 = planes[1];
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, Feed>(i, n, &full); i < end; i += B) {
            __m256i lo0 = ld(p0 + i), lo1 = ld(p0 + i + 32);
            __m256i hi0 = ld(p1 + i), hi1 = ld(p1 + i + 32);
            if (Res) {
                const uint8_t* r = res.bytes() + pos;
                hi0 = _mm256_add_epi8(hi0, ld(r));
                hi1 = _mm256_add_epi8(hi1, ld(r + 32));
                res.advance(pos, step);
            }
            __m256i a, b, c, d;
            avx2::interleave2<Rot>(lo0, hi0, &a, &b);
            avx2::interleave2<Rot>(lo1, hi1, &c, &d);
            uint8_t* o = dst + 2 * i;
            Stores::put(o, a);
            Stores::put(o + 32, b);
            Stores::put(o + 64, c);
            Stores::put(o + 96, d);
            feed.add(acc, a, b);
            feed.add(acc, c, d);
        }
        if (full) feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 2, t, dst);
}

// ---- 4-byte elements (fp32) ----

template <bool Rot, bool Res>
KV_AVX2 void split4(const uint8_t* src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    constexpr size_t B = 32;
    const ResidualPattern res(t, n);
    const size_t step = res.step(B);
    // Per 128-bit lane: byte 0 of elements 0..3, then byte 1, 2, 3.
    const __m256i gather = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // Quarter q of the result then holds plane q of the vector's 8 elements.
    const __m256i quarters = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t pos = 0, i = 0;
    for (; i + B <= n; i += B) {
        const uint8_t* s = src + 4 * i;
        __m256i v[4];
        for (int k = 0; k < 4; ++k) {
            __m256i x = ld(s + 32 * k);
            if (Rot) x = rotl32(x);
            v[k] = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x, gather), quarters);
        }
        const __m256i l01 = _mm256_unpacklo_epi64(v[0], v[1]), h01 = _mm256_unpackhi_epi64(v[0], v[1]);
        const __m256i l23 = _mm256_unpacklo_epi64(v[2], v[3]), h23 = _mm256_unpackhi_epi64(v[2], v[3]);
        const __m256i q0 = _mm256_permute2x128_si256(l01, l23, 0x20);
        const __m256i q1 = _mm256_permute2x128_si256(h01, h23, 0x20);
        const __m256i q2 = _mm256_permute2x128_si256(l01, l23, 0x31);
        __m256i q3 = _mm256_permute2x128_si256(h01, h23, 0x31);
        if (Res) {
            q3 = _mm256_sub_epi8(q3, ld(res.bytes() + pos));
            res.advance(pos, step);
        }
        st(planes[0] + i, q0);
        st(planes[1] + i, q1);
        st(planes[2] + i, q2);
        st(planes[3] + i, q3);
    }
    split_rest(src, n, i, 4, t, planes);
}

template <bool Rot, bool Res, typename Feed, typename Stores>
KV_AVX2 void merge4(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst, Feed& fed_to) {
    Feed feed = fed_to;  // locals stay in registers
    constexpr size_t B = 32;
    const ResidualPattern res(t, n);  // (may allocate: before the accumulators, which no call may cross in registers)
    const size_t step = res.step(B);
    StripeAccAvx2 acc;
    feed.load(acc);
    size_t pos = 0, i = 0;
    for (bool full = true; full;) {
        for (const size_t end = inner_end<B, 2, Feed>(i, n, &full); i < end; i += B) {
            const __m256i q0 = ld(planes[0] + i), q1 = ld(planes[1] + i), q2 = ld(planes[2] + i);
            __m256i q3 = ld(planes[3] + i);
            if (Res) {
                q3 = _mm256_add_epi8(q3, ld(res.bytes() + pos));
                res.advance(pos, step);
            }
            // Byte pairs (b0 b1) and (b2 b3): lane 0 holds elements 0..7 / 8..15, lane 1 16..23 / 24..31.
            const __m256i a_lo = _mm256_unpacklo_epi8(q0, q1), a_hi = _mm256_unpackhi_epi8(q0, q1);
            const __m256i b_lo = _mm256_unpacklo_epi8(q2, q3), b_hi = _mm256_unpackhi_epi8(q2, q3);
            // Whole elements: x0 = (0..3 | 16..19), x1 = (4..7 | 20..23), x2 = (8..11 | 24..27), x3 = (12..15 | 28..31).
            const __m256i x0 = _mm256_unpacklo_epi16(a_lo, b_lo), x1 = _mm256_unpackhi_epi16(a_lo, b_lo);
            const __m256i x2 = _mm256_unpacklo_epi16(a_hi, b_hi), x3 = _mm256_unpackhi_epi16(a_hi, b_hi);
            __m256i o[4] = {
                _mm256_permute2x128_si256(x0, x1, 0x20),
                _mm256_permute2x128_si256(x2, x3, 0x20),
                _mm256_permute2x128_si256(x0, x1, 0x31),
                _mm256_permute2x128_si256(x2, x3, 0x31),
            };
            uint8_t* d = dst + 4 * i;
            for (int k = 0; k < 4; ++k) {
                if (Rot) o[k] = rotr32(o[k]);
                Stores::put(d + 32 * k, o[k]);
            }
            feed.add(acc, o[0], o[1]);
            feed.add(acc, o[2], o[3]);
        }
        if (full) feed.end_block(acc);
    }
    feed.store(acc);
    fed_to = feed;
    merge_rest(planes, n, i, 4, t, dst);
}


}  // namespace

KV_AVX2 void split_avx2(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                        uint8_t* const* planes) {
    const bool rot = t.rotate, res = t.residual != nullptr;
#define KV_SPLIT(fn)                                            \
    (rot ? (res ? fn<true, true>(src, n, t, planes) : fn<true, false>(src, n, t, planes)) \
         : (res ? fn<false, true>(src, n, t, planes) : fn<false, false>(src, n, t, planes)))
    switch (elem_size) {
        case 1:
            if (!rot && !res) std::memcpy(planes[0], src, n);
            else KV_SPLIT(split1);
            break;
        case 2: KV_SPLIT(split2); break;
        case 4: KV_SPLIT(split4); break;
        default: break;
    }
#undef KV_SPLIT
}

namespace {

// The merge kernel for elem_size and t's transform, each output stripe handed to feed.
template <typename Feed, typename Stores = CachedStores>
KV_AVX2 void merge_feeding(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
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

KV_AVX2 void merge_avx2(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                        uint8_t* dst) {
    NoFeed none;
    merge_feeding(planes, n, elem_size, t, dst, none);
}

KV_AVX2 void merge_hashed_avx2(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                               uint8_t* dst, Xxh3Stripes* hash, bool streaming) {
    StripeFeedAvx2 feed(hash);
    if (streaming)
        merge_feeding<StripeFeedAvx2, StreamingStores>(planes, n, elem_size, t, dst, feed);
    else
        merge_feeding(planes, n, elem_size, t, dst, feed);
}

}  // namespace kvcore::shuffle::detail

#endif  // KVCORE_X86
