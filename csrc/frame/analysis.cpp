#include "frame/analysis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "frame/format.h"

namespace kvcore::frame {
namespace {

constexpr uint64_t kSampleElems = 1u << 14;  // elements looked at, at most
constexpr uint64_t kMinRowsForResidual = 64;  // residual table must pay for itself
constexpr uint64_t kResidualRows = 64;        // rows sampled per channel (fits one-byte counts)

bool is_float(DType d) {
    return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2 || d == DType::kFloat16 || d == DType::kBFloat16 ||
           d == DType::kFloat32;
}

template <unsigned E>
uint32_t element(const uint8_t* src, uint64_t i) {
    if constexpr (E == 1) {
        return src[i];
    } else if constexpr (E == 2) {
        uint16_t v;
        std::memcpy(&v, src + 2 * i, 2);
        return v;
    } else {
        uint32_t v;
        std::memcpy(&v, src + 4 * i, 4);
        return v;
    }
}

template <unsigned E>
uint32_t rotate_left1(uint32_t v) {
    constexpr unsigned bits = 8 * E;
    constexpr uint32_t mask = bits == 32 ? 0xffffffffu : ((1u << bits) - 1);
    return ((v << 1) | (v >> (bits - 1))) & mask;
}

// Histograms of one layout over the sampled rows.
struct LayoutStats {
    std::vector<std::array<uint32_t, 256>> planes;  // per plane
};

template <unsigned E>
void sample_stats(const uint8_t* src, uint64_t n_elems, bool rotate, uint64_t sample_rows, uint64_t stride,
                  uint64_t row_len, LayoutStats* st) {
    for (uint64_t r = 0; r < sample_rows; ++r) {
        const uint64_t base = (r * stride) * row_len;
        const uint64_t end = std::min(n_elems, base + row_len);
        for (uint64_t i = base; i < end; ++i) {
            uint32_t v = element<E>(src, i);
            if (rotate) v = rotate_left1<E>(v);
            for (unsigned p = 0; p < E; ++p) ++st->planes[p][(v >> (8 * p)) & 0xff];
        }
    }
}

// The top bytes of kResidualRows rows spread over the tensor, row-major
// (taken x channels); returns how many rows were taken.
template <unsigned E>
uint64_t gather_tops(const uint8_t* src, uint64_t rows, uint32_t channels, bool rotate, std::vector<uint8_t>* tops) {
    const uint64_t step = std::max<uint64_t>(1, rows / kResidualRows);
    const uint64_t taken = std::min<uint64_t>(kResidualRows, (rows + step - 1) / step);
    tops->resize(size_t(taken) * channels);
    uint8_t* out = tops->data();
    for (uint64_t k = 0; k < taken; ++k) {
        const uint64_t r = k * step;
        for (uint32_t c = 0; c < channels; ++c) {
            uint32_t v = element<E>(src, r * channels + c);
            if (rotate) v = rotate_left1<E>(v);
            *out++ = static_cast<uint8_t>(v >> (8 * (E - 1)));
        }
    }
    return taken;
}

// Each channel's mode (the most common top byte, the smallest on ties) and the
// counts over all channels. One channel at a time with small count tables that
// stay in L1 (a table per channel would not, for thousands of channels). The
// mode is tracked as the counts grow: a value's last occurrence sees its full
// count, so the largest (count, 255 - value) key seen is the mode's. Two count
// tables (even and odd rows) halve the chain of increments a common value makes.
void channel_modes(const uint8_t* tops, uint64_t taken, uint32_t channels, uint32_t* plain, uint8_t* mode) {
    uint32_t sums[4][256] = {};
    for (uint32_t c = 0; c < channels; ++c) {
        uint8_t counts[2][256] = {};  // <= kResidualRows per value
        uint32_t best = 0;
        for (uint64_t k = 0; k < taken; ++k) {
            const uint8_t t = tops[k * channels + c];
            const uint32_t n = uint32_t(++counts[k & 1][t]) + counts[~k & 1][t];
            const uint32_t key = n << 8 | (255u - t);
            best = key > best ? key : best;
            ++sums[k & 3][t];
        }
        mode[c] = static_cast<uint8_t>(255u - (best & 0xff));
    }
    for (int t = 0; t < 256; ++t) plain[t] += sums[0][t] + sums[1][t] + sums[2][t] + sums[3][t];
}

// Counts of the top bytes less each channel's residual (four tables, as above).
void residual_counts(const uint8_t* tops, uint64_t taken, uint32_t channels, const uint8_t* residual,
                     uint32_t* shifted) {
    uint32_t sums[4][256] = {};
    for (uint64_t k = 0; k < taken; ++k) {
        const uint8_t* row = tops + k * channels;
        for (uint32_t c = 0; c < channels; ++c) ++sums[c & 3][static_cast<uint8_t>(row[c] - residual[c])];
    }
    for (int t = 0; t < 256; ++t) shifted[t] += sums[0][t] + sums[1][t] + sums[2][t] + sums[3][t];
}

}  // namespace

double entropy_bits(const uint32_t* hist) {
    uint64_t total = 0;
    for (int s = 0; s < 256; ++s) total += hist[s];
    if (total == 0) return 0.0;
    double h = 0.0;
    for (int s = 0; s < 256; ++s) {
        if (hist[s] == 0) continue;
        const double p = double(hist[s]) / double(total);
        h -= p * std::log2(p);
    }
    return h;
}

uint32_t channel_count(const std::vector<uint64_t>& shape) {
    const size_t nd = shape.size();
    if (nd >= 2 && shape[nd - 1] > 0 && shape[nd - 2] > 0 && shape[nd - 1] * shape[nd - 2] <= kMaxChannels)
        return static_cast<uint32_t>(shape[nd - 1] * shape[nd - 2]);
    if (nd >= 1 && shape[nd - 1] > 0 && shape[nd - 1] <= kMaxChannels) return static_cast<uint32_t>(shape[nd - 1]);
    return 1;
}

Layout choose_layout(const uint8_t* src, uint64_t n_elems, DType dtype, uint32_t channels) {
    const unsigned esize = dtype_size(dtype);
    Layout best;
    best.plane_entropy.assign(esize, 8.0);
    if (n_elems == 0) return best;

    // Plane entropies of each bit layout, from whole rows evenly spread.
    const uint64_t row_len = channels > 1 ? channels : std::min<uint64_t>(n_elems, 4096);
    const uint64_t n_rows = n_elems / row_len;
    const uint64_t sample_rows = std::max<uint64_t>(1, std::min<uint64_t>(n_rows, kSampleElems / row_len));
    const uint64_t stride = std::max<uint64_t>(1, n_rows / sample_rows);
    double best_bits = 1e300;
    for (int rotate = 0; rotate <= (is_float(dtype) ? 1 : 0); ++rotate) {
        LayoutStats st;
        st.planes.assign(esize, {});
        switch (esize) {
            case 1: sample_stats<1>(src, n_elems, rotate, sample_rows, stride, row_len, &st); break;
            case 2: sample_stats<2>(src, n_elems, rotate, sample_rows, stride, row_len, &st); break;
            default: sample_stats<4>(src, n_elems, rotate, sample_rows, stride, row_len, &st); break;
        }
        Layout cand;
        cand.rotate = rotate != 0;
        cand.plane_entropy.resize(esize);
        double bits = 0;
        for (unsigned p = 0; p < esize; ++p) {
            cand.plane_entropy[p] = entropy_bits(st.planes[p].data());
            bits += std::min(8.0, cand.plane_entropy[p]);
        }
        if (bits < best_bits - 1e-9) {
            best_bits = bits;
            best = std::move(cand);
        }
    }

    // Residual for the chosen layout: each channel's most common top byte, found
    // from kResidualRows rows (enough for a mode; few enough for one-byte counts).
    const uint64_t rows = n_elems / channels;
    if (channels < 2 || rows < kMinRowsForResidual) return best;
    std::vector<uint8_t> tops;
    uint64_t taken = 0;
    switch (esize) {
        case 1: taken = gather_tops<1>(src, rows, channels, best.rotate, &tops); break;
        case 2: taken = gather_tops<2>(src, rows, channels, best.rotate, &tops); break;
        default: taken = gather_tops<4>(src, rows, channels, best.rotate, &tops); break;
    }
    std::array<uint32_t, 256> plain{};
    std::vector<uint8_t> residual(channels, 0);
    channel_modes(tops.data(), taken, channels, plain.data(), residual.data());
    std::array<uint32_t, 256> shifted{};
    residual_counts(tops.data(), taken, channels, residual.data(), shifted.data());
    const double top_plain = entropy_bits(plain.data());
    const double top_res = entropy_bits(shifted.data());
    // Keep it when the saving over the whole tensor beats the table's size.
    const double saving_bytes = (top_plain - top_res) / 8.0 * double(n_elems);
    if (top_res < top_plain && saving_bytes > 2.0 * channels) {
        best.plane_entropy[esize - 1] += top_res - top_plain;
        best.residual = std::move(residual);
    }
    return best;
}

}  // namespace kvcore::frame
