// Byte-plane shuffle: run-time dispatch and the portable scalar reference.
//
// The scalar code is the definition every SIMD variant must match byte for
// byte: element i is read little endian, rotated left by one bit (optional),
// byte p goes to planes[p][i], and the top plane's byte has
// residual[(phase + i) % period] subtracted (optional). merge undoes the steps
// in reverse order.
#include "shuffle/shuffle.h"

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

template <typename W, bool Rotate, bool Residual>
void split_t(const uint8_t* src, size_t n, const PlaneTransform& t, uint8_t* const* planes) {
    constexpr unsigned E = sizeof(W);
    uint32_t c = t.phase;
    for (size_t i = 0; i < n; ++i) {
        W x = load_le<W>(src + i * E);
        if (Rotate) x = rotl1(x);
        for (unsigned p = 0; p < E; ++p) planes[p][i] = static_cast<uint8_t>(x >> (8 * p));
        if (Residual) {
            planes[E - 1][i] = static_cast<uint8_t>(planes[E - 1][i] - t.residual[c]);
            if (++c == t.period) c = 0;
        }
    }
}

template <typename W, bool Rotate, bool Residual>
void merge_t(const uint8_t* const* planes, size_t n, const PlaneTransform& t, uint8_t* dst) {
    constexpr unsigned E = sizeof(W);
    uint32_t c = t.phase;
    for (size_t i = 0; i < n; ++i) {
        W x = 0;
        for (unsigned p = 0; p < E; ++p) {
            uint8_t b = planes[p][i];
            if (Residual && p == E - 1) b = static_cast<uint8_t>(b + t.residual[c]);
            x = static_cast<W>(x | (W(b) << (8 * p)));
        }
        if (Residual && ++c == t.period) c = 0;
        if (Rotate) x = rotr1(x);
        for (unsigned p = 0; p < E; ++p) dst[i * E + p] = static_cast<uint8_t>(x >> (8 * p));
    }
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

// elem_size outside {1, 2, 4} or a residual with period 0 is a caller error
// (the bindings reject it); these functions then write nothing.
void split(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes) {
    if (n == 0 || (t.residual != nullptr && (t.period == 0 || t.phase >= t.period))) return;
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return detail::split_avx512(src, n, elem_size, t, planes);
    if (isa & cpu::kIsaAvx2) return detail::split_avx2(src, n, elem_size, t, planes);
    detail::split_scalar(src, n, elem_size, t, planes);
}

void merge(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst) {
    if (n == 0 || (t.residual != nullptr && (t.period == 0 || t.phase >= t.period))) return;
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return detail::merge_avx512(planes, n, elem_size, t, dst);
    if (isa & cpu::kIsaAvx2) return detail::merge_avx2(planes, n, elem_size, t, dst);
    detail::merge_scalar(planes, n, elem_size, t, dst);
}

}  // namespace kvcore::shuffle
