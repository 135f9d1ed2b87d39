#include "frame/plane_methods.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/little_endian.h"
#include "deflate/deflate_plane.h"
#include "entropy/channel_groups.h"
#include "entropy/fastcode.h"
#include "entropy/histogram.h"
#include "entropy/huffman.h"
#include "frame/analysis.h"
#include "lz/row_repeats.h"
#include "lz/zstd_plane.h"
#include "shuffle/low_bits.h"
#include "shuffle/packed_bits.h"
#include "shuffle/sign_bits.h"

namespace kvcore::frame {
namespace {

constexpr int kZstdLevel = 1;
constexpr int kDeflateLevel = 1;  // QATzip's default level; ISA-L level 1
// zstd is tried only when at least this share of rows repeats an earlier row's
// start but not the whole row: partial matches are what it finds beyond the
// rows method, at several times the cost (on stories260K it pays at 15% of
// rows, not at 6%).
constexpr float kPartialRepeats = 0.1f;
// The sample counts a row as repeated in part where its first 16 bytes repeat. In a
// plane estimated under kZstdMinEntropy bits a byte those bytes hold under 32 bits,
// and repeat by chance (a float32's rotated sign plane, 1 bit a byte: the signs of a
// few channels), and a match that short costs zstd about what it saves. On the 96
// kvdata frames its sample ran on 592 such planes (36 ms, one thread; 63 us for a
// 256 KiB block of stories260K) and lost on every one. Below kZstdSparseEntropy it
// is tried again: there zstd's long runs beat the order-0 codes' floor of one bit a
// byte (a plane of mostly one value).
constexpr float kZstdMinEntropy = 2.0f;
constexpr float kZstdSparseEntropy = 0.5f;
// zstd codes such planes at 0.3-0.6 GB/s and decodes them at about 1 GB/s, several
// times slower than the entropy coders: fast mode keeps it only where it saves
// 1/kZstdFastSaving of the plane (long matches, which also decode fast), dense mode
// 1/kZstdDenseSaving, max mode wherever it is smaller.
constexpr size_t kZstdFastSaving = 2;
constexpr size_t kZstdDenseSaving = 4;
// Before coding a whole plane with zstd, its first 1/kZstdSample is coded, and the
// whole only where that sample comes within kZstdSampleSlack of the size to beat.
// On the stories260K and MiniLM planes where zstd is tried, the samples of the
// planes it won came within 5% of the best other method and those of the planes it
// lost came 40-70% above it; a sample costs an eighth of a trial.
constexpr size_t kZstdSample = 8;
constexpr size_t kZstdSampleMinPlane = 65536;
constexpr double kZstdSampleSlack = 1.15;
// With at least this share of rows repeating whole, the rows method beats coding
// the whole plane (its table costs about 1 + log2(distinct) bits per row).
constexpr float kRowsWin = 1.0f / 16;
// Below that share the whole plane is coded too, unless the rows method comes in
// this much under its estimate of the whole (encode_rows: the distinct rows'
// coded size scaled to every row). Repeated rows can be cheaper than the rest
// (padding), which the estimate misses: on the 96 kvdata frames no plane where
// coding the whole won was skipped, and stories260K bf16's 512 KiB exponent
// planes with 3-4% of rows repeated (rows 1.3-2.6% under the estimate) skip a
// trial of 80-130 us each.
constexpr double kRowsEstimateMargin = 0.01;
// A plane that fast mode decodes fused with its block's merge when coded whole
// (PlanePolicy::fused_decode) decodes in three passes as a rows plane (its
// distinct rows, the join, the merge): below this share of repeated rows the
// whole plane is coded too, and kept unless over 1/kRowsFusedSlack larger.
constexpr float kRowsWinFused = 0.25f;
constexpr size_t kRowsFusedSlack = 8;
// The low-bit split (method 8) is taken where storing a plane's low k bits raw
// costs at most kLowBitsCost bit per symbol more than coding whole bytes, by
// the order-0 estimate: the Huffman coder then decodes symbols of 8 - k bits,
// more per table lookup (float16's top byte: k = 1 or 2, 15-30% less decode
// time for 0.05-0.2% of size).
constexpr double kLowBitsCost = 1.0 / 32;
// Below this many bits per symbol the table lookups already decode several
// symbols each (bfloat16 exponents): the split would cost size for little speed.
constexpr double kLowBitsMinEntropy = 4.0;
constexpr size_t kLowBitsMinPlane = 4096;
// How far under a field's width (bits a byte) a plane's estimate may be for the
// packed method to take the whole field (packable_width).
constexpr double kNearFullField = 1.0 / 8;
// Dense mode charges each channel group's Huffman table this many bits on top of
// its estimated size when it picks how many groups to code: a table costs its
// build and its streams' setup at decode, about 3 us, the time of some 20 KB of
// output, while on KV store chunks the eighth table often saves under 0.3%.
// 256 bytes a table: Qwen-shaped chunk frames of 256 tokens decoded 1.08-1.19x
// faster for 0.05-0.08% of size, MiniLM 1.05-1.09x for 0.04-0.05%, and no
// kvdata file grew by more than 0.06% (fp8 planes, whose decode is slow anyway,
// keep their tables). Max mode charges nothing.
constexpr double kTableDecodeBits = 2048;
// Dense mode tries channel groups on planes of at least this many rows, and on
// fewer only where they may pay for their map, a bit a channel for two groups,
// and the second table's decode charge (entropy::channel_groups_may_pay). The
// trial (ranking, transposing and counting the channels) took about a third of
// compressing a 16-token page of one layer's K or V (bench's Qwen3-8B-shaped
// chunk, 1024 channels), where the channel means explain 6-42% of the exponents'
// variance: the rule sends those from about 26% to the trial. Max mode tries
// from 16 rows.
constexpr size_t kDenseGroupedMinRows = 32;
// With EncodeOptions::lanes, dense mode codes a Huffman stream with the
// lane-interleaved code (huffman.h) where that is at most this share larger
// (kvdata exponent streams: about 1.1%); max mode only where it is not larger.
constexpr double kLanesAllowance = 1.0 / 32;
constexpr uint8_t kPackedHead = 3;  // the packed method's shift, width and base

// Scratch for candidates, so the best can be kept; kinds 0..5 are separate
// buffers (0, 2: rows; 1: low bits, zstd; 3, 4, 5: signs, also inside rows).
uint8_t* thread_candidate_scratch(size_t n, unsigned kind = 0) {
    thread_local std::vector<uint8_t> scratch[6];
    if (scratch[kind].size() < n) scratch[kind].resize(n);
    return scratch[kind].data();
}

// Codes the plane with the mode's entropy coder. *constant is set instead when
// the plane holds one value (found from the histogram the coders need anyway).
// counted: the plane's exact counts where the caller has them, else null.
Status entropy_encode(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t cap,
                      Method* method, size_t* written, bool* constant, const uint32_t* counted = nullptr) {
    uint32_t hist[256];
    bool exact = true;
    const bool whole_rows = policy.mode == Mode::kDense && policy.channels > 1 && n % policy.channels == 0;
    bool grouped = whole_rows && (policy.max_ratio || n / policy.channels >= kDenseGroupedMinRows);
    std::vector<uint32_t> channel_sums;  // the short-plane rule's, which the trial ranks by
    if (whole_rows && !grouped) {
        channel_sums.resize(policy.channels);
        grouped = entropy::channel_groups_may_pay(plane, n / policy.channels, policy.channels,
                                                  uint32_t(kTableDecodeBits), channel_sums.data());
        // Counted exactly, as the grouped coder counts such short planes in fine groups
        // under 8 KiB (all but the widest): not tried, they code as they did.
        if (!grouped) {
            if (counted) std::copy(counted, counted + 256, hist);
            else entropy::histogram(plane, n, hist);
        }
    }
    const double lanes_allowance = !policy.lanes ? -1.0 : policy.max_ratio ? 0.0 : kLanesAllowance;
    Status st = make_status(Code::kBufferTooSmall, "not tried");
    if (grouped) {
        const double table_bits = policy.max_ratio ? 0.0 : kTableDecodeBits;
        st = entropy::grouped_encode(plane, n / policy.channels, policy.channels, table_bits, lanes_allowance, hist,
                                     &exact, dst, cap, written, channel_sums.empty() ? nullptr : channel_sums.data());
    } else if (policy.mode == Mode::kFast) {
        exact = entropy::histogram_weights(plane, n, hist);  // fastcode escapes what the sample missed
    } else if (!whole_rows) {
        exact = entropy::histogram_estimate(plane, n, hist);
    }
    *constant = exact && hist[plane[0]] == n;  // weights that are estimates never prove it
    if (*constant || st.code != Code::kBufferTooSmall) {
        *method = Method::kGrouped;
        return st;
    }
    if (policy.mode == Mode::kFast) {
        *method = Method::kFastcode;
        return exact ? entropy::fastcode_encode(plane, n, hist, dst, cap, written)
                     : entropy::fastcode_encode_estimated(plane, n, hist, dst, cap, written);
    }
    *method = Method::kHuffman;
    return entropy::huffman_encode(plane, n, hist, dst, cap, written, exact, lanes_allowance);
}

// The largest k in 1..7 worth splitting off the plane (dense mode), or 0. Planes
// of frames whose estimate for the plane is below the entropy floor (bfloat16 and
// fp32 exponents) are not sampled again block by block. *high_exact: high[] holds
// the exact counts of the plane's high parts (byte >> k) for the k returned, which
// the weights are where the plane is small (float16 pages: no second count).
unsigned choose_low_bits(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint32_t* high,
                         bool* high_exact) {
    *high_exact = false;
    if (n < kLowBitsMinPlane || policy.estimated_entropy < kLowBitsMinEntropy) return 0;
    uint32_t hist[256];
    const bool exact = entropy::histogram_weights(plane, n, hist);  // a sample: an estimate is all this needs
    // A Huffman code spends at least one bit per symbol, whatever the entropy.
    const double whole = std::max(1.0, entropy_bits(hist));
    if (whole < kLowBitsMinEntropy) return 0;
    for (unsigned k = 7; k >= 1; --k) {
        std::fill(high, high + 256, 0);
        for (unsigned s = 0; s < 256; ++s) high[s >> k] += hist[s];
        if (std::max(1.0, entropy_bits(high)) + k <= whole + kLowBitsCost) {
            *high_exact = exact;
            return k;
        }
    }
    return 0;
}

// The widest field the packed method takes on a plane whose order-0 entropy the
// frame estimates at h bits a byte, or 0 (h = 0: a constant plane). Two widths qualify:
//  * w <= max(1, h) + kLowBitsCost: Huffman spends at least max(1, h) bits a byte,
//    so the field costs at most kLowBitsCost bit more;
//  * the narrowest field that holds h bits, ceil(h - kLowBitsCost) (the slack: the
//    estimate's sample), where h is within kNearFullField of it. A Huffman code is
//    never longer than the field, so it saves at most that much there, at a tenth
//    of packing's speed (float32's top mantissa byte, cast from bfloat16: 7 bits
//    estimated at 6.95, Huffman-coded in 7.005). Dense mode tries the entropy coder
//    first within the packed size (encode_plane), so no plane gets larger.
// A plane estimated above both cannot be one, unless by a few rare values (then
// the blocks without them still can): other planes, exponents among them, skip
// the check.
unsigned packable_width(float h) {
    if (!(h > 0) || h > 7) return 0;
    const double covered = std::floor(std::max(1.0, double(h)) + kLowBitsCost);
    const double narrowest = std::ceil(double(h) - kLowBitsCost);
    if (narrowest - h <= kNearFullField) return unsigned(std::max(covered, narrowest));
    return covered >= h - kLowBitsCost ? unsigned(covered) : 0;
}

// The field the packed method would store plane[0, n) as, where the frame's estimate
// allows one (packable_width) and the bytes differ in no wider a field (the
// estimate's sample may have missed a value); width 0 otherwise. *constant: the
// plane holds one value.
shuffle::VaryingBits packable_field(const uint8_t* plane, size_t n, const PlanePolicy& policy, bool* constant) {
    const unsigned widest = packable_width(policy.estimated_entropy);
    if (widest == 0) return {};
    const shuffle::VaryingBits v = shuffle::varying_bits(plane, n);
    *constant = v.width == 0;
    return v.width <= widest ? v : shuffle::VaryingBits{};
}

// The packed method: [shift][width][base][the fields, packed]; returns its size.
size_t encode_packed(const uint8_t* plane, size_t n, const shuffle::VaryingBits& v, uint8_t* dst) {
    dst[0] = v.shift;
    dst[1] = v.width;
    dst[2] = v.base;
    shuffle::pack_fields(plane, n, v, dst + kPackedHead);
    return kPackedHead + shuffle::low_bits_packed_size(n, v.width);
}

// The low-bits method with k bits: [k][packed low bits][inner method][inner payload],
// the high bits coded by the mode's entropy coder (high_counts: their exact counts,
// or null). Same contract as entropy_encode, except that it never reports a
// constant plane (choose_low_bits never splits one).
Status encode_low_bits(const uint8_t* plane, size_t n, unsigned k, const uint32_t* high_counts,
                       const PlanePolicy& policy, uint8_t* dst, size_t cap, size_t* written) {
    const size_t packed = shuffle::low_bits_packed_size(n, k);
    const size_t head = 1 + packed + 1;
    if (cap <= head + 1) return make_status(Code::kBufferTooSmall, "low bits: not smaller");
    uint8_t* high = thread_candidate_scratch(n, 1);
    dst[0] = static_cast<uint8_t>(k);
    shuffle::split_low_bits(plane, n, k, high, dst + 1);
    Method m = Method::kRaw;
    size_t size = 0;
    bool constant = false;
    const Status st = entropy_encode(high, n, policy, dst + head, cap - head, &m, &size, &constant, high_counts);
    if (constant) {
        m = Method::kConstant;
        dst[head] = high[0];
        size = 1;
    } else if (!st.is_ok()) {
        return st;
    }
    dst[head - 1] = static_cast<uint8_t>(m);
    *written = head + size;
    return Status::ok();
}

// kOk: kept; kBufferTooSmall: not smaller than cap; anything else: a real failure.
bool not_smaller(const Status& st) { return st.code == Code::kBufferTooSmall; }

// The signs method: [mantissa bits packed][flips][inner method][the sign bytes
// coded by channel group] (shuffle/sign_bits.h), into dst when smaller than
// limit (kBufferTooSmall otherwise). plane must not be dst.
Status encode_signs(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t limit,
                    size_t* written) {
    const uint32_t channels = policy.sign_channels;
    if (channels < 2 || n % channels || n / channels < kSignsMinRows)
        return make_status(Code::kBufferTooSmall, "signs: not whole rows of enough channels");
    const size_t rows = n / channels;
    const size_t mantissa = shuffle::sign_bits_mantissa_size(n);
    const size_t head = mantissa + shuffle::sign_bits_flips_size(channels) + 1;
    const size_t sn = shuffle::sign_bits_signs_size(rows, channels);
    if (head + 1 >= limit) return make_status(Code::kBufferTooSmall, "signs: not smaller");
    uint8_t* signs = thread_candidate_scratch(sn, 3);
    uint8_t* coded = thread_candidate_scratch(sn, 4);
    shuffle::split_sign_bits(plane, rows, channels, dst, dst + mantissa, signs);
    PlanePolicy inner;
    inner.mode = Mode::kDense;
    inner.estimated_entropy = 0;  // no low-bit split of sign bytes
    inner.channels = channels;
    Method m = Method::kRaw;
    size_t size = 0;
    KVCORE_RETURN_IF_ERROR(encode_plane(signs, sn, inner, coded, sn, &m, &size));
    if (head + size >= limit) return make_status(Code::kBufferTooSmall, "signs: not smaller");
    dst[head - 1] = static_cast<uint8_t>(m);
    std::memcpy(dst + head, coded, size);
    *written = head + size;
    return Status::ok();
}

// Whether the repeat sample leaves zstd a chance on a plane: enough of the rows
// that the rows method left (1 - whole_rows of them) repeat in part. Outside sparse
// planes, zstd's literals are coded order-0, no better than the plane's own coders,
// so it gains only on matched bytes, and a row repeated in part is matched in part:
// to save the share of the plane a mode asks of it, at least that share of those
// rows must repeat in part (fast mode asks for half of all rows). On the 96 kvdata frames every
// dense trial below that bound lost (partial shares 0.10-0.17: samples of 100-250 us
// on 512 KiB planes).
bool zstd_may_pay(const PlanePolicy& policy, float whole_rows) {
    const float h = policy.estimated_entropy;
    const bool sparse = h < kZstdSparseEntropy;
    if (!sparse && h < kZstdMinEntropy) return false;
    const float partial = policy.prefix_repeats - whole_rows;
    if (policy.mode == Mode::kFast) return partial >= 1.0f / kZstdFastSaving;
    if (policy.max_ratio || sparse) return partial >= kPartialRepeats;
    return partial >= std::max(kPartialRepeats, (1 - whole_rows) / kZstdDenseSaving);
}

// Whether zstd may code plane[0, n) in fewer than limit bytes, judged from its first
// 1/kZstdSample (always true for small planes). out: scratch of >= limit bytes.
bool zstd_may_win(const uint8_t* plane, size_t n, size_t limit, uint8_t* out) {
    if (n < kZstdSampleMinPlane) return true;
    const size_t m = n / kZstdSample;
    const size_t sample_limit = std::min(limit, static_cast<size_t>(double(limit) / kZstdSample * kZstdSampleSlack));
    size_t size = 0;
    return lz::zstd_plane_encode(plane, m, kZstdLevel, out, sample_limit, &size).is_ok();
}

// The rows method: the row table, then the distinct rows coded by the best
// method the policy allows (rows and zstd excluded), in scratch (*result);
// kBufferTooSmall when not smaller than limit or no row repeats. *share = the
// share of rows that repeat whole; *whole_estimate = the distinct rows' coded
// size scaled to every row (what coding the whole plane would take, were the
// repeated rows like the others); *constant: every byte of the plane is one value.
Status encode_rows(const uint8_t* plane, size_t n, const PlanePolicy& policy, size_t limit, const uint8_t** result,
                   size_t* written, float* share, double* whole_estimate, bool* constant) {
    *share = 0;
    *whole_estimate = 0;
    const size_t rb = policy.row_bytes;
    if (rb == 0 || n % rb) return make_status(Code::kBufferTooSmall, "rows: not whole rows");
    const size_t rows = n / rb;
    // The largest row table, the method byte, the distinct rows.
    uint8_t* out = thread_candidate_scratch(lz::row_table_bound(rows) + 1 + n, 0);
    *result = out;
    size_t table = 0, copies = 0;
    const uint8_t* distinct = nullptr;
    if (const SharedRows& shared = policy.shared_rows; shared.table != nullptr) {
        // The element rows' table differs from this plane's only in its row length.
        std::memcpy(out, shared.table, shared.table_size);
        put_u32(out, static_cast<uint32_t>(rb));
        table = shared.table_size;
        copies = get_u32(out + 4);
        distinct = shared.distinct;
    } else {
        uint8_t* own = thread_candidate_scratch(n, 2);
        copies = lz::split_rows(plane, n, rb, own, out, &table);
        distinct = own;
    }
    if (copies == 0) return make_status(Code::kBufferTooSmall, "rows: no row repeats");
    *share = float(copies) / float(rows);
    const size_t dn = n - copies * rb;
    if (dn == rb && std::all_of(distinct, distinct + rb, [&](uint8_t b) { return b == distinct[0]; })) {
        *constant = true;
        return make_status(Code::kBufferTooSmall, "rows: the plane is constant");
    }
    if (table + 1 + (dn ? 1 : 0) >= limit) return make_status(Code::kBufferTooSmall, "rows: not smaller");
    PlanePolicy inner = policy;
    inner.try_lz = false;
    inner.shared_rows = SharedRows{};
    Method m = Method::kRaw;
    size_t size = 0;
    KVCORE_RETURN_IF_ERROR(encode_plane(distinct, dn, inner, out + table + 1, dn, &m, &size));
    out[table] = static_cast<uint8_t>(m);
    if (table + 1 + size >= limit) return make_status(Code::kBufferTooSmall, "rows: not smaller");
    *written = table + 1 + size;
    *whole_estimate = double(size) * double(n) / double(dn);
    return Status::ok();
}

}  // namespace

bool one_value(const uint8_t* plane, size_t n) {
    const uint64_t v = 0x0101010101010101ull * plane[0];
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t differ = 0;
        for (size_t k = 0; k < 64; k += 8) {
            uint64_t w;
            std::memcpy(&w, plane + i + k, 8);
            differ |= w ^ v;
        }
        if (differ) return false;
    }
    return std::all_of(plane + i, plane + n, [&](uint8_t b) { return b == plane[0]; });
}

const char* method_name(uint8_t method) {
    switch (static_cast<Method>(method)) {
        case Method::kRaw: return "raw";
        case Method::kHuffman: return "huffman";
        case Method::kFastcode: return "fastcode";
        case Method::kZstd: return "zstd";
        case Method::kDeflate: return "deflate";
        case Method::kConstant: return "constant";
        case Method::kGrouped: return "grouped";
        case Method::kRows: return "rows";
        case Method::kLowBits: return "lowbits";
        case Method::kSigns: return "signs";
        case Method::kPacked: return "packed";
    }
    return "unknown";
}

Status encode_plane(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t cap,
                    Method* method, size_t* written) {
    if (cap < n) return make_status(Code::kBufferTooSmall, "plane output capacity below the plane size");
    if (policy.deflate) {
        // DEFLATE planes (QAT-compatible, deflate/): raw DEFLATE pieces, or raw when that does not shrink.
        // DEFLATE's LZ stage also takes planes that only repeat (duplicate rows).
        if ((policy.try_entropy || policy.try_lz) && n > 1) {
            size_t size = 0;
            const Status st = deflate::deflate_plane_encode(plane, n, policy.backend, kDeflateLevel, dst, n - 1,
                                                            &size, nullptr, 1);
            if (st.is_ok()) {
                *method = Method::kDeflate;
                *written = size;
                return Status::ok();
            }
            if (!not_smaller(st)) return st;
        }
        std::memcpy(dst, plane, n);
        *method = Method::kRaw;
        *written = n;
        return Status::ok();
    }
    Method best_method = Method::kRaw;
    size_t best = n;
    const uint8_t* best_data = dst;  // candidates in scratch are copied at the end: plane may be dst
    float whole_rows = 0;
    double whole_estimate = 0;
    bool constant = false;
    if (policy.try_lz && n > 1) {
        const uint8_t* out = nullptr;
        size_t size = 0;
        const Status st = encode_rows(plane, n, policy, n, &out, &size, &whole_rows, &whole_estimate, &constant);
        if (st.is_ok()) {
            best_method = Method::kRows;
            best = size;
            best_data = out;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    // Coding the whole plane is skipped where enough rows repeat whole that
    // coding only the distinct ones is smaller anyway, or where the rows method
    // came in clearly under its estimate of the whole plane.
    const bool rows_beat_estimate = best_method == Method::kRows && !policy.fused_decode &&
                                    double(best) <= whole_estimate * (1 - kRowsEstimateMargin);
    if (!constant && policy.try_entropy && n > 1 && best > 1 && !rows_beat_estimate &&
        whole_rows < (policy.fused_decode ? kRowsWinFused : kRowsWin)) {
        const size_t limit = policy.fused_decode && best_method == Method::kRows
                                 ? std::min(n - 1, best + best / kRowsFusedSlack)
                                 : best - 1;
        // (plane is dst only for planes that skip entropy coding; packing and the split need them apart)
        Method m = Method::kLowBits;  // entropy_encode sets its own method
        size_t size = 0;
        Status st = make_status(Code::kBufferTooSmall, "not coded");
        const shuffle::VaryingBits field = plane != dst ? packable_field(plane, n, policy, &constant)
                                                        : shuffle::VaryingBits{};
        const size_t packed = field.width ? kPackedHead + shuffle::low_bits_packed_size(n, field.width) : 0;
        if (packed && packed < best) {
            // A Huffman code spends at least a bit a byte, so one bit packed is never beaten; a
            // wider field may be, by the channel-grouped code: tried first, within the packed size.
            if (field.width >= 2 && policy.mode != Mode::kFast)
                st = entropy_encode(plane, n, policy, dst, packed - 1, &m, &size, &constant);
            if (not_smaller(st)) {
                m = Method::kPacked;
                size = encode_packed(plane, n, field, dst);
                st = Status::ok();
            }
        } else if (!constant) {
            uint32_t high[256];
            bool high_exact = false;
            const unsigned k = policy.mode == Mode::kDense && plane != dst
                                   ? choose_low_bits(plane, n, policy, high, &high_exact)
                                   : 0;
            st = k ? encode_low_bits(plane, n, k, high_exact ? high : nullptr, policy, dst, limit, &size)
                   : entropy_encode(plane, n, policy, dst, limit, &m, &size, &constant);
        }
        if (st.is_ok() && !constant) {
            best_method = m;
            best = size;
            best_data = dst;
        } else if (!constant && !not_smaller(st)) {
            return st;
        }
    }
    if (constant) {
        dst[0] = plane[0];
        *method = Method::kConstant;
        *written = 1;
        return Status::ok();
    }
    // Sign bits by channel, into dst unless a candidate sits there.
    if (policy.sign_channels > 1 && best > 1 && plane != dst) {
        const bool dst_taken = best_data == dst && best_method != Method::kRaw;
        uint8_t* out = dst_taken ? thread_candidate_scratch(best, 5) : dst;
        size_t size = 0;
        const Status st = encode_signs(plane, n, policy, out, best, &size);
        if (st.is_ok()) {
            best_method = Method::kSigns;
            best = size;
            best_data = out;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    // zstd, where it may pay (zstd_may_pay), kept where it saves what the mode asks.
    const bool fast = policy.mode == Mode::kFast;
    if (policy.try_lz && n > 1 && best > 1 && zstd_may_pay(policy, whole_rows)) {
        const size_t limit = fast ? best / kZstdFastSaving
                                  : best - (policy.max_ratio ? 1 : std::max<size_t>(1, best / kZstdDenseSaving));
        uint8_t* out = thread_candidate_scratch(limit, 1);
        size_t size = 0;
        const Status st = zstd_may_win(plane, n, limit, out)
                              ? lz::zstd_plane_encode(plane, n, kZstdLevel, out, limit, &size)
                              : make_status(Code::kBufferTooSmall, "zstd: its sample does not win");
        if (st.is_ok()) {
            best_method = Method::kZstd;
            best = size;
            best_data = out;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    if (best_data != dst) std::memcpy(dst, best_data, best);
    if (best_method == Method::kRaw && dst != plane) std::memcpy(dst, plane, n);
    *method = best_method;
    *written = best;
    return Status::ok();
}

Status parse_rows_payload(const uint8_t* payload, size_t size, size_t n, RowsPayload* r) {
    KVCORE_RETURN_IF_ERROR(lz::parse_row_table(payload, size, n, &r->table));
    const size_t t = r->table.size;
    if (t == size) return corrupt("rows plane: no method for its distinct rows");
    r->inner = payload[t];
    if (r->inner == static_cast<uint8_t>(Method::kRows)) return corrupt("rows plane: nested rows method");
    r->data = payload + t + 1;
    r->size = size - t - 1;
    return Status::ok();
}

Status decode_plane(uint8_t method, const uint8_t* payload, size_t size, size_t n, uint32_t channels,
                    uint8_t* scratch, const uint8_t** out, Xxh3Stripes* hash) {
    *out = scratch;
    switch (static_cast<Method>(method)) {
        case Method::kRaw:
            if (size != n) return corrupt("raw plane: payload size does not match the block");
            *out = payload;
            return Status::ok();
        case Method::kConstant:
            if (size != 1) return corrupt("constant plane: payload must be one byte");
            std::memset(scratch, payload[0], n);
            return Status::ok();
        case Method::kHuffman: return entropy::huffman_decode(payload, size, scratch, n);
        case Method::kFastcode: return entropy::fastcode_decode_hashed(payload, size, scratch, n, hash);
        case Method::kZstd: return lz::zstd_plane_decode(payload, size, scratch, n);
        case Method::kGrouped:
            if (channels < 2 || n % channels) return corrupt("grouped plane in a block without whole rows");
            return entropy::grouped_decode(payload, size, n / channels, channels, scratch);
        case Method::kDeflate: return deflate::deflate_plane_decode(payload, size, scratch, n, Backend::kSoftware, 1);
        case Method::kRows: {
            RowsPayload r;
            KVCORE_RETURN_IF_ERROR(parse_rows_payload(payload, size, n, &r));
            thread_local std::vector<uint8_t> rows_scratch;
            const size_t dn = r.table.distinct * r.table.row_bytes;
            if (rows_scratch.size() < dn) rows_scratch.resize(dn);
            const uint8_t* distinct = nullptr;
            KVCORE_RETURN_IF_ERROR(decode_plane(r.inner, r.data, r.size, dn, channels, rows_scratch.data(), &distinct));
            return lz::join_rows(r.table, distinct, scratch);
        }
        case Method::kLowBits: {
            if (size < 1 || !shuffle::valid_low_bits(payload[0])) return corrupt("low bits plane: bad bit count");
            const unsigned k = payload[0];
            const size_t packed = shuffle::low_bits_packed_size(n, k);
            if (size < 2 + packed) return corrupt("low bits plane: payload too short");
            const uint8_t inner = payload[1 + packed];
            if (inner == static_cast<uint8_t>(Method::kRows) || inner == static_cast<uint8_t>(Method::kLowBits))
                return corrupt("low bits plane: nested rows or low bits method");
            const uint8_t* high = nullptr;
            KVCORE_RETURN_IF_ERROR(
                decode_plane(inner, payload + 2 + packed, size - 2 - packed, n, channels, scratch, &high));
            if (high != scratch) std::memcpy(scratch, high, n);  // a raw inner plane points into the payload
            if (!shuffle::join_low_bits(scratch, n, k, payload + 1))
                return corrupt("low bits plane: a symbol wider than 8 - k bits, or padding bits set");
            return Status::ok();
        }
        case Method::kPacked: {
            if (size < kPackedHead) return corrupt("packed plane: payload too short");
            shuffle::VaryingBits v;
            v.shift = payload[0];
            v.width = payload[1];
            v.base = payload[2];
            if (!shuffle::valid_packing(v)) return corrupt("packed plane: bad field (shift, width or base)");
            if (size != kPackedHead + shuffle::low_bits_packed_size(n, v.width))
                return corrupt("packed plane: payload size does not match the block");
            if (!shuffle::unpack_fields(payload + kPackedHead, n, v, scratch))
                return corrupt("packed plane: padding bits set");
            return Status::ok();
        }
        case Method::kSigns: {
            if (channels < 2 || n % channels) return corrupt("signs plane in a block without whole rows");
            const size_t rows = n / channels;
            const size_t mantissa = shuffle::sign_bits_mantissa_size(n);
            const size_t head = mantissa + shuffle::sign_bits_flips_size(channels) + 1;
            if (size < head) return corrupt("signs plane: payload too short");
            const uint8_t inner = payload[head - 1];
            if (inner == static_cast<uint8_t>(Method::kRows) || inner == static_cast<uint8_t>(Method::kLowBits) ||
                inner == static_cast<uint8_t>(Method::kSigns))
                return corrupt("signs plane: nested rows, low bits or signs method");
            const size_t sn = shuffle::sign_bits_signs_size(rows, channels);
            thread_local std::vector<uint8_t> signs_scratch;
            if (signs_scratch.size() < sn) signs_scratch.resize(sn);
            const uint8_t* signs = nullptr;
            KVCORE_RETURN_IF_ERROR(
                decode_plane(inner, payload + head, size - head, sn, channels, signs_scratch.data(), &signs));
            if (!shuffle::join_sign_bits(payload, payload + mantissa, signs, rows, channels, scratch))
                return corrupt("signs plane: padding bits set");
            return Status::ok();
        }
    }
    return corrupt("unknown plane method " + std::to_string(method));
}

}  // namespace kvcore::frame
