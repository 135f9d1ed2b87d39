#include "frame/analysis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "entropy/channel_groups.h"
#include "entropy/fastcode.h"
#include "entropy/histogram.h"
#include "frame/format.h"
#include "frame/plane_methods.h"
#include "frame/value_counts.h"
#include "shuffle/channel_transpose.h"
#include "shuffle/shuffle.h"

namespace kvcore::frame {
namespace {

// Elements looked at: a quarter of the tensor, at least kMinSampleElems and at
// most kSampleElems. With kSampleElems always, the analysis counted two thirds
// of a 64-row MiniLM frame (48 KiB), 13% of the samples in `perf` of a loop of
// dense compressions of such frames; a quarter compressed them 1.09x faster and
// 32 KiB stories260K frames 1.17x; ratios moved by at most 0.0007 (ad hoc, 2026-12-05).
constexpr uint64_t kSampleElems = 1u << 14;
constexpr uint64_t kMinSampleElems = 1u << 12;
constexpr uint64_t kMinRowsForResidual = 64;  // residual table must pay for itself
constexpr uint64_t kResidualRows = 64;        // rows sampled per channel
constexpr uint64_t kSignBytes = 4096;         // sign bytes (8 rows of a channel) sampled in max mode
static_assert(kMinRowsForResidual >= kResidualRows, "the residual's sample takes distinct rows");
static_assert(kResidualRows == kValueCountBytes, "a channel's sampled top bytes are counted in one call");
// Dense mode takes the rotated layout of a float16 or float8 tensor of at least
// kRotatedMinElems elements unless the plain one estimates more than
// kRotatedAllowance bits per element smaller. Rotated, the top byte holds the
// exponent and mantissa bits with the sign out of it (float16: in the low plane;
// float8: in bit 0), and the low-bits split stores its low bits raw, leaving
// Huffman symbols of the exponent and a mantissa bit, which decode faster than
// the plain layout's (sign, exponent and a bit) and cost the sign's leaning by
// channel, which the plain layout's channel-grouped code follows.
// - float16: the layouts differ only in where the sign and the third mantissa bit
//   go, both close to random, and estimate within about 0.002 bit of each other
//   on real KV, so the sample's noise picked either (MiniLM: the whole file
//   plain, its first half rotated). MiniLM fp16 dense decompress 1.21-1.32x,
//   compress 1.13-1.15x, for 0.8443 -> 0.8479; 384 KiB frames of it decode 1.09x
//   for 0.0003.
// - float8: rotation permutes the byte's values, so the estimates tie (and ties
//   went to the plain layout). MiniLM e4m3 decompress 1.31-1.60x for 0.8176 ->
//   0.8228, e5m2 1.36-1.63x for 0.6938 -> 0.6991; stories260K e4m3 1.08-1.15x
//   and e5m2 1.05-1.20x, both smaller (0.7304 -> 0.7262, 0.6214 -> 0.6176).
// Smaller tensors gained little (fp16 frames of 96-119 KiB: 1.00-1.10x) for up to
// 0.0036 more (8 KiB stories260K frames, below the split's minimum plane), so
// they keep the closest estimate.
constexpr double kRotatedAllowance = 1.0 / 64;
constexpr uint64_t kRotatedMinElems = 65536;

bool rotation_preferred_for(DType d) {
    return d == DType::kFloat16 || d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2;
}

bool is_float(DType d) {
    return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2 || d == DType::kFloat16 || d == DType::kBFloat16 ||
           d == DType::kFloat32;
}

using PlaneCounts = std::array<uint32_t, 256>;

// The analysis's sample: whole rows (a row is one element per channel, or up to
// 4096 elements without channels), about min(kSampleElems, max(kMinSampleElems,
// n / 4)) elements (at least one row), evenly spread.
struct SampleRows {
    uint64_t n_elems, row_len, rows, stride;
    SampleRows(uint64_t n, uint32_t channels)
        : n_elems(n), row_len(channels > 1 ? channels : std::min<uint64_t>(n, 4096)) {
        const uint64_t n_rows = n_elems / row_len;
        const uint64_t want = std::min<uint64_t>(kSampleElems, std::max<uint64_t>(kMinSampleElems, n_elems / 4));
        rows = std::max<uint64_t>(1, std::min<uint64_t>(n_rows, want / row_len));
        stride = std::max<uint64_t>(1, n_rows / rows);
    }
    uint64_t start(uint64_t r) const { return r * stride * row_len; }
    uint64_t elems(uint64_t r) const { return std::min(n_elems, start(r) + row_len) - start(r); }
};

// The analysis reads rows spread over the tensor, each a new run of cache misses
// that the hardware prefetcher does not see coming: the next one is prefetched
// while one is read (dense compress of MiniLM frames: 192 KiB 1.11x, 510 KiB 1.05x).
// always_inline: GCC finds a function that only prefetches free of side effects
// and drops its calls.
inline __attribute__((always_inline)) void prefetch_bytes(const uint8_t* p, uint64_t bytes) {
    for (uint64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

inline __attribute__((always_inline)) void prefetch_next(const uint8_t* src, const SampleRows& rows, unsigned esize,
                                                         uint64_t r) {
    if (r + 1 < rows.rows) prefetch_bytes(src + rows.start(r + 1) * esize, rows.elems(r + 1) * esize);
}

// Symbol counts of each byte plane of the sample (split as the encoder splits:
// the SIMD shuffle).
void sample_counts(const uint8_t* src, const SampleRows& rows, unsigned esize, bool rotate,
                   std::vector<uint8_t>* scratch, PlaneCounts* counts) {
    uint64_t total = 0;
    for (uint64_t r = 0; r < rows.rows; ++r) total += rows.elems(r);
    scratch->resize(size_t(total) * esize);
    uint8_t* planes[4];
    for (unsigned p = 0; p < esize; ++p) planes[p] = scratch->data() + p * total;
    shuffle::PlaneTransform t;
    t.rotate = rotate;
    for (uint64_t r = 0; r < rows.rows; ++r) {
        prefetch_next(src, rows, esize, r);
        const uint64_t len = rows.elems(r);
        shuffle::split(src + rows.start(r) * esize, len, esize, t, planes);
        for (unsigned p = 0; p < esize; ++p) planes[p] += len;
    }
    for (unsigned p = 0; p < esize; ++p) entropy::histogram(scratch->data() + p * total, total, counts[p].data());
}

// The plane counts of both layouts of 2-byte elements, from one pass over the
// sample, with no split: either layout's high plane is a function of bits 15..7
// (sign, exponent) and its low plane of bits 15 and 7..0, so two counts of
// those 9-bit values give all four exactly (half the counting of four planes).
void sample_counts_2byte(const uint8_t* src, const SampleRows& rows, PlaneCounts* plain, PlaneCounts* rotated) {
    constexpr uint32_t kValues = 512;
    std::array<uint32_t, 2 * kValues> high{}, low{};  // two tables each: even and odd elements
    auto count = [&](uint16_t x, uint32_t table) {
        ++high[table + (x >> 7)];
        ++low[table + ((x & 0xffu) | (uint32_t(x >> 15) << 8))];
    };
    for (uint64_t r = 0; r < rows.rows; ++r) {
        prefetch_next(src, rows, 2, r);
        const uint8_t* p = src + rows.start(r) * 2;
        const uint64_t len = rows.elems(r);
        uint64_t i = 0;
        for (; i + 2 <= len; i += 2) {
            uint16_t a, b;
            std::memcpy(&a, p + 2 * i, 2);
            std::memcpy(&b, p + 2 * i + 2, 2);
            count(a, 0);
            count(b, kValues);
        }
        if (i < len) {
            uint16_t a;
            std::memcpy(&a, p + 2 * i, 2);
            count(a, 0);
        }
    }
    for (unsigned p = 0; p < 2; ++p) {
        plain[p].fill(0);
        rotated[p].fill(0);
    }
    for (uint32_t v = 0; v < kValues; ++v) {
        const uint32_t h = high[v] + high[kValues + v], l = low[v] + low[kValues + v];
        plain[1][v >> 1] += h;                           // bits 15..8
        rotated[1][v & 0xff] += h;                       // bits 14..7
        plain[0][v & 0xff] += l;                         // bits 7..0
        rotated[0][((v & 0x7f) << 1) | (v >> 8)] += l;   // bits 6..0, then 15
    }
}

// The top bytes of kResidualRows rows spread over the tensor (rows >=
// kResidualRows), channel-major: channel c's bytes at c * kResidualRows.
void gather_tops(const uint8_t* src, uint64_t rows, uint32_t channels, unsigned esize, bool rotate,
                 std::vector<uint8_t>* tops) {
    const uint64_t step = rows / kResidualRows;
    std::vector<uint8_t> row_planes(size_t(channels) * esize), row_major(size_t(kResidualRows) * channels);
    uint8_t* planes[4];
    for (unsigned p = 0; p < esize; ++p) planes[p] = row_planes.data() + p * channels;
    // The top plane is the last: each row is split into the scratch, its top plane into row_major.
    planes[esize - 1] = row_major.data();
    shuffle::PlaneTransform t;
    t.rotate = rotate;
    const uint64_t row_bytes = uint64_t(channels) * esize;
    for (uint64_t k = 0; k < kResidualRows; ++k) {
        if (k + 1 < kResidualRows) prefetch_bytes(src + (k + 1) * step * row_bytes, row_bytes);
        shuffle::split(src + k * step * row_bytes, channels, esize, t, planes);
        planes[esize - 1] += channels;
    }
    tops->resize(size_t(kResidualRows) * channels);
    std::vector<uint8_t*> column(channels);
    for (uint32_t c = 0; c < channels; ++c) column[c] = tops->data() + size_t(c) * kResidualRows;
    shuffle::to_channel_major(row_major.data(), kResidualRows, channels, column.data());
}

// The distinct sampled top bytes and their counts of every stride-th channel
// (at most kEstimateChannels of them), kept by channel_statistics for dense
// mode's estimate of the residual (grouped_bits): slot k is channel k * stride.
constexpr uint32_t kEstimateChannels = 256;
struct ChannelValues {
    uint32_t stride = 1, kept = 0;
    std::vector<uint8_t> value, count, distinct;  // kValueCountBytes per slot; entries per slot
};

// The order-0 counts of some channels' top bytes (plain) and of the same bytes
// less their channel's mode (shifted).
struct TopCounts {
    PlaneCounts plain{}, shifted{};
    // Bytes per element the residual saves on these channels (<= 0: none): at the
    // order-0 entropy, or as fast mode's fixed-width code (entropy/fastcode.h) codes
    // them, which a residual helps only where it narrows the code or saves escapes.
    double saving(bool fixed_width) const {
        if (!fixed_width) return (entropy_bits(plain.data()) - entropy_bits(shifted.data())) / 8.0;
        uint64_t n = 0;
        for (uint32_t x : plain) n += x;
        return (double(entropy::fastcode_estimate(plain.data(), n, nullptr)) -
                double(entropy::fastcode_estimate(shifted.data(), n, nullptr))) /
               double(n);
    }
};

// Each visited channel's mode (its most common top byte, the smallest on ties)
// and the counts of its top bytes, with and without its mode subtracted: every
// stride-th channel from channel 0. Each distinct value of a channel updates the
// histograms once: a channel's top bytes span a few values (exponents). keep,
// when not null, receives the visited channels' values (slot k: channel k * stride).
void channel_statistics(const uint8_t* tops, uint32_t channels, uint32_t stride, uint8_t* mode, TopCounts* counts,
                        ChannelValues* keep) {
    const ValueCountsKernel value_counts = value_counts_kernel();
    const uint32_t visited = (channels + stride - 1) / stride;
    if (keep) {
        keep->stride = stride;
        keep->kept = visited;
        keep->value.resize(size_t(visited) * kValueCountBytes);
        keep->count.resize(keep->value.size());
        keep->distinct.resize(visited);
    }
    // The next channel is counted before this one's histogram updates, so that
    // its (latency-bound) count overlaps them: two lists, used in turn.
    uint8_t value[2][kValueCountBytes], count[2][kValueCountBytes];
    ValueCounts next = value_counts(tops, value[0], count[0]);
    for (uint32_t k = 0; k < visited; ++k) {
        const uint32_t c = k * stride;
        const ValueCounts vc = next;
        const uint8_t* v = value[k & 1];
        const uint8_t* n = count[k & 1];
        if (k + 1 < visited)
            next = value_counts(tops + size_t(c + stride) * kResidualRows, value[~k & 1], count[~k & 1]);
        const uint8_t m = v[vc.mode];
        mode[c] = m;
        for (unsigned i = 0; i < vc.distinct; ++i) {
            counts->plain[v[i]] += n[i];
            counts->shifted[static_cast<uint8_t>(v[i] - m)] += n[i];
        }
        if (keep) {
            std::memcpy(&keep->value[size_t(k) * kValueCountBytes], v, kValueCountBytes);
            std::memcpy(&keep->count[size_t(k) * kValueCountBytes], n, kValueCountBytes);
            keep->distinct[k] = static_cast<uint8_t>(vc.distinct);
        }
    }
}

// The kept channels' sampled top bytes' bits under dense mode's channel-grouped
// coder (entropy/channel_groups.h), less their channel's shift[c] (none when
// null): the channels ranked and cut into groups as the coder does (by the sum
// of their bytes), each group's bytes at their order-0 entropy. Grouping already
// captures much of what a residual saves, so dense mode weighs the residual
// against this.
double grouped_bits(const ChannelValues& cv, const uint8_t* shift) {
    const uint32_t kept = cv.kept;
    auto shift_of = [&](uint32_t k) -> uint8_t { return shift ? shift[k * cv.stride] : 0; };
    std::array<uint32_t, kEstimateChannels> sum{};
    for (uint32_t k = 0; k < kept; ++k)
        for (unsigned i = 0; i < cv.distinct[k]; ++i) {
            const size_t at = size_t(k) * kValueCountBytes + i;
            sum[k] += uint32_t(static_cast<uint8_t>(cv.value[at] - shift_of(k))) * cv.count[at];
        }
    std::array<uint32_t, kEstimateChannels> ranked;
    entropy::rank_channels(sum.data(), kept, ranked.data());
    const unsigned groups = std::min<uint32_t>(entropy::kMaxChannelGroups, kept);
    double bits = 0;
    for (unsigned g = 0; g < groups; ++g) {
        PlaneCounts hist{};
        uint64_t total = 0;
        for (uint32_t r = entropy::group_first_rank(g, kept, groups); r < entropy::group_first_rank(g + 1, kept, groups);
             ++r) {
            const uint32_t k = ranked[r];
            const uint8_t m = shift_of(k);
            for (unsigned i = 0; i < cv.distinct[k]; ++i) {
                const size_t at = size_t(k) * kValueCountBytes + i;
                hist[static_cast<uint8_t>(cv.value[at] - m)] += cv.count[at];
                total += cv.count[at];
            }
        }
        bits += entropy_bits(hist.data()) * double(total);
    }
    return bits;
}

double binary_entropy(uint64_t ones, uint64_t n) {
    if (ones == 0 || ones == n) return 0.0;
    const double p = double(ones) / double(n);
    return -p * std::log2(p) - (1 - p) * std::log2(1 - p);
}

// signs[w * channels + c] = the signs (each element's top bit; elements are
// little endian) of channel c in rows 8 w' .. 8 w' + 7, bit k from row 8 w' + k,
// for `windows` windows w' of 8 rows spread evenly over the tensor.
template <typename Element>
void gather_sign_bytes(const uint8_t* src, uint64_t n_rows, uint64_t windows, uint32_t channels, uint8_t* signs) {
    constexpr unsigned kSignShift = 8 * sizeof(Element) - 1;
    const uint64_t stride = n_rows / 8 / windows;
    // A window's bytes, in elements' width (so the loops vectorize), through a
    // local pointer (a thread_local's address would be looked up per element).
    thread_local std::vector<Element> window;
    window.resize(channels);
    Element* acc = window.data();
    for (uint64_t w = 0; w < windows; ++w) {
        std::fill(acc, acc + channels, Element(0));
        for (unsigned k = 0; k < 8; ++k) {
            const uint8_t* row = src + (8 * w * stride + k) * channels * sizeof(Element);
            for (uint32_t c = 0; c < channels; ++c) {
                Element x;
                std::memcpy(&x, row + c * sizeof(Element), sizeof(Element));
                acc[c] = Element(acc[c] | (x >> kSignShift) << k);
            }
        }
        for (uint32_t c = 0; c < channels; ++c) signs[w * channels + c] = uint8_t(acc[c]);
    }
}

// Bits per element the signs method (shuffle/sign_bits.h) saves over signs
// stored raw: the tensor's sign entropy less an estimate of what its coded sign
// bytes cost per element. A KV channel leans to one sign and neighbouring
// tokens' signs agree more often than chance, so the estimate codes what the
// method codes: 8 consecutive rows of a channel to a byte, flipped so that the
// channel's common sign is 0, from up to kSignBytes such bytes (windows of 8
// rows spread over the tensor). One distribution for all channels, where the
// method has one per channel group: on the low side. The plug-in entropy of so
// few bytes reads low, so it takes the Miller-Madow correction.
double sign_method_saving(const uint8_t* src, uint64_t n_elems, uint32_t channels, unsigned esize) {
    const uint64_t n_rows = n_elems / channels;
    const uint64_t windows = std::min<uint64_t>(n_rows / 8, (kSignBytes + channels - 1) / channels);
    const size_t n = size_t(windows) * channels;
    thread_local std::vector<uint8_t> signs;
    signs.resize(n);
    if (esize == 2)
        gather_sign_bytes<uint16_t>(src, n_rows, windows, channels, signs.data());
    else
        gather_sign_bytes<uint32_t>(src, n_rows, windows, channels, signs.data());
    // Each channel's flip: 0xff where most of its sampled signs are 1.
    std::vector<uint32_t> ones(channels, 0);
    for (uint64_t w = 0; w < windows; ++w)
        for (uint32_t c = 0; c < channels; ++c) ones[c] += uint32_t(__builtin_popcount(signs[w * channels + c]));
    uint64_t total = 0;
    std::vector<uint8_t> flip(channels);
    for (uint32_t c = 0; c < channels; ++c) {
        total += ones[c];
        flip[c] = 2 * uint64_t(ones[c]) > 8 * windows ? 0xff : 0;
    }
    PlaneCounts counts{};
    for (uint64_t w = 0; w < windows; ++w)
        for (uint32_t c = 0; c < channels; ++c) ++counts[signs[w * channels + c] ^ flip[c]];
    unsigned seen = 0;
    for (uint32_t x : counts) seen += x != 0;
    const double coded = entropy_bits(counts.data()) + double(seen - 1) / (2.0 * double(n) * std::log(2.0));
    return std::max(0.0, binary_entropy(total, 8 * n) - coded / 8);
}

}  // namespace

double entropy_bits(const uint32_t* hist) {
    uint64_t total = 0;
    for (int s = 0; s < 256; ++s) total += hist[s];
    return total ? entropy::order0_bits(hist) / double(total) : 0.0;
}

uint32_t channel_count(const std::vector<uint64_t>& shape) {
    const size_t nd = shape.size();
    // Each factor is checked first, so that the product cannot wrap around.
    if (nd >= 2 && shape[nd - 1] > 0 && shape[nd - 2] > 0 && shape[nd - 1] <= kMaxChannels &&
        shape[nd - 2] <= kMaxChannels && shape[nd - 1] * shape[nd - 2] <= kMaxChannels)
        return static_cast<uint32_t>(shape[nd - 1] * shape[nd - 2]);
    if (nd >= 1 && shape[nd - 1] > 0 && shape[nd - 1] <= kMaxChannels) return static_cast<uint32_t>(shape[nd - 1]);
    return 1;
}

LayoutCoding layout_coding(const EncodeOptions& o) {
    LayoutCoding coding;
    coding.channel_coded = o.mode == Mode::kDense && !o.deflate;
    coding.signs_coded = coding.channel_coded && o.max_ratio;
    coding.rotated_preferred = coding.channel_coded && !o.max_ratio;
    coding.fixed_width_coded = o.mode == Mode::kFast && !o.deflate;
    return coding;
}

bool same_coding(const LayoutCoding& a, const LayoutCoding& b) {
    return a.channel_coded == b.channel_coded && a.signs_coded == b.signs_coded &&
           a.fixed_width_coded == b.fixed_width_coded && a.rotated_preferred == b.rotated_preferred;
}

const char* coding_name(const LayoutCoding& coding) {
    if (coding.signs_coded) return "max";
    if (coding.channel_coded) return "dense";
    return coding.fixed_width_coded ? "fast" : "DEFLATE";
}

Layout choose_layout(const uint8_t* src, uint64_t n_elems, DType dtype, uint32_t channels,
                     const LayoutCoding& coding) {
    const unsigned esize = dtype_size(dtype);
    Layout best;
    best.plane_entropy.assign(esize, 8.0);
    if (n_elems == 0) return best;

    // Plane entropies of each bit layout, from whole rows evenly spread.
    const SampleRows sample(n_elems, channels);
    const int layouts = is_float(dtype) ? 2 : 1;  // plain, and rotated for floats
    PlaneCounts counts_of[2][4];
    if (esize == 2 && layouts == 2) {
        sample_counts_2byte(src, sample, counts_of[0], counts_of[1]);
    } else {
        std::vector<uint8_t> scratch;
        for (int rotate = 0; rotate < layouts; ++rotate)
            sample_counts(src, sample, esize, rotate != 0, &scratch, counts_of[rotate]);
    }
    Layout cands[2];
    double bits[2] = {0, 0};
    for (int rotate = 0; rotate < layouts; ++rotate) {
        Layout& cand = cands[rotate];
        cand.rotate = rotate != 0;
        cand.plane_entropy.resize(esize);
        for (unsigned p = 0; p < esize; ++p) {
            cand.plane_entropy[p] = entropy_bits(counts_of[rotate][p].data());
            bits[rotate] += std::min(8.0, cand.plane_entropy[p]);
        }
    }
    // Max mode codes a rotated float's sign by channel (encode_block's condition);
    // what that saves (at most a bit) is estimated where it could change the choice.
    const uint64_t rows = n_elems / channels;
    if (coding.signs_coded && layouts == 2 && esize > 1 && channels > 1 && rows >= kSignsMinRows &&
        bits[1] >= bits[0] - 1e-9 && bits[1] < bits[0] + 1) {
        cands[1].sign_saving = sign_method_saving(src, n_elems, channels, esize);
        bits[1] -= cands[1].sign_saving;
    }
    // Ties go to the plain layout, unless dense mode prefers the rotated one (for
    // float16, where its low plane, mantissa bits and a sign close to random, is
    // stored raw).
    const bool rotated_preferred = coding.rotated_preferred && rotation_preferred_for(dtype) &&
                                   n_elems >= kRotatedMinElems &&
                                   (esize == 1 || cands[1].plane_entropy[0] >= kIncompressibleBits);
    const double rotated_below = rotated_preferred ? bits[0] + kRotatedAllowance : bits[0] - 1e-9;
    best = std::move(cands[layouts == 2 && bits[1] < rotated_below ? 1 : 0]);
    best.try_rotated = coding.signs_coded && esize == 1 && layouts == 2 && !best.rotate && n_elems >= kRotatedMinElems;

    // Residual for the chosen layout: each channel's most common top byte, found
    // from kResidualRows rows (enough for a mode; few enough for one-byte counts).
    if (channels < 2 || rows < kMinRowsForResidual) return best;
    std::vector<uint8_t> tops;
    gather_tops(src, rows, channels, esize, best.rotate, &tops);
    std::vector<uint8_t> residual(channels, 0);
    // It is kept where what it saves over the whole tensor beats the table's size.
    const double table_cost = 2.0 * channels;
    const auto pays = [&](const TopCounts& c) {
        return c.saving(coding.fixed_width_coded) * double(n_elems) > table_cost;
    };
    // Decided first on every stride-th channel (at most kEstimateChannels): the
    // residual seldom pays, and counting each channel's values is most of the
    // analysis's cost on wide channels (fp16's sign and exponent byte).
    const uint32_t stride = (channels + kEstimateChannels - 1) / kEstimateChannels;
    thread_local ChannelValues values;  // (scratch: only dense mode reads it)
    TopCounts sampled;
    channel_statistics(tops.data(), channels, stride, residual.data(), &sampled,
                       coding.channel_coded ? &values : nullptr);
    if (!pays(sampled)) return best;
    if (coding.channel_coded) {
        // The (rarer) case where it might pay: what the grouped coder would save.
        const double per_elem = (grouped_bits(values, nullptr) - grouped_bits(values, residual.data())) /
                                (double(values.kept) * kResidualRows);
        if (per_elem / 8.0 * double(n_elems) <= table_cost) return best;
    }
    // Then on all channels, which the table needs.
    TopCounts all;
    if (stride > 1) {
        channel_statistics(tops.data(), channels, 1, residual.data(), &all, nullptr);
        if (!pays(all)) return best;
    } else {
        all = sampled;
    }
    best.plane_entropy[esize - 1] -= 8.0 * all.saving(false);
    best.residual = std::move(residual);
    best.try_rotated = false;  // the residual is the plain layout's
    return best;
}

}  // namespace kvcore::frame
