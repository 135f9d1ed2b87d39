// Channel-grouped Huffman coding of a plane with channel structure ("dense"
// mode's context model).
//
// The top byte plane of a KV block is rows x channels (a channel is one (head,
// dim) position), and its distribution depends strongly on the channel. The
// encoder ranks channels by their mean symbol, cuts the ranking into G fine
// groups of equal size (G <= 8), and codes the symbols of each of K coarse
// groups (unions of adjacent fine groups, K dividing G, chosen by estimated
// size and table count: grouped_encode) as one order-0 Huffman stream with its
// own table. Within the stream the symbols are channel-major, so the decoder
// decodes K contiguous streams and transposes them back into rows in one
// cache-blocked pass.
//
// Payload: [G u8, + 128 for a packed map][K u8][group of each channel]
//          [size of streams 0..K-2][K huffman streams (huffman.h)].
// A packed map takes 1, 2 or 3 bits a channel (G = 2, <= 4, <= 8) and sizes of
// as few bytes as the plane's symbols need; the 4-bit map and 4-byte sizes are
// what encoders wrote before (docs/FORMAT.md). Channels are ordered by (group in
// the map, channel index); coarse group k holds the map's groups [k*G/K,
// (k+1)*G/K). The encoder maps its 8 fine groups on planes of 128 rows or more,
// the K coarse ones (G = K) on shorter planes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace kvcore::entropy {

// Fine groups at most (more tables cost more to build than they save).
constexpr unsigned kMaxChannelGroups = 8;

// rank = the channels in increasing order of their sums (each below 2^24), ties
// in channel order: how the encoder ranks channels, for the layout analysis too.
void rank_channels(const uint32_t* sums, uint32_t channels, uint32_t* rank);

// The first rank of fine group g (g <= groups) when ranked channels are cut
// into groups: rank i is in group i * groups / channels.
constexpr uint32_t group_first_rank(unsigned g, uint32_t channels, unsigned groups) {
    return uint32_t((uint64_t(g) * channels + groups - 1) / groups);
}

// Encodes rows x channels symbols (row-major). Always fills hist[256] with the
// plane's symbol weights: the exact counts when *exact is set, else estimates
// (histogram_estimate) that are nonzero for every symbol of the plane.
// K minimizes the estimated size plus table_bits for each table (a decode-time
// charge; 0: the smallest estimate). Each stream is coded as huffman_encode with
// lanes_allowance codes it. kBufferTooSmall when that is one table (no
// grouping), or the result does not fit in cap: the caller then codes the plane
// with plain huffman, using hist. channel_sums: each channel's sum over all rows
// where the caller has it (channel_groups_may_pay's), else null.
Status grouped_encode(const uint8_t* plane, size_t rows, uint32_t channels, double table_bits,
                      double lanes_allowance, uint32_t* hist, bool* exact, uint8_t* dst, size_t cap,
                      size_t* written, const uint32_t* channel_sums = nullptr);

// Whether coding rows x channels symbols (row-major) in
// two channel groups may pay for their map, a bit a channel on such short planes,
// and for table_bits charged for the second table: at least the rows
// grouped_encode ranks channels on, and channel means that explain enough of the
// symbols' variance (channel_groups.cpp). Dense mode tries groups on planes of few
// rows only then (frame/plane_methods.cpp). Computed in integers: the same answer
// on every machine. sums[channels] receives each channel's sum over all rows (for
// grouped_encode, which ranks channels by them).
bool channel_groups_may_pay(const uint8_t* plane, size_t rows, uint32_t channels, uint32_t table_bits,
                            uint32_t* sums);

// Decodes exactly rows x channels symbols into dst.
Status grouped_decode(const uint8_t* src, size_t size, size_t rows, uint32_t channels, uint8_t* dst);

}  // namespace kvcore::entropy
