// Frame-level analysis: which layout codes this tensor smallest.
//
// From a sample of rows the encoder estimates, for each candidate layout
// (plain or rotated bits; with or without each channel's most common top byte
// subtracted), the order-0 entropy of every byte plane, and picks the layout
// with the smallest estimate. It also records which planes look incompressible
// (mantissa bytes), so blocks skip entropy coding for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "frame/codec.h"

namespace kvcore::frame {

struct Layout {
    bool rotate = false;
    std::vector<uint8_t> residual;      // one byte per channel; empty: no residual
    std::vector<double> plane_entropy;  // estimated bits per byte of each plane, chosen layout
};

// Channels per row of a tensor: the product of its last two dimensions (one
// (head, dim) position is a channel), else its last one, when within
// kMaxChannels; else 1.
uint32_t channel_count(const std::vector<uint64_t>& shape);

Layout choose_layout(const uint8_t* src, uint64_t n_elems, DType dtype, uint32_t channels);

// Order-0 entropy in bits per symbol of a 256-bin histogram.
double entropy_bits(const uint32_t* hist);

}  // namespace kvcore::frame
