#include "entropy/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/arch.h"
#include "cpu/cpu_features.h"
#include "entropy/histogram_internal.h"

#if KVCORE_X86
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define KV_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define KV_ALWAYS_INLINE inline
#endif

namespace kvcore::entropy {
namespace {

// Planes are counted exactly below kSampleMin bytes, or below kSampleMinNarrow
// when their values span more than kNarrowWidth values: a sample's error grows
// with the alphabet it spreads over, so a narrow plane (the exponents of one
// channel group) can be sampled from a quarter of the size a wide one (sign
// bits, fp16 top bytes) needs for the same cost in code length.
constexpr size_t kSampleMin = 32768;
constexpr size_t kSampleMinNarrow = 8192;
constexpr unsigned kNarrowWidth = 64;
// The first kSampleTaken bytes of every period are counted: kSamplePeriod,
// kNarrowSamplePeriod in narrow planes (for the same reason; the exponents of a
// channel group, counted in the grouped coder's 16 fine groups of each exponent
// plane: dense compress 1.01-1.03x on kvdata bf16 and fp16, frames up to 0.03%
// larger), or kSmallSamplePeriod in planes below kSampleMin (more of a small
// plane, for a sample of about the same error). All are 8 x an odd prime: in a plane of rows
// whose length is a multiple of 8 (and not of the period), the counted bytes start
// at every multiple of 8 within a row, so every channel is sampled; a period of
// 128 would count the same 16 channels of every row of 32 or 384 bytes.
constexpr size_t kSamplePeriod = 136;        // 8 x 17
constexpr size_t kNarrowSamplePeriod = 296;  // 8 x 37
constexpr size_t kSmallSamplePeriod = 88;    // 8 x 11
constexpr size_t kSampleTaken = 16;
// Values in range that the sample missed are looked for in the plane. AVX2 looks
// for 8 at a time, with vector compares that stop once all 8 have turned up: a
// pass costs a fraction of an exact count up to about kMaxBatched values; past
// that it counts exactly and keeps only which values occur (so that every variant
// gives the same weights). AVX-512 takes any number in one pass.
#if KVCORE_X86
constexpr unsigned kMaxBatched = 32;
constexpr unsigned kPresentBatch = 8;
// Exact counts take the AVX-512 window count (histogram_avx512.cpp) where the
// plane's values span at most kWindowValues values (its cost grows with them),
// judged first on its first kWindowProbe bytes.
constexpr unsigned kWindowValues = 24;
constexpr size_t kWindowProbe = 1024;
#endif

// Eight count tables: runs of one value (common in skewed planes) would otherwise
// serialize on store-to-load forwarding of a single counter.
struct Counts {
    uint32_t c[8][256];
    KV_ALWAYS_INLINE void add16(const uint8_t* p) {
        uint64_t a, b;
        std::memcpy(&a, p, 8);
        std::memcpy(&b, p + 8, 8);
        for (unsigned k = 0; k < 8; k += 2) {
            ++c[0 + (k >> 1)][(a >> (8 * k)) & 0xff];
            ++c[4 + (k >> 1)][(a >> (8 * k + 8)) & 0xff];
            ++c[0 + (k >> 1)][(b >> (8 * k)) & 0xff];
            ++c[4 + (k >> 1)][(b >> (8 * k + 8)) & 0xff];
        }
    }
    void sum(uint32_t* hist) const {
        for (unsigned s = 0; s < 256; ++s)
            hist[s] = c[0][s] + c[1][s] + c[2][s] + c[3][s] + c[4][s] + c[5][s] + c[6][s] + c[7][s];
    }
};

KV_ALWAYS_INLINE void histogram_impl(const uint8_t* src, size_t n, uint32_t* hist) {
    Counts k;
    std::memset(&k, 0, sizeof(k));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) k.add16(src + i);
    for (; i < n; ++i) ++k.c[0][src[i]];
    k.sum(hist);
}

// Counts the first kSampleTaken bytes of every period; returns how many were counted.
KV_ALWAYS_INLINE size_t sampled_impl(const uint8_t* src, size_t n, uint32_t* hist, bool narrow) {
    const size_t period = n < kSampleMin ? kSmallSamplePeriod : narrow ? kNarrowSamplePeriod : kSamplePeriod;
    Counts k;
    std::memset(&k, 0, sizeof(k));
    size_t taken = 0;
    for (size_t base = 0; base + period <= n; base += period, taken += kSampleTaken)
        for (size_t j = 0; j < kSampleTaken; j += 16) k.add16(src + base + j);
    k.sum(hist);
    return taken;
}

// Exact value range of the plane, as unsigned and as signed bytes.
struct Range {
    uint8_t umin = 255, umax = 0;
    int8_t smin = 127, smax = -128;
};

KV_ALWAYS_INLINE void range_tail(const uint8_t* src, size_t i, size_t n, Range* r) {
    for (; i < n; ++i) {
        const uint8_t u = src[i];
        const int8_t v = static_cast<int8_t>(u);
        if (u < r->umin) r->umin = u;
        if (u > r->umax) r->umax = u;
        if (v < r->smin) r->smin = v;
        if (v > r->smax) r->smax = v;
    }
}

Range range_scalar(const uint8_t* src, size_t n) {
    Range r;
    range_tail(src, 0, n, &r);
    return r;
}

#if KVCORE_X86
__attribute__((target("avx2"))) Range range_avx2(const uint8_t* src, size_t n) {
    __m256i umin = _mm256_set1_epi8(-1), umax = _mm256_setzero_si256();
    __m256i smin = _mm256_set1_epi8(127), smax = _mm256_set1_epi8(-128);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
        umin = _mm256_min_epu8(umin, v);
        umax = _mm256_max_epu8(umax, v);
        smin = _mm256_min_epi8(smin, v);
        smax = _mm256_max_epi8(smax, v);
    }
    alignas(32) uint8_t b[4][32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(b[0]), umin);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b[1]), umax);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b[2]), smin);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b[3]), smax);
    Range r;
    if (i > 0) {
        for (int j = 0; j < 32; ++j) {
            if (b[0][j] < r.umin) r.umin = b[0][j];
            if (b[1][j] > r.umax) r.umax = b[1][j];
            if (int8_t(b[2][j]) < r.smin) r.smin = int8_t(b[2][j]);
            if (int8_t(b[3][j]) > r.smax) r.smax = int8_t(b[3][j]);
        }
    }
    range_tail(src, i, n, &r);
    return r;
}

// Which of k <= kPresentBatch candidate values occur in src: bit j of the result for cand[j].
__attribute__((target("avx2"))) uint32_t present_batch_avx2(const uint8_t* src, size_t n, const uint8_t* cand,
                                                              unsigned k) {
    __m256i want[kPresentBatch], hit[kPresentBatch];
    for (unsigned j = 0; j < k; ++j) {
        want[j] = _mm256_set1_epi8(static_cast<char>(cand[j]));
        hit[j] = _mm256_setzero_si256();
    }
    const uint32_t all = (1u << k) - 1;
    uint32_t mask = 0;
    size_t i = 0;
    // Stop once every candidate has turned up (most do, early): checked every 2 KiB.
    while (i + 32 <= n && mask != all) {
        const size_t end = std::min(n & ~size_t(31), i + 2048);
        for (; i < end; i += 32) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
            for (unsigned j = 0; j < k; ++j) hit[j] = _mm256_or_si256(hit[j], _mm256_cmpeq_epi8(v, want[j]));
        }
        for (unsigned j = 0; j < k; ++j) mask |= uint32_t(!_mm256_testz_si256(hit[j], hit[j])) << j;
    }
    if (mask == all) return mask;
    for (; i < n; ++i)
        for (unsigned j = 0; j < k; ++j) mask |= uint32_t(src[i] == cand[j]) << j;
    return mask;
}
#endif

void histogram_scalar(const uint8_t* src, size_t n, uint32_t* hist) { histogram_impl(src, n, hist); }
#if KVCORE_X86
__attribute__((target("avx2,bmi,bmi2"))) void histogram_bmi2(const uint8_t* src, size_t n, uint32_t* hist) {
    histogram_impl(src, n, hist);
}
#endif
size_t sampled_scalar(const uint8_t* src, size_t n, uint32_t* hist, bool narrow) {
    return sampled_impl(src, n, hist, narrow);
}
#if KVCORE_X86
__attribute__((target("avx2,bmi,bmi2"))) size_t sampled_bmi2(const uint8_t* src, size_t n, uint32_t* hist,
                                                             bool narrow) {
    return sampled_impl(src, n, hist, narrow);
}

bool use_avx2() { return (cpu::active_isa() & cpu::kIsaAvx2) != 0; }
#endif

void find_values(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found) {
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return detail::find_values_avx512(src, n, cand, k, found);
    if (isa & cpu::kIsaAvx2) return detail::find_values_avx2(src, n, cand, k, found);
#endif
    detail::find_values_scalar(src, n, cand, k, found);
}

// The values of a range: the narrower of its unsigned and its signed reading (a
// signed one wraps through 0), as its first value and its number of values.
struct Window {
    uint8_t lo;
    unsigned width;
};

Window values_of(const Range& r) {
    const unsigned uwidth = unsigned(r.umax) - r.umin + 1;
    const unsigned swidth = unsigned(int(r.smax) - int(r.smin) + 1);
    if (uwidth <= swidth) return {r.umin, uwidth};
    return {static_cast<uint8_t>(r.smin), swidth};
}

// What both estimates start with: planes too small to sample (see kSampleMin)
// are counted exactly, and a plane whose exact value range is one value is
// constant. Returns true when hist then holds the exact counts; else *r is the
// plane's value range and hist is untouched.
bool exact_if_small_or_constant(const uint8_t* src, size_t n, uint32_t* hist, Range* r) {
    if (n < kSampleMinNarrow) {
        histogram(src, n, hist);
        return true;
    }
#if KVCORE_X86
    *r = use_avx2() ? range_avx2(src, n) : range_scalar(src, n);
#else
    *r = range_scalar(src, n);
#endif
    if (n < kSampleMin && values_of(*r).width > kNarrowWidth) {
        histogram(src, n, hist);
        return true;
    }
    if (r->umin != r->umax) return false;
    std::memset(hist, 0, 256 * sizeof(uint32_t));
    hist[r->umin] = static_cast<uint32_t>(n);
    return true;
}

// A sampled count scaled to the whole plane (count <= taken <= n, so it fits: at most n).
uint32_t scaled(uint32_t count, size_t n, size_t taken) {
    return static_cast<uint32_t>(uint64_t(count) * n / taken);
}

size_t sampled(const uint8_t* src, size_t n, uint32_t* hist, bool narrow = false) {
#if KVCORE_X86
    return use_avx2() ? sampled_bmi2(src, n, hist, narrow) : sampled_scalar(src, n, hist, narrow);
#else
    return sampled_scalar(src, n, hist, narrow);
#endif
}

}  // namespace

namespace detail {

void find_values_scalar(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found) {
    bool seen[256] = {};
    for (size_t i = 0; i < n; ++i) seen[src[i]] = true;
    for (unsigned j = 0; j < k; ++j) found[j] = seen[cand[j]];
}

#if KVCORE_X86
void find_values_avx2(const uint8_t* src, size_t n, const uint8_t* cand, unsigned k, bool* found) {
    if (k > kMaxBatched) {
        uint32_t counts[256];
        histogram(src, n, counts);
        for (unsigned j = 0; j < k; ++j) found[j] = counts[cand[j]] != 0;
        return;
    }
    for (unsigned j = 0; j < k; j += kPresentBatch) {
        const unsigned batch = std::min(kPresentBatch, k - j);
        const uint32_t mask = present_batch_avx2(src, n, cand + j, batch);
        for (unsigned b = 0; b < batch; ++b) found[j + b] = (mask >> b) & 1;
    }
}
#endif

}  // namespace detail

void histogram(const uint8_t* src, size_t n, uint32_t* hist) {
#if KVCORE_X86
    // A plane whose first KiB spans few values is looked at whole; where all of it
    // does, the AVX-512 window count replaces the table count: 16 KiB of 17-24
    // values (the bfloat16 exponent plane of a 16-token KV page: 14-24) in 2.8 us
    // against 5.8, of up to 8 values in 1.2 (Zen 4, best of 3000 calls).
    if ((cpu::active_isa() & cpu::kIsaAvx512) && n >= kWindowProbe &&
        values_of(range_avx2(src, kWindowProbe)).width <= kWindowValues) {
        const Window w = values_of(range_avx2(src, n));
        if (w.width <= kWindowValues) return detail::count_window_avx512(src, n, w.lo, w.width, hist);
    }
    if (use_avx2())
        histogram_bmi2(src, n, hist);
    else
#endif
        histogram_scalar(src, n, hist);
}

bool histogram_weights(const uint8_t* src, size_t n, uint32_t* hist) {
    // Here the value range only tells whether the plane is constant (or, below
    // kSampleMin, narrow): a large plane whose sample holds two values is not, so
    // it skips the range pass.
    const bool large = n >= kSampleMin;
    size_t taken = large ? sampled(src, n, hist) : 0;
    if (!large || std::count_if(hist, hist + 256, [](uint32_t c) { return c != 0; }) < 2) {
        Range r;
        if (exact_if_small_or_constant(src, n, hist, &r)) return true;
        if (!large) taken = sampled(src, n, hist);  // (else hist still holds the sample)
    }
    for (unsigned s = 0; s < 256; ++s) hist[s] = scaled(hist[s], n, taken);
    return false;
}

bool histogram_estimate(const uint8_t* src, size_t n, uint32_t* hist) {
    Range r;
    if (exact_if_small_or_constant(src, n, hist, &r)) return true;
    const auto [lo, width] = values_of(r);

    const size_t taken = sampled(src, n, hist, width <= kNarrowWidth);
    uint8_t unseen[256];
    unsigned k_unseen = 0;
    // The range's ends occur by definition: only values inside it can be missing.
    const uint8_t ends[2] = {lo, uint8_t(lo + width - 1)};
    const bool end_unseen[2] = {hist[ends[0]] == 0, hist[ends[1]] == 0};
    for (unsigned k = 1; k + 1 < width; ++k) {
        const uint8_t v = uint8_t(lo + k);
        if (!hist[v]) unseen[k_unseen++] = v;
    }
    // Scale to about n; a value the sample missed is rare: weight 1 when it occurs
    // at all (a value coded but absent would waste code space).
    for (unsigned k = 0; k < width; ++k) hist[uint8_t(lo + k)] = scaled(hist[uint8_t(lo + k)], n, taken);
    for (int e = 0; e < 2; ++e)
        if (end_unseen[e]) hist[ends[e]] = 1;
    bool found[256];
    if (k_unseen) find_values(src, n, unseen, k_unseen, found);
    for (unsigned j = 0; j < k_unseen; ++j) hist[unseen[j]] = found[j] ? 1 : 0;
    return false;
}

namespace {

constexpr uint32_t kTabledCounts = 4096;

double count_bits(uint32_t c) { return double(c) * std::log2(double(c)); }

// x log2 x for x < kTabledCounts (0 for 0), built once.
const double* count_bits_table() {
    static const std::vector<double> table = [] {
        std::vector<double> t(kTabledCounts, 0.0);
        for (uint32_t c = 1; c < kTabledCounts; ++c) t[c] = count_bits(c);
        return t;
    }();
    return table.data();
}

}  // namespace

double order0_bits(const uint32_t* hist, unsigned lo, unsigned hi) {
    const double* table = count_bits_table();
    uint64_t total = 0;
    double sum = 0;
    for (unsigned s = lo; s <= hi; ++s) {
        const uint32_t c = hist[s];
        total += c;
        sum += c < kTabledCounts ? table[c] : count_bits(c);
    }
    if (total == 0) return 0.0;
    return std::max(0.0, double(total) * std::log2(double(total)) - sum);
}

}  // namespace kvcore::entropy
