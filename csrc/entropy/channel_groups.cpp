#include "entropy/channel_groups.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/arch.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"
#include "entropy/histogram.h"
#include "entropy/huffman.h"
#include "shuffle/channel_transpose.h"

namespace kvcore::entropy {
namespace {

constexpr size_t kMinRows = 16;  // fewer rows: too few symbols per channel to rank
constexpr size_t kRankRows = 512;  // rows sampled to rank channels

// sums[c] += the bytes of channel c in rows 0, step, 2 * step, ... below rows.
// They are added in 16-bit partial sums (257 rows of bytes fit), which go into
// sums every 257 rows: twice the lanes per vector of 32-bit sums. restrict lets
// the compiler vectorize the loops.
inline __attribute__((always_inline)) void add_rows_impl(const uint8_t* plane, size_t rows, size_t step,
                                                         uint32_t channels, uint16_t* __restrict part,
                                                         uint32_t* __restrict sums) {
    constexpr size_t kPartRows = 65535 / 255;
    for (size_t r = 0; r < rows;) {
        std::fill(part, part + channels, uint16_t(0));
        for (size_t k = 0; k < kPartRows && r < rows; ++k, r += step) {
            const uint8_t* __restrict row = plane + r * channels;
            for (uint32_t c = 0; c < channels; ++c) part[c] = uint16_t(part[c] + row[c]);
        }
        for (uint32_t c = 0; c < channels; ++c) sums[c] += part[c];
    }
}

void add_rows_portable(const uint8_t* plane, size_t rows, size_t step, uint32_t channels, uint16_t* part,
                       uint32_t* sums) {
    add_rows_impl(plane, rows, step, channels, part, sums);
}

#if KVCORE_X86
__attribute__((target("avx2"))) void add_rows_avx2(const uint8_t* plane, size_t rows, size_t step,
                                                   uint32_t channels, uint16_t* part, uint32_t* sums) {
    add_rows_impl(plane, rows, step, channels, part, sums);
}
#endif

void add_rows(const uint8_t* plane, size_t rows, size_t step, uint32_t channels, uint32_t* sums) {
    std::vector<uint16_t> part(channels);
#if KVCORE_X86
    if (cpu::active_isa() & cpu::kIsaAvx2) add_rows_avx2(plane, rows, step, channels, part.data(), sums);
    else add_rows_portable(plane, rows, step, channels, part.data(), sums);
#else
    add_rows_portable(plane, rows, step, channels, part.data(), sums);
#endif
}

// The G byte's flag for a packed map (payload layout in channel_groups.h).
constexpr uint8_t kPackedMap = 0x80;

// Bits of a channel's group in a packed map of `groups` groups: 1, 2 or 3.
unsigned map_width(unsigned groups) { return groups <= 2 ? 1 : groups <= 4 ? 2 : 3; }

// The sum of the squares of n bytes, in 32-bit parts (255^2 * 65536 < 2^32),
// which the compiler vectorizes.
inline __attribute__((always_inline)) uint64_t sum_of_squares_impl(const uint8_t* __restrict p, size_t n) {
    uint64_t total = 0;
    for (size_t at = 0; at < n; at += 65536) {
        const size_t end = std::min(n, at + 65536);
        uint32_t part = 0;
        for (size_t i = at; i < end; ++i) part += uint32_t(p[i]) * p[i];
        total += part;
    }
    return total;
}

uint64_t sum_of_squares_portable(const uint8_t* p, size_t n) { return sum_of_squares_impl(p, n); }

#if KVCORE_X86
__attribute__((target("avx2"))) uint64_t sum_of_squares_avx2(const uint8_t* p, size_t n) {
    return sum_of_squares_impl(p, n);
}
#endif

uint64_t sum_of_squares(const uint8_t* p, size_t n) {
#if KVCORE_X86
    if (cpu::active_isa() & cpu::kIsaAvx2) return sum_of_squares_avx2(p, n);
#endif
    return sum_of_squares_portable(p, n);
}

size_t map_bytes(uint32_t channels, bool packed, unsigned groups) {
    return packed ? (size_t(channels) * map_width(groups) + 7) / 8 : (size_t(channels) + 1) / 2;
}

// Bytes of each stream size: 4 beside a 4-bit map; beside a packed one the fewest
// that hold 2 n + 256, more than any huffman payload of n symbols takes.
unsigned size_width(size_t symbols, bool packed) {
    if (!packed) return 4;
    unsigned w = 1;
    while ((2 * uint64_t(symbols) + 256) >> (8 * w)) ++w;
    return w;
}

// column[c] = where channel c's symbols start in the channel-major buffer, whose
// streams lie `stride` bytes apart.
template <typename T>
void column_starts(T* base, size_t stride, uint32_t channels, const uint32_t* slot, T** column) {
    for (uint32_t c = 0; c < channels; ++c) column[c] = base + size_t(slot[c]) * stride;
}

// Distance between the channel streams that the transpose writes. A tile stores
// a line into each of 16 streams at the same offset: streams a multiple of 2 KiB
// apart put those lines in the same few L1 sets, and the stores wait on each
// other (Zen 4, 32 channels of 16384 rows of random bytes, 512 KiB: 29 us, against
// 8 us with the streams a line further apart; standalone, best of 2000 calls). Such planes are
// transposed a line apart and then closed up (a 5 us move).
size_t transpose_stride(size_t rows) { return rows % 2048 == 0 && rows ? rows + 64 : rows; }

// Moves the streams written `stride` apart down to `rows` apart, in slot order
// (each moves down, onto space its predecessors have left).
void close_up_columns(uint8_t* base, size_t rows, size_t stride, uint32_t channels) {
    for (uint32_t k = 1; k < channels; ++k) std::memmove(base + k * rows, base + k * stride, rows);
}

// The counting sorts (radix_pass, order_channels): neighbouring channels often
// share a key (a digit of similar means, a group), and each count or placement
// of a key waits for the one before it through memory. The input is cut into
// kRadixSegments parts, each with its own counts and places, so that many
// chains run at once. Bucket d takes part 0's channels first, then part 1's, and
// so on: the sort stays stable.
constexpr unsigned kRadixSegments = 4;

// Calls f(g, i) for every index i of part g, parts [begin[g], begin[g + 1]): their
// first `shortest` indices side by side, then each part's rest in turn.
template <typename F>
inline void for_each_in_parts(const uint32_t* begin, uint32_t shortest, F f) {
    for (uint32_t k = 0; k < shortest; ++k)
        for (unsigned g = 0; g < kRadixSegments; ++g) f(g, begin[g] + k);
    for (unsigned g = 0; g < kRadixSegments; ++g)
        for (uint32_t i = begin[g] + shortest; i < begin[g + 1]; ++i) f(g, i);
}

// Byte b's bits spread over 8 bytes, bit i in byte i (little endian): a 1-bit map's groups.
struct BitBytes {
    uint64_t of[256];
    constexpr BitBytes() : of() {
        for (unsigned b = 0; b < 256; ++b)
            for (unsigned i = 0; i < 8; ++i) of[b] |= uint64_t((b >> i) & 1) << (8 * i);
    }
};
constexpr BitBytes kBitBytes;
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kBitBytes puts channel i's group in byte i");

// slot[c] = position of channel c when ordered by (group, channel); also
// returns the number of channels in each group (a counting sort in parts; two
// groups with their places in registers).
void order_channels(const uint8_t* group, uint32_t channels, unsigned groups, uint32_t* slot, uint32_t* count) {
    if (groups == 2) {
        uint32_t ones = 0;
        for (uint32_t c = 0; c < channels; ++c) ones += group[c];
        count[0] = channels - ones;
        count[1] = ones;
        uint32_t zero_at = 0, one_at = channels - ones;
        for (uint32_t c = 0; c < channels; ++c) {
            const uint32_t g = group[c], pick = 0u - g;  // (a select without a branch to mispredict)
            slot[c] = (one_at & pick) | (zero_at & ~pick);
            zero_at += g ^ 1;
            one_at += g;
        }
        return;
    }
    uint32_t begin[kRadixSegments + 1];
    for (unsigned p = 0; p <= kRadixSegments; ++p) begin[p] = uint32_t(uint64_t(channels) * p / kRadixSegments);
    const uint32_t shortest = begin[1] - begin[0];
    uint32_t place[kRadixSegments][kMaxChannelGroups] = {};
    for_each_in_parts(begin, shortest, [&](unsigned p, uint32_t c) { ++place[p][group[c]]; });
    uint32_t at = 0;
    for (unsigned g = 0; g < groups; ++g) {
        const uint32_t first = at;
        for (unsigned p = 0; p < kRadixSegments; ++p) {
            const uint32_t n = place[p][g];
            place[p][g] = at;
            at += n;
        }
        count[g] = at - first;
    }
    for_each_in_parts(begin, shortest, [&](unsigned p, uint32_t c) { slot[c] = place[p][group[c]]++; });
}

// Planes of fewer rows get a map of the k coarse groups (G = K) rather than of the
// fine ones (G = kMaxChannelGroups), for its fewer bits a channel (1 against 3 for
// K = 2: 1/8 bit a symbol at 16 rows), at the cost of transposing the plane again
// in the coarse groups' order; on longer planes the map costs little.
constexpr size_t kCoarseMapRows = 128;

unsigned mapped_groups(size_t rows, unsigned fine, unsigned k) { return rows < kCoarseMapRows ? k : fine; }

// Bytes before the streams: group counts, channel map, sizes of all streams but the last.
size_t head_bytes(uint32_t channels, size_t rows, bool packed, unsigned groups, unsigned k) {
    return 2 + map_bytes(channels, packed, groups) + size_width(rows * channels, packed) * size_t(k - 1);
}

// merged = the weights of group j of k (fine groups j * groups / k up to the next
// group's first); returns its symbol count.
size_t merge_fine(const uint32_t* fine, unsigned groups, unsigned k, unsigned j, const uint32_t* count, size_t rows,
                  uint32_t* merged) {
    std::fill(merged, merged + 256, 0);
    size_t len = 0;
    for (unsigned g = j * groups / k; g < (j + 1) * groups / k; ++g) {
        len += size_t(count[g]) * rows;
        for (int sym = 0; sym < 256; ++sym) merged[sym] += fine[size_t(g) * 256 + sym];
    }
    return len;
}

// Planes whose estimate comes this close to the capacity have their streams
// sized (each group's code built) before any is coded: a plane of mantissa bytes
// is estimated a few percent below its size and coded a little above it.
constexpr double kSizeCheckShare = 0.97;

// Bytes of the grouped stream with k merged groups, from each group's code.
size_t sized_streams(const uint32_t* fine, unsigned groups, unsigned k, const uint32_t* count, size_t rows,
                     uint32_t channels, bool exact, double lanes_allowance) {
    size_t total = head_bytes(channels, rows, true, mapped_groups(rows, groups, k), k);
    for (unsigned j = 0; j < k; ++j) {
        uint32_t merged[256];
        const size_t len = merge_fine(fine, groups, k, j, count, rows, merged);
        total += huffman_estimate(merged, len, exact, lanes_allowance);
    }
    return total;
}

// Symbols outside [lo, hi] have zero weight (hi >= lo): a channel group's
// symbols span a few values (exponents), and skipping the rest changes no sum.
double coded_bits(const uint32_t* hist, unsigned lo, unsigned hi) {
    unsigned first = hi, last = lo;
    for (unsigned s = lo; s <= hi; ++s) {
        if (hist[s]) {
            first = std::min(first, s);
            last = s;
        }
    }
    const double bits = order0_bits(hist, lo, hi);
    // Huffman codes cost a little above the entropy; each table costs its header
    // (huffman.cpp's compact one: a length a value from the first to the last).
    return bits * 1.01 + 8.0 * (13 + (last - first + 1) / 2.0);
}

// rank = the channels in increasing order of their sums, ties in channel order:
// a stable radix sort, a byte of the sums per pass. The sums are of at most
// 2 * kRankRows sampled rows of bytes, so below 2^24: three passes at most, and
// a byte that all sums share needs none (the top one, below 256 sampled rows).
static_assert(2 * kRankRows * 255 < (1u << 24), "channel sums must fit in three bytes");

void radix_pass(const uint32_t* sums, const uint32_t* from, uint32_t channels, unsigned shift, uint32_t* to) {
    uint32_t begin[kRadixSegments + 1];
    for (unsigned g = 0; g <= kRadixSegments; ++g) begin[g] = uint32_t(uint64_t(channels) * g / kRadixSegments);
    const uint32_t shortest = begin[1] - begin[0];  // parts differ in length by one at most
    uint32_t place[kRadixSegments][256] = {};
    auto digit = [&](uint32_t i) { return sums[from[i]] >> shift & 0xff; };
    for_each_in_parts(begin, shortest, [&](unsigned g, uint32_t i) { ++place[g][digit(i)]; });
    uint32_t at = 0;
    for (unsigned d = 0; d < 256; ++d)
        for (unsigned g = 0; g < kRadixSegments; ++g) {
            const uint32_t n = place[g][d];
            place[g][d] = at;
            at += n;
        }
    for_each_in_parts(begin, shortest, [&](unsigned g, uint32_t i) { to[place[g][digit(i)]++] = from[i]; });
}

}  // namespace

void rank_channels(const uint32_t* sums, uint32_t channels, uint32_t* rank) {
    uint32_t differ = 0;  // the bits in which some sum differs from the first
    for (uint32_t c = 0; c < channels; ++c) differ |= sums[c] ^ sums[0];
    unsigned shifts[3], passes = 0;
    for (unsigned shift = 0; shift < 24; shift += 8)
        if (differ >> shift & 0xff) shifts[passes++] = shift;
    std::vector<uint32_t> other(channels);
    // Passes alternate between the two buffers: start where an odd or even count ends in rank.
    uint32_t* from = passes % 2 ? other.data() : rank;
    uint32_t* to = passes % 2 ? rank : other.data();
    for (uint32_t c = 0; c < channels; ++c) from[c] = c;
    for (unsigned p = 0; p < passes; ++p) {
        radix_pass(sums, from, channels, shifts[p], to);
        std::swap(from, to);
    }
}

namespace {

struct Scratch {
    AlignedBuffer columns;  // the channel streams; the transposes store whole lines into them
    std::vector<uint32_t> slot;
    std::vector<uint8_t> group;
    std::vector<uint8_t*> column;
};

Scratch& thread_scratch(size_t bytes, uint32_t channels) {
    thread_local Scratch s;
    s.columns.ensure(bytes);
    if (s.slot.size() < channels) s.slot.resize(channels);
    if (s.group.size() < channels) s.group.resize(channels);
    if (s.column.size() < channels) s.column.resize(channels);
    return s;
}

}  // namespace

Status grouped_encode(const uint8_t* plane, size_t rows, uint32_t channels, double table_bits,
                      double lanes_allowance, uint32_t* hist, bool* exact, uint8_t* dst, size_t cap,
                      size_t* written, const uint32_t* channel_sums) {
    const Status not_better = make_status(Code::kBufferTooSmall, "channel grouping does not pay");
    *exact = true;
    if (channels < 2 || rows < kMinRows) {
        histogram(plane, rows * channels, hist);
        return not_better;
    }
    const unsigned groups = std::min<uint32_t>(kMaxChannelGroups, channels);
    const size_t stride = transpose_stride(rows);
    Scratch& s = thread_scratch(stride * channels, channels);

    // Rank channels by their mean symbol over a sample of rows; cut the ranking
    // into equal fine groups.
    const size_t step = std::max<size_t>(1, rows / kRankRows);
    std::vector<uint32_t> sums;
    if (!channel_sums || step != 1) {  // (all rows: the caller's sums are the sample's)
        sums.assign(channels, 0);
        add_rows(plane, rows, step, channels, sums.data());
        channel_sums = sums.data();
    }
    std::vector<uint32_t> rank(channels);
    rank_channels(channel_sums, channels, rank.data());
    for (unsigned g = 0; g < groups; ++g)
        for (uint32_t i = group_first_rank(g, channels, groups); i < group_first_rank(g + 1, channels, groups); ++i)
            s.group[rank[i]] = static_cast<uint8_t>(g);
    uint32_t count[kMaxChannelGroups];
    order_channels(s.group.data(), channels, groups, s.slot.data(), count);
    column_starts(s.columns.data(), stride, channels, s.slot.data(), s.column.data());
    shuffle::to_channel_major(plane, rows, channels, s.column.data());
    if (stride != rows) close_up_columns(s.columns.data(), rows, stride, channels);

    // Weights of each fine group (sampled: counting every symbol would cost about
    // half as much as coding them); pick the coarsening with the smallest estimate.
    std::vector<uint32_t> fine(size_t(groups) * 256);
    size_t offset = 0;
    for (unsigned g = 0; g < groups; ++g) {
        const size_t len = size_t(count[g]) * rows;
        *exact &= histogram_estimate(s.columns.data() + offset, len, &fine[size_t(g) * 256]);
        offset += len;
    }
    std::fill(hist, hist + 256, 0);
    for (unsigned g = 0; g < groups; ++g)
        for (int sym = 0; sym < 256; ++sym) hist[sym] += fine[size_t(g) * 256 + sym];
    unsigned lo = 0, hi = 255;  // the plane's symbols (the groups' are among them)
    while (lo < hi && hist[lo] == 0) ++lo;
    while (hi > lo && hist[hi] == 0) --hi;
    // The count is chosen by the estimate plus table_bits a table: the decode time
    // each table's build and its streams' setup take, in bits of size.
    double best_bits = coded_bits(hist, lo, hi);
    double best_score = best_bits + table_bits;
    unsigned best_k = 1;
    for (unsigned k = 2; k <= groups; k *= 2) {
        if (groups % k) break;
        double bits = 8.0 * double(head_bytes(channels, rows, true, mapped_groups(rows, groups, k), k));
        for (unsigned j = 0; j < k; ++j) {
            uint32_t merged[256];
            merge_fine(fine.data(), groups, k, j, count, rows, merged);
            bits += coded_bits(merged, lo, hi);
        }
        const double score = bits + double(k) * table_bits;
        if (score < best_score) {
            best_score = score;
            best_bits = bits;
            best_k = k;
        }
    }
    if (best_k == 1) return not_better;
    if (best_bits > kSizeCheckShare * 8.0 * double(cap) &&
        sized_streams(fine.data(), groups, best_k, count, rows, channels, *exact, lanes_allowance) > cap) {
        return make_status(Code::kBufferTooSmall, "grouped stream does not fit");
    }

    const unsigned mapped = mapped_groups(rows, groups, best_k);
    const size_t head = head_bytes(channels, rows, true, mapped, best_k);
    if (cap < head) return make_status(Code::kBufferTooSmall, "grouped stream does not fit");
    if (mapped != groups) {
        // The decoder orders a coarse group's channels by channel: transpose in that order.
        for (uint32_t c = 0; c < channels; ++c) s.group[c] = static_cast<uint8_t>(s.group[c] * best_k / groups);
        uint32_t coarse_count[kMaxChannelGroups];
        order_channels(s.group.data(), channels, mapped, s.slot.data(), coarse_count);
        column_starts(s.columns.data(), stride, channels, s.slot.data(), s.column.data());
        shuffle::to_channel_major(plane, rows, channels, s.column.data());
        if (stride != rows) close_up_columns(s.columns.data(), rows, stride, channels);
    }
    dst[0] = static_cast<uint8_t>(kPackedMap | mapped);
    dst[1] = static_cast<uint8_t>(best_k);
    uint8_t* map = dst + 2;
    const unsigned width = map_width(mapped);
    std::memset(map, 0, map_bytes(channels, true, mapped));
    for (uint32_t c = 0; c < channels; ++c) {
        const unsigned g = s.group[c];
        const size_t bit = size_t(c) * width;
        map[bit / 8] |= static_cast<uint8_t>(g << (bit % 8));
        if (bit % 8 + width > 8) map[bit / 8 + 1] |= static_cast<uint8_t>(g >> (8 - bit % 8));
    }
    const unsigned sizes = size_width(rows * channels, true);
    size_t pos = head;
    offset = 0;
    for (unsigned j = 0; j < best_k; ++j) {
        uint32_t merged[256];
        const size_t len = merge_fine(fine.data(), groups, best_k, j, count, rows, merged);
        size_t size = 0;
        KVCORE_RETURN_IF_ERROR(
            huffman_encode(s.columns.data() + offset, len, merged, dst + pos, cap - pos, &size, *exact,
                           lanes_allowance));
        if (j + 1 < best_k) put_le(dst + 2 + map_bytes(channels, true, mapped) + sizes * j, size, sizes);
        pos += size;
        offset += len;
    }
    *written = pos;
    return Status::ok();
}

bool channel_groups_may_pay(const uint8_t* plane, size_t rows, uint32_t channels, uint32_t table_bits,
                            uint32_t* sums) {
    if (channels < 2 || rows < kMinRows) return false;
    // With N symbols of sum T and sum of squares Q, and channel sums S_c, the share
    // of the symbols' variance that channel means explain is
    // eta2 = (C sum S_c^2 - T^2) / (N Q - T^2); both terms are at least 0
    // (Cauchy-Schwarz), and their products need 128 bits. Were symbols Gaussian
    // around their channel's mean, knowing it would save -log2(1 - eta2) / 2 >=
    // eta2 / (2 ln 2) bits a symbol, eta2 N / (2 ln 2) in all; the map of two groups
    // costs a bit a channel (planes this short map coarse groups), and the second
    // table table_bits. So: eta2 N >= 2 ln 2 (C + table_bits) (1.386, in thousandths
    // below).
    using Wide = unsigned __int128;
    std::fill(sums, sums + channels, 0);
    add_rows(plane, rows, 1, channels, sums);
    uint64_t total = 0;
    Wide channel_squares = 0;
    for (uint32_t c = 0; c < channels; ++c) {
        total += sums[c];
        channel_squares += uint64_t(sums[c]) * sums[c];
    }
    const uint64_t squares = sum_of_squares(plane, rows * channels);
    const Wide n = Wide(rows) * channels;
    const Wide all = n * squares - Wide(total) * total;
    const Wide between = channels * channel_squares - Wide(total) * total;
    static_assert(kMinRows < kCoarseMapRows, "planes this short map coarse groups");
    return all > 0 && between * n * 1000 >= all * 1386 * (Wide(channels) + table_bits);
}

Status grouped_decode(const uint8_t* src, size_t size, size_t rows, uint32_t channels, uint8_t* dst) {
    if (channels < 2) return corrupt("grouped plane: needs at least two channels");
    if (size < 2) return corrupt("grouped plane: payload too short");
    const bool packed = src[0] & kPackedMap;
    const unsigned groups = src[0] & ~kPackedMap, k = src[1];
    if (groups < 2 || groups > kMaxChannelGroups || groups > channels || k < 2 || k > groups || groups % k)
        return corrupt("grouped plane: bad group counts");
    const size_t head = head_bytes(channels, rows, packed, groups, k);
    if (size < head) return corrupt("grouped plane: payload too short for its map");
    Scratch& s = thread_scratch(rows * channels, channels);
    uint8_t* columns = s.columns.data();
    const uint8_t* map = src + 2;
    const size_t map_size = map_bytes(channels, packed, groups);
    const unsigned width = packed ? map_width(groups) : 4;
    uint32_t c = 0;
    if (width == 1) {  // two groups (what short planes map): eight channels a byte, each in range
        for (; c + 8 <= channels; c += 8) std::memcpy(&s.group[c], &kBitBytes.of[map[c / 8]], 8);
    }
    for (; c < channels; ++c) {
        const size_t bit = size_t(c) * width;
        unsigned v = map[bit / 8] >> (bit % 8);
        if (bit % 8 + width > 8) v |= unsigned(map[bit / 8 + 1]) << (8 - bit % 8);
        s.group[c] = static_cast<uint8_t>(v & ((1u << width) - 1));
        if (s.group[c] >= groups) return corrupt("grouped plane: channel group out of range");
    }
    const size_t used_bits = size_t(channels) * width;
    if (used_bits % 8 && (map[map_size - 1] >> (used_bits % 8)) != 0)
        return corrupt("grouped plane: map padding not zero");
    const unsigned sizes = size_width(rows * channels, packed);
    uint32_t count[kMaxChannelGroups];
    order_channels(s.group.data(), channels, groups, s.slot.data(), count);

    size_t pos = head, offset = 0;
    for (unsigned j = 0; j < k; ++j) {
        size_t len = 0;
        for (unsigned g = j * groups / k; g < (j + 1) * groups / k; ++g) len += size_t(count[g]) * rows;
        const size_t stream = j + 1 < k ? size_t(get_le(src + 2 + map_size + sizes * j, sizes)) : size - pos;
        if (stream > size - pos) return corrupt("grouped plane: stream runs past the payload");
        KVCORE_RETURN_IF_ERROR(huffman_decode(src + pos, stream, columns + offset, len));
        pos += stream;
        offset += len;
    }
    column_starts(columns, rows, channels, s.slot.data(), s.column.data());
    shuffle::to_row_major(s.column.data(), rows, channels, dst);
    return Status::ok();
}

}  // namespace kvcore::entropy
