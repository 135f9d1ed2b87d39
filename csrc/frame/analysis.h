// Frame-level analysis: which layout codes this tensor smallest.
//
// From a sample of rows the encoder estimates, for each candidate layout
// (plain or rotated bits; with or without each channel's most common top byte
// subtracted), the order-0 entropy of every byte plane, and picks the layout
// with the smallest estimate; in max mode the rotated layout's estimate also
// counts what coding each channel's signs on their own saves, and dense mode
// takes a large float16 or float8 tensor's rotated layout unless the plain one estimates
// clearly smaller (see kRotatedAllowance in analysis.cpp). It also records
// which planes look incompressible (mantissa bytes), so blocks skip entropy
// coding for them. For dense mode a residual must also beat the
// channel-grouped coder's estimate, which follows each channel's distribution
// on its own; fast mode weighs it by the size of its fixed-width code.
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
    // Bits per element the signs method is estimated to save in this (rotated)
    // layout; estimated only where it could decide the choice (max mode), else 0.
    double sign_saving = 0;
    // Max mode, a float8 tensor of kRotatedMinElems elements or more without a
    // residual: the plain layout is chosen, but the rotated one estimates the same
    // (rotation permutes the byte's values), so the encoder codes the frame both
    // ways and keeps the smaller (codec.cpp, encode_rotated_if_smaller).
    bool try_rotated = false;
};

// How the frame's planes are to be coded, as far as the layout's choice depends on it.
struct LayoutCoding {
    // The top plane's coder conditions on channel groups (dense and max modes),
    // which a residual must then beat.
    bool channel_coded = false;
    // The sign of a rotated float is coded by channel (max mode's signs method),
    // which the rotated layout's estimate then counts in.
    bool signs_coded = false;
    // The top plane takes fixed-width codes (fast mode), by whose size a residual
    // is weighed instead of the order-0 entropy.
    bool fixed_width_coded = false;
    // Dense mode: of a large float16 or float8 tensor's two layouts the rotated one is taken
    // unless the plain one estimates clearly smaller (its top byte then splits into
    // symbols of the exponent and a mantissa bit, which decode faster).
    bool rotated_preferred = false;
};

// The coding of the planes under these options, which a layout is chosen for.
LayoutCoding layout_coding(const EncodeOptions& options);
bool same_coding(const LayoutCoding& a, const LayoutCoding& b);
// The mode a coding belongs to, for messages: "dense", "max", "fast" or "DEFLATE".
const char* coding_name(const LayoutCoding& coding);

// A layout chosen for one tensor, kept to code later tensors of the same kind
// with (CompressJob::layout): it holds the dtype, channel count and coding it
// was chosen for, which those tensors' must match.
struct AnalyzedLayout {
    DType dtype = DType::kUInt8;
    uint32_t channels = 0;
    LayoutCoding coding;
    Layout layout;
};

// A plane whose estimated order-0 entropy is at least this many bits per byte is
// stored raw (mantissa bytes).
constexpr double kIncompressibleBits = 7.9;

// Channels per row of a tensor: the product of its last two dimensions (one
// (head, dim) position is a channel), else its last one, when within
// kMaxChannels; else 1.
uint32_t channel_count(const std::vector<uint64_t>& shape);

// The layout of a tensor: rotation, residual and each plane's estimated entropy.
Layout choose_layout(const uint8_t* src, uint64_t n_elems, DType dtype, uint32_t channels,
                     const LayoutCoding& coding);

// Order-0 entropy in bits per symbol of a 256-bin histogram.
double entropy_bits(const uint32_t* hist);

}  // namespace kvcore::frame
