// Byte-plane shuffle: run-time dispatch and the portable scalar reference.
//
// The scalar code is the definition every SIMD variant must match byte for
// byte: element i is read little endian, rotated left by one bit (optional),
// byte p goes to planes[p][i], and the top plane's byte has
// residual[(phase + i) % period] subtracted (optional). merge undoes the steps
// in reverse order.
#include "shuffle/shuffle.h"

#include "common/arch.h"
#if KVCORE_X86
#include <xmmintrin.h>
#endif  // KVCORE_X86

#include "checksum/xxh3_stripes.h"
#include "common/aligned_buffer.h"
#include "cpu/cpu_features.h"
#include "shuffle/shuffle_internal.h"

namespace kvcore::shuffle {
namespace detail {
namespace {

template <typename W>
W load_le(const uint8_t* p) {
    W x = 0;
    for (unsigned b = 0; b < sizeof(W); ++b) x = static_cast<W>(x | (W(p[b]) << (8 * b)));
    return x;
}

template <typename W>
W rotl1(W x) {
    return static_cast<W>((x << 1) | (x >> (8 * sizeof(W) - 1)));
}

template <typename W>
W rotr1(W x) {
    return static_cast<W>((x >> 1) | (x << (8 * sizeof(W) - 1)));
}

// Elements go in blocks of kMaxBlock so that the residual of a block is a plain
// array (ResidualPattern) and the inner loops have no wrap-around test; the
// compiler may vectorise them with the baseline ISA.
template <typename W, bool Rotate, bool Residual>
void split_t(const uint8_t* __restrict src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    constexpr unsigned E = sizeof(W);
    constexpr size_t B = kMaxBlock;
    const ResidualPattern res(t, Residual ? n : 0);
    const size_t step = Residual ? res.step(B) : 0;
    uint8_t* __restrict p0 = planes[0];
    uint8_t* __restrict p1 = E > 1 ? planes[1] : nullptr;
    uint8_t* __restrict p2 = E > 2 ? planes[2] : nullptr;
    uint8_t* __restrict p3 = E > 2 ? planes[3] : nullptr;
    uint8_t* __restrict top = planes[E - 1];
    size_t pos = 0;
    for (size_t i = 0; i < n; i += B) {
        const size_t m = n - i < B ? n - i : B;
        for (size_t j = i; j < i + m; ++j) {
            W x = load_le<W>(src + j * E);
            if (Rotate) x = rotl1(x);
            p0[j] = static_cast<uint8_t>(x);
            if constexpr (E > 1) p1[j] = static_cast<uint8_t>(x >> 8);
            if constexpr (E > 2) {
                p2[j] = static_cast<uint8_t>(x >> 16);
                p3[j] = static_cast<uint8_t>(x >> 24);
            }
        }
        if (Residual) {
            const uint8_t* __restrict r = res.bytes() + pos;
            for (size_t j = 0; j < m; ++j) top[i + j] = static_cast<uint8_t>(top[i + j] - r[j]);
            res.advance(pos, step);
        }
    }
}

template <typename W, bool Rotate, bool Residual>
void merge_t(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* __restrict dst) {
    constexpr unsigned E = sizeof(W);
    constexpr size_t B = kMaxBlock;
    const ResidualPattern res(t, Residual ? n : 0);
    const size_t step = Residual ? res.step(B) : 0;
    const uint8_t* __restrict p0 = planes[0];
    const uint8_t* __restrict p1 = E > 1 ? planes[1] : nullptr;
    const uint8_t* __restrict p2 = E > 2 ? planes[2] : nullptr;
    const uint8_t* __restrict p3 = E > 2 ? planes[3] : nullptr;
    const uint8_t* __restrict top = planes[E - 1];
    uint8_t top_block[B];
    size_t pos = 0;
    for (size_t i = 0; i < n; i += B) {
        const size_t m = n - i < B ? n - i : B;
        if (Residual) {
            const uint8_t* __restrict r = res.bytes() + pos;
            for (size_t j = 0; j < m; ++j) top_block[j] = static_cast<uint8_t>(top[i + j] + r[j]);
            res.advance(pos, step);
        }
        for (size_t j = 0; j < m; ++j) {
            const size_t k = i + j;
            const uint8_t hi = Residual ? top_block[j] : top[k];
            W x;
            if constexpr (E == 1) x = hi;
            if constexpr (E == 2) x = static_cast<W>(p0[k] | (W(hi) << 8));
            if constexpr (E == 4) x = W(p0[k]) | (W(p1[k]) << 8) | (W(p2[k]) << 16) | (W(hi) << 24);
            if (Rotate) x = rotr1(x);
            for (unsigned b = 0; b < E; ++b) dst[k * E + b] = static_cast<uint8_t>(x >> (8 * b));
        }
    }
    (void)p1;
    (void)p3;
}

template <typename W>
void split_w(const uint8_t* src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    const bool res = t.residual != nullptr;
    if (t.rotate) {
        res ? split_t<W, true, true>(src, n, t, planes) : split_t<W, true, false>(src, n, t, planes);
    } else {
        res ? split_t<W, false, true>(src, n, t, planes) : split_t<W, false, false>(src, n, t, planes);
    }
}

template <typename W>
void merge_w(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst) {
    const bool res = t.residual != nullptr;
    if (t.rotate) {
        res ? merge_t<W, true, true>(planes, n, t, dst) : merge_t<W, true, false>(planes, n, t, dst);
    } else {
        res ? merge_t<W, false, true>(planes, n, t, dst) : merge_t<W, false, false>(planes, n, t, dst);
    }
}

}  // namespace

void split_scalar(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes) {
    switch (elem_size) {
        case 1: split_w<uint8_t>(src, n, t, planes); break;
        case 2: split_w<uint16_t>(src, n, t, planes); break;
        case 4: split_w<uint32_t>(src, n, t, planes); break;
        default: break;  // callers validate elem_size
    }
}

void merge_scalar(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst) {
    switch (elem_size) {
        case 1: merge_w<uint8_t>(planes, n, t, dst); break;
        case 2: merge_w<uint16_t>(planes, n, t, dst); break;
        case 4: merge_w<uint32_t>(planes, n, t, dst); break;
        default: break;
    }
}

}  // namespace detail

#if KVCORE_X86
namespace {

// Elements to split with the scalar code first so that the SIMD variants store
// whole cache lines: a store that straddles two lines cost Intel cores twice
// the time (a 1 MiB bf16 split ran at 11 against 24 GB/s on an H200 host's
// Xeon). Only possible when every plane sits at the same offset in its line;
// short runs (the analysis's sample rows) are left as they are.
size_t aligning_head(size_t n, unsigned elem_size, uint8_t* const* planes) {
    constexpr size_t kMinElems = 4096;
    if (n < kMinElems) return 0;
    const uintptr_t offset = reinterpret_cast<uintptr_t>(planes[0]) % kCacheLine;
    for (unsigned p = 1; p < elem_size; ++p) {
        if (reinterpret_cast<uintptr_t>(planes[p]) % kCacheLine != offset) return 0;
    }
    return (kCacheLine - offset) % kCacheLine;
}

// What is left to split after the aligning head, which this splits (scalar).
struct AlignedRest {
    const uint8_t* src;
    size_t n;
    uint8_t* planes[4];
    PlaneTransform t;  // continuing from the head's last element
};

AlignedRest split_aligning_head(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                                uint8_t* const* planes) {
    const size_t head = aligning_head(n, elem_size, planes);
    if (head) detail::split_scalar(src, head, elem_size, t, planes);
    AlignedRest r{src + head * elem_size, n - head, {}, detail::tail_transform(t, head)};
    for (unsigned p = 0; p < elem_size; ++p) r.planes[p] = planes[p] + head;
    return r;
}

}  // namespace
#endif  // KVCORE_X86

namespace {

// Whether split has anything to do: elem_size outside {1, 2, 4} or a residual
// with period 0 is a caller error (the bindings reject it).
bool splittable(size_t n, unsigned elem_size, const PlaneTransform& t) {
    return n != 0 && (t.residual == nullptr || (t.period != 0 && t.phase < t.period)) &&
           (elem_size == 1 || elem_size == 2 || elem_size == 4);
}

}  // namespace

// Where a caller error leaves nothing to split (splittable), these functions write nothing.
void split(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes,
           Stores stores) {
    if (!splittable(n, elem_size, t)) return;
    const uint32_t isa = cpu::active_isa();
    if (!(isa & (cpu::kIsaAvx512 | cpu::kIsaAvx2))) return detail::split_scalar(src, n, elem_size, t, planes);
#if KVCORE_X86
    if (stores == Stores::kStreaming && (isa & cpu::kIsaAvx512))
        return detail::split_streamed_avx512(src, n, elem_size, t, planes);
    const AlignedRest r = split_aligning_head(src, n, elem_size, t, planes);
    if (isa & cpu::kIsaAvx512) return detail::split_avx512(r.src, r.n, elem_size, r.t, r.planes);
    detail::split_avx2(r.src, r.n, elem_size, r.t, r.planes);
#else
    (void)stores;  // streaming stores are x86 only; no SIMD level is active elsewhere
#endif  // KVCORE_X86
}

bool split_hashed(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes,
                  Xxh3Stripes* hash) {
#if KVCORE_X86
    if (!(cpu::active_isa() & cpu::kIsaAvx512) || !splittable(n, elem_size, t) || hash->fed != 0 ||
        hash->len != uint64_t(n) * elem_size)
        return false;
    // As split: the aligning head, then the kernel, which feeds the input's stripes
    // whatever that head's length (it loads them from the input, not from its own vectors).
    const AlignedRest r = split_aligning_head(src, n, elem_size, t, planes);
    const size_t done = detail::split_hashed_avx512(r.src, r.n, elem_size, r.t, r.planes, src, hash);
    detail::split_rest(r.src, r.n, done, elem_size, r.t, r.planes);
    return true;
#else
    (void)src, (void)n, (void)elem_size, (void)t, (void)planes, (void)hash;
    return false;
#endif  // KVCORE_X86
}

void merge(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst) {
    if (n == 0 || (t.residual != nullptr && (t.period == 0 || t.phase >= t.period))) return;
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return detail::merge_avx512(planes, n, elem_size, t, dst);
    if (isa & cpu::kIsaAvx2) return detail::merge_avx2(planes, n, elem_size, t, dst);
#endif  // KVCORE_X86
    detail::merge_scalar(planes, n, elem_size, t, dst);
}

bool merge_hashed(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst,
                  Xxh3Stripes* hash, Stores stores) {
    const uint32_t isa = cpu::active_isa();
    if (!(isa & (cpu::kIsaAvx512 | cpu::kIsaAvx2))) return false;
#if KVCORE_X86
    if (n == 0 || (t.residual != nullptr && (t.period == 0 || t.phase >= t.period))) return true;
    // The kernel feeds every vector it writes, so in the input's last piece it stops
    // before the last byte (whole kernel blocks only; its own scalar tail would feed
    // nothing): the stripes after the in-order ones are finish()'s. An earlier piece
    // ends on an XXH3 block, so its elements fill whole kernel blocks.
    const uint64_t start = 64 * hash->fed, end = start + uint64_t(n) * elem_size;
    size_t fed = 0;
    if (start % kXxh3BlockBytes == 0 && end <= hash->len) {
        if (end == hash->len) fed = (n - 1) / detail::kMaxBlock * detail::kMaxBlock;
        else if (end % kXxh3BlockBytes == 0) fed = n;
    }
    static_assert(kXxh3BlockBytes % (4 * detail::kMaxBlock) == 0, "a piece ending on an XXH3 block holds whole kernel blocks");
    const bool streaming = stores == Stores::kStreaming && fed > 0 && reinterpret_cast<uintptr_t>(dst) % kCacheLine == 0;
    if (isa & cpu::kIsaAvx512) detail::merge_hashed_avx512(planes, fed, elem_size, t, dst, hash, streaming);
    else detail::merge_hashed_avx2(planes, fed, elem_size, t, dst, hash, streaming);
    if (fed < n) {
        const uint8_t* rest[4];
        for (unsigned p = 0; p < elem_size; ++p) rest[p] = planes[p] + fed;
        merge(rest, n - fed, elem_size, detail::tail_transform(t, fed), dst + fed * elem_size);
    }
    if (streaming) _mm_sfence();  // non-temporal stores are weakly ordered: visible before the caller reports done
    return true;
#else
    // No hashing kernel here: callers merge and hash the output themselves.
    (void)planes, (void)n, (void)elem_size, (void)t, (void)dst, (void)hash, (void)stores;
    return false;
#endif  // KVCORE_X86
}

}  // namespace kvcore::shuffle
