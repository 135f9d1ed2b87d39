#include "frame/codec.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#include "checksum/checksum.h"
#include "checksum/xxh3_stripes.h"
#include "common/arch.h"
#include "common/aligned_buffer.h"
#include "common/huge_pages.h"
#include "cpu/cpu_features.h"
#include "entropy/fastcode.h"
#include "entropy/huffman.h"
#include "frame/analysis.h"
#include "frame/block_commit.h"
#include "frame/format.h"
#include "frame/plane_methods.h"
#include "frame/recent_outputs.h"
#include "lz/row_repeats.h"
#include "parallel/thread_pool.h"
#include "shuffle/shuffle.h"

namespace kvcore::frame {
namespace {

constexpr size_t kMinRowBytes = 16;   // shorter channel rows are grouped
constexpr size_t kRepeatRows = 8192;  // rows the repeat detector looks at, at most
constexpr size_t kVerifyPieceBytes = 64u << 10;  // decoded bytes merged and hashed at a time

// Scratch planes of a block of `elems` elements sit this far apart: each starts
// on a cache line, with a line to spare for a plane moved along its line (see
// encode_block).
size_t plane_stride(size_t elems) { return round_up_to_line(elems) + kCacheLine; }

// Per-thread scratch: the planes of one block.
struct Scratch {
    AlignedBuffer planes;
    // Plane p, starting `offset` (< 64) bytes into a cache line.
    uint8_t* plane(unsigned p, size_t block_elems, size_t offset) {
        return planes.data() + p * plane_stride(block_elems) + offset;
    }
    // The block's shared rows (shared_rows): the element rows' table, their distinct
    // rows, and those split into planes.
    AlignedBuffer row_table, distinct_elems, distinct_planes;
};

Scratch& thread_scratch(unsigned esize, size_t block_elems) {
    thread_local Scratch s;
    s.planes.ensure(esize * plane_stride(block_elems));
    return s;
}

size_t block_bound(size_t block_elems, unsigned esize) {
    return kBlockPrefixBytes + esize * (kPlanePrefixBytes + block_elems);
}

// A cheap 64-bit key of a row's first 16 bytes (rows are at least that long).
inline __attribute__((always_inline)) uint64_t row_key(const uint8_t* p) {
    uint64_t a, b;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + 8, 8);
    const unsigned __int128 m = (unsigned __int128)(a ^ 0x9E3779B97F4A7C15ull) * (b ^ 0xC2B2AE3D27D4EB4Full);
    return uint64_t(m) ^ uint64_t(m >> 64);
}

// How much the plane repeats rows (a token seen before, zero padding): the share
// of rows whose leading bytes equal an earlier row's, over a sample of rows, in
// a direct-mapped table of row keys: a collision only forgets the older row,
// and there is no probing (no unpredictable branches; this runs on every
// plane). Rows of entropy-coded noise practically never match, so a sixteenth
// of repeated rows means the rows method or an LZ stage may pay (the encoder
// then measures them).
struct RowRepeats {
    float share = 0;
    bool search = false;  // the plane's rows are searched (worth_searching)
};

// The row length compared: channels, or a multiple of them of at least kMinRowBytes.
size_t repeat_row_bytes(uint32_t channels) {
    return channels >= kMinRowBytes ? channels : channels * ((kMinRowBytes + channels - 1) / channels);
}

constexpr size_t kRepeatMinRows = 16;  // fewer rows are not sampled (no repeats)

// Rows 0, step, 2 step, ... below rows whose key is already in the table t (slots, a
// power of two), each key stored over its slot. The key is of a row's first 16
// bytes, or with kEnds of its first and last 16 (the whole row, up to 32 bytes).
template <bool kEnds>
inline __attribute__((always_inline)) size_t count_repeats_impl(const uint8_t* plane, size_t rows, size_t row,
                                                                size_t step, uint32_t* t, size_t slots) {
    size_t repeats = 0;
    for (size_t r = 0; r < rows; r += step) {
        const uint8_t* p = plane + r * row;
        const uint64_t key = kEnds ? row_key(p) ^ (row_key(p + row - 16) * 0xBF58476D1CE4E5B9ull) : row_key(p);
        uint32_t& slot = t[(key >> 7) & (slots - 1)];
        const uint32_t stored = static_cast<uint32_t>(key >> 32) | 1;  // 0 marks an empty slot
        repeats += slot == stored;
        slot = stored;
    }
    return repeats;
}
size_t count_repeats(const uint8_t* plane, size_t rows, size_t row, size_t step, uint32_t* t, size_t slots,
                     bool ends) {
    return ends ? count_repeats_impl<true>(plane, rows, row, step, t, slots)
                : count_repeats_impl<false>(plane, rows, row, step, t, slots);
}
#if KVCORE_X86
// With BMI2's mulx the key's 128-bit product need not go through rax and rdx:
// without it GCC reloads a constant and spills the product to the stack every row
// (stories260K bf16/2 dense compress 1.00-1.03x with mulx, ad hoc A/B).
__attribute__((target("bmi2"))) size_t count_repeats_bmi2(const uint8_t* plane, size_t rows, size_t row,
                                                          size_t step, uint32_t* t, size_t slots, bool ends) {
    return ends ? count_repeats_impl<true>(plane, rows, row, step, t, slots)
                : count_repeats_impl<false>(plane, rows, row, step, t, slots);
}
#endif

// ends: rows keyed by their first and last 16 bytes (count_repeats_impl).
RowRepeats repeated_rows(const uint8_t* plane, size_t n, uint32_t channels, bool ends = false) {
    RowRepeats out;
    const size_t row = repeat_row_bytes(channels);
    const size_t rows = n / row;
    if (rows < kRepeatMinRows) return out;
    const size_t step = (rows + kRepeatRows - 1) / kRepeatRows;  // bounds the work on short rows
    const size_t looked = (rows + step - 1) / step;
    size_t slots = 64;
    while (slots < 4 * looked) slots *= 2;
    // 32-bit keys keep the table in L2 (128 KiB at most); clearing it per call
    // (about 1% of coding the plane) keeps the answer a function of the plane.
    thread_local std::vector<uint32_t> table;
    if (table.size() < slots) table.resize(slots);
    uint32_t* t = table.data();
    std::memset(t, 0, slots * sizeof(uint32_t));
#if KVCORE_X86
    const size_t repeats = (cpu::active_isa() & cpu::kIsaAvx2)
                               ? count_repeats_bmi2(plane, rows, row, step, t, slots, ends)
                               : count_repeats(plane, rows, row, step, t, slots, ends);
#else
    const size_t repeats = count_repeats(plane, rows, row, step, t, slots, ends);
#endif
    out.share = float(repeats) / float(looked);
    return out;
}

// Whether a plane whose sampled rows repeat their first 16 bytes this often (share)
// has its rows searched: the rows method, and zstd where they repeat in part. A
// search costs 60-70 us on a 512 KiB plane of 32-byte rows and pays for rows that
// repeat whole. Dense mode samples again with keys of whole rows (their first and
// last 16 bytes) where under an eighth repeat a prefix, and searches only where a
// sixteenth repeat whole (kRowsWin in plane_methods.cpp). stories260K bf16 has an
// exponent plane with 8% of its sampled prefixes and 4% of its rows repeated: its
// search took 62 us, and the rows method came 2.6% under its estimate of the whole
// plane (dense compress of stories260K bf16/2 1.03-1.06x, 0.15% larger).
bool worth_searching(const uint8_t* plane, size_t n, uint32_t channels, float share, const EncodeOptions& o) {
    if (share * 16 < 1) return false;
    if (o.max_ratio || o.deflate || o.mode != Mode::kDense || share * 8 >= 1) return true;  // (DEFLATE matches prefixes)
    return repeated_rows(plane, n, channels, true).share * 16 >= 1;
}

// Planes whose sampled shares of repeated rows are within this of each other
// repeat (nearly) only the rows their elements repeat.
constexpr float kSharedRowsSpread = 1.0f / 64;

// The block's element rows searched once, for planes that would each search
// their rows: a row that repeats whole repeats in every plane, so the element
// rows' table is valid for each plane, and where every plane that is not
// constant repeats rows about equally often it is the table each plane's own
// search would find. One search over longer rows costs less than one a plane
// (stories260K bf16, per 1 MiB block: 73-98 us against 123-160 us for its two
// planes). Plane p's entry names its bytes of the distinct rows, split from
// them as the block was; none (table nullptr) for fewer than two such planes,
// or where their shares differ.
std::array<SharedRows, 4> shared_rows(const uint8_t* block, size_t n, unsigned esize,
                                      const shuffle::PlaneTransform& t, size_t row, const RowRepeats* repeats,
                                      const bool* constant, Scratch& s) {
    std::array<SharedRows, 4> shared{};
    unsigned planes = 0;
    float lo = 1, hi = 0;
    bool all_search = true;
    for (unsigned p = 0; p < esize; ++p) {
        if (constant[p]) continue;
        ++planes;
        lo = std::min(lo, repeats[p].share);
        hi = std::max(hi, repeats[p].share);
        all_search &= repeats[p].search;
    }
    if (planes < 2 || !all_search || hi - lo > kSharedRowsSpread || n % row) return shared;
    const size_t rows = n / row;
    s.row_table.ensure(lz::row_table_bound(rows));
    s.distinct_elems.ensure(n * esize);
    size_t table_size = 0;
    const size_t copies =
        lz::split_rows(block, n * esize, row * esize, s.distinct_elems.data(), s.row_table.data(), &table_size);
    if (copies == 0) return shared;
    // Rows are whole channels: the residual's phase at each distinct row is the block's.
    s.distinct_planes.ensure(esize * plane_stride(n));
    uint8_t* split_to[4];
    for (unsigned p = 0; p < esize; ++p) split_to[p] = s.distinct_planes.data() + p * plane_stride(n);
    shuffle::split(s.distinct_elems.data(), (rows - copies) * row, esize, t, split_to);
    for (unsigned p = 0; p < esize; ++p) shared[p] = SharedRows{s.row_table.data(), table_size, split_to[p]};
    return shared;
}

shuffle::PlaneTransform transform_of(const Header& h, uint64_t first_elem) {
    shuffle::PlaneTransform t;
    t.rotate = (h.flags & kFlagRotate) != 0;
    if (h.flags & kFlagResidual) {
        t.residual = h.residual.data();
        t.period = h.channels;
        t.phase = static_cast<uint32_t>(first_elem % h.channels);
    }
    return t;
}

// t for the elements from `done` on (the residual's phase moved along).
shuffle::PlaneTransform moved_on(shuffle::PlaneTransform t, size_t done) {
    t.phase = static_cast<uint32_t>((t.phase + done) % t.period);
    return t;
}

// Whether merge_hashed can write a block's output (bytes from logical byte offset
// on) in one pass: it lies in one run, or every run boundary falls on an XXH3 block
// from the block's start and its last piece holds the input's last 64 bytes.
bool chains_runs(const OutputRuns& dst, size_t offset, size_t bytes) {
    size_t left = 0;
    dst.at(offset, &left);
    if (left >= bytes) return true;  // (always so for a contiguous output)
    const size_t last = (offset + bytes) % dst.run_bytes;  // bytes of the last piece; 0: a whole run
    return dst.run_bytes % shuffle::kXxh3BlockBytes == 0 && left % shuffle::kXxh3BlockBytes == 0 &&
           (last == 0 || last >= 64);
}

// Elements per block: the requested bytes (default by mode), rounded down to
// whole rows (at least one).
uint32_t block_elems_for(uint32_t block_bytes, Mode mode, unsigned esize, uint32_t channels) {
    if (block_bytes == 0) block_bytes = mode == Mode::kFast ? kDefaultFastBlockBytes : kDefaultBlockBytes;
    const uint32_t elems = std::max<uint32_t>(1, block_bytes / esize);
    return std::max(channels, elems / channels * channels);
}

// 0 (the mode's default) or a size within [64, kMaxBlockBytes].
Status check_block_bytes(uint32_t block_bytes) {
    if (block_bytes != 0 && (block_bytes > kMaxBlockBytes || block_bytes < 64))
        return invalid("block_bytes must be within [64, " + std::to_string(kMaxBlockBytes) + "]");
    return Status::ok();
}

// Keeps the first failure of a parallel loop.
class FirstError {
public:
    void set(Status st) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (status_.is_ok()) status_ = std::move(st);
    }
    bool failed() {
        std::lock_guard<std::mutex> lock(mutex_);
        return !status_.is_ok();
    }
    Status take() {
        std::lock_guard<std::mutex> lock(mutex_);
        return status_;
    }

private:
    std::mutex mutex_;
    Status status_;
};

// Encodes one block into out (at least block_bound bytes).
Status encode_block(const uint8_t* src, uint64_t first, size_t n, const Header& h, const Layout& layout,
                    const EncodeOptions& o, Scratch& s, uint8_t* out, size_t cap, size_t* size) {
    const unsigned esize = dtype_size(h.dtype);
    // The sign of a rotated float sits in bit 0 of plane 0 (the "max" mode codes it by channel).
    const uint32_t sign_channels =
        o.max_ratio && o.mode == Mode::kDense && !o.deflate && layout.rotate && esize > 1 && h.channels > 1
            ? h.channels
            : 0;
    // A plane that measured incompressible is split straight into its place in
    // the block (plane 0 sits at a known offset), saving a copy of it, unless
    // its signs are to be coded.
    const bool direct = layout.plane_entropy[0] >= kIncompressibleBits && sign_channels == 0;
    const shuffle::PlaneTransform t = transform_of(h, first);
    const uint8_t* const in = src + first * esize;
    const uint64_t seed = block_seed(h, first / h.block_elems);
    // The block's checksum, fed by the split where it can (the input's stripes,
    // from L1 as the split reads them). A separate XXH3 pass took 5.9% of MiniLM
    // bf16 and 6.4% of stories260K fp16 dense compress; fused, the split took 3.2
    // and 6.0 points more (perf); dense compress 0.99-1.07x (medians, docs/CHANGES.md).
    Xxh3Stripes hash;
    bool hashed = false;
    const uint8_t* planes[4];
    if (esize == 1 && !direct && !t.rotate && t.residual == nullptr) {
        planes[0] = in;  // one plane, untransformed: the input itself, not a copy
    } else {
        // The split's stores are aligned when every plane sits at one offset in
        // its cache line (shuffle::split peels the elements before the first
        // line); a direct plane 0 sets that offset.
        uint8_t* const in_frame = out + kBlockPrefixBytes + kPlanePrefixBytes;
        const size_t offset = direct ? reinterpret_cast<uintptr_t>(in_frame) % kCacheLine : 0;
        uint8_t* split_to[4];
        for (unsigned p = 0; p < esize; ++p) split_to[p] = s.plane(p, h.block_elems, offset);
        if (direct) split_to[0] = in_frame;
        if (n * esize >= Xxh3Stripes::kMinLength) {
            xxh3_stripes_begin(&hash, seed, n * esize);
            hashed = shuffle::split_hashed(in, n, esize, t, split_to, &hash);
        }
        if (!hashed) shuffle::split(in, n, esize, t, split_to);
        std::copy(split_to, split_to + esize, planes);
    }
    // (where nothing was fed, checksum64, whose own SIMD pass is faster than finishing every stripe)
    put_u64(out, hashed && hash.fed > 0 ? xxh3_stripes_finish(&hash, in) : checksum64(in, n * esize, seed));
    // Which planes hold one byte value, and how much the others repeat rows.
    //
    // A plane of one byte value, in whole rows and at least kRepeatMinRows of them, is
    // one row repeated: the sample would send it to the rows method, which would find
    // it constant. Found by a pass over its bytes instead (float32 cast from bfloat16
    // has two such planes in four).
    //
    // A plane of near-random bytes (a float's low mantissa bits) repeats a row by
    // chance practically never, only where whole values repeat, and then the top
    // plane repeats too: outside max mode and DEFLATE frames it is sampled only where
    // at least 1/32 of the top plane's sampled rows repeat, half the share that has a
    // plane searched (the samples of two planes that repeat the same rows differ by
    // their collisions: 4096 rows with 7% repeated sampled under 1/16 in one plane,
    // over it in the other). A sample takes about 9 us a 512 KiB plane.
    const size_t row_bytes = repeat_row_bytes(h.channels);
    bool constant[4] = {};
    RowRepeats repeats[4];
    const unsigned top = esize - 1;
    for (unsigned q = 0; q < esize; ++q) {
        const unsigned p = top - q;
        constant[p] = !o.deflate && n % row_bytes == 0 && n / row_bytes >= kRepeatMinRows && one_value(planes[p], n);
        if (constant[p]) continue;
        if (p != top && !o.max_ratio && !o.deflate && !constant[top] && repeats[top].share * 32 < 1 &&
            layout.plane_entropy[p] >= kIncompressibleBits)
            continue;
        repeats[p] = repeated_rows(planes[p], n, h.channels);
        repeats[p].search = worth_searching(planes[p], n, h.channels, repeats[p].share, o);
    }
    const std::array<SharedRows, 4> shared =
        o.deflate ? std::array<SharedRows, 4>{}
                  : shared_rows(in, n, esize, t, row_bytes, repeats, constant, s);
    size_t pos = kBlockPrefixBytes;
    Method low_method = Method::kRaw;  // plane 0's
    for (unsigned p = 0; p < esize; ++p) {
        PlanePolicy policy;
        policy.mode = o.mode;
        policy.deflate = o.deflate;
        policy.backend = o.backend;
        policy.try_entropy = layout.plane_entropy[p] < kIncompressibleBits;
        policy.estimated_entropy = static_cast<float>(layout.plane_entropy[p]);
        if (constant[p]) {
            out[pos] = static_cast<uint8_t>(Method::kConstant);
            put_u32(out + pos + 1, 1);
            out[pos + kPlanePrefixBytes] = planes[p][0];
            pos += kPlanePrefixBytes + 1;
            if (p == 0) low_method = Method::kConstant;
            continue;
        }
        policy.try_lz = repeats[p].search;
        policy.row_bytes = static_cast<uint32_t>(row_bytes);
        policy.prefix_repeats = repeats[p].share;
        policy.shared_rows = shared[p];
        // Channel context modelling for the exponent-carrying plane.
        policy.channels = p + 1 == esize && o.mode == Mode::kDense ? h.channels : 1;
        policy.sign_channels = p == 0 ? sign_channels : 0;
        // (decode_fast_pair's blocks: fast mode, 2-byte elements, no residual, a raw low plane)
        policy.fused_decode =
            o.mode == Mode::kFast && esize == 2 && p == 1 && t.residual == nullptr && low_method == Method::kRaw;
        policy.max_ratio = o.max_ratio;
        policy.lanes = o.lanes;
        Method method = Method::kRaw;
        size_t written = n;
        if (!(p == 0 && direct && !policy.try_lz)) {
            KVCORE_RETURN_IF_ERROR(encode_plane(planes[p], n, policy, out + pos + kPlanePrefixBytes,
                                                cap - pos - kPlanePrefixBytes, &method, &written));
        }
        if (p == 0) low_method = method;
        out[pos] = static_cast<uint8_t>(method);
        put_u32(out + pos + 1, static_cast<uint32_t>(written));
        pos += kPlanePrefixBytes + written;
    }
    *size = pos;
    return Status::ok();
}

// Fast mode's usual block of 2-byte floats, a raw low plane and a fastcode high
// plane, written to one run of the output: the high plane is merged with the low
// one as it is decoded (entropy::fastcode_decode_merged, AVX-512 or AVX2), hashed
// from registers, and only its last groups pass through scratch. (Decoding the plane to scratch
// first, then merging, writes and reads it once more, and the merge's memory
// traffic then waits for no decoding work to overlap it.) False where the block
// is not such a block (*st untouched); else *st is the block's outcome.
bool decode_fast_pair(const uint8_t* block, size_t size, uint64_t first, size_t n, const Header& h,
                      const shuffle::PlaneTransform& t, uint8_t* out, shuffle::Stores stores, Scratch& scratch,
                      Status* st) {
    if (dtype_size(h.dtype) != 2 || t.residual != nullptr || 2 * n < Xxh3Stripes::kMinLength ||
        !(cpu::active_isa() & (cpu::kIsaAvx512 | cpu::kIsaAvx2)))
        return false;
    // Both plane prefixes and sizes as the general path checks them: a raw low plane of n
    // bytes, then a fastcode plane that ends the block.
    size_t pos = kBlockPrefixBytes;
    if (size - pos < kPlanePrefixBytes || block[pos] != static_cast<uint8_t>(Method::kRaw) ||
        get_u32(block + pos + 1) != n || size - pos - kPlanePrefixBytes < n)
        return false;
    const uint8_t* low = block + pos + kPlanePrefixBytes;
    pos += kPlanePrefixBytes + n;
    if (size - pos < kPlanePrefixBytes || block[pos] != static_cast<uint8_t>(Method::kFastcode) ||
        get_u32(block + pos + 1) != size - pos - kPlanePrefixBytes)
        return false;
    const uint8_t* high = block + pos + kPlanePrefixBytes;
    const size_t high_size = size - pos - kPlanePrefixBytes;
    Xxh3Stripes hash;
    xxh3_stripes_begin(&hash, block_seed(h, first / h.block_elems), 2 * n);
    entropy::HighPlaneMerge m;
    m.low = low;
    m.rotate = t.rotate;
    m.dst = out;
    m.streaming = stores == shuffle::Stores::kStreaming;
    m.hash = &hash;
    uint8_t* const rest = scratch.plane(1, n, 0);
    size_t merged = 0;
    *st = entropy::fastcode_decode_merged(high, high_size, n, m, rest, &merged);
    if (!st->is_ok()) return true;
    const uint8_t* at[2] = {low + merged, rest + merged};
    uint64_t sum = 0;
    if (shuffle::merge_hashed(at, n - merged, 2, moved_on(t, merged), out + 2 * merged, &hash, stores)) {
        sum = xxh3_stripes_finish_tail(&hash, out, 0);
    } else {
        // No SIMD variant active any more (set_disabled_isa from another thread since
        // the check above): merge_hashed wrote nothing.
        shuffle::merge(at, n - merged, 2, moved_on(t, merged), out + 2 * merged);
        sum = checksum64(out, 2 * n, block_seed(h, first / h.block_elems));
    }
    if (sum != get_u64(block)) *st = corrupt("block checksum mismatch");
    return true;
}

// A block whose planes all repeat the same rows (the rows method with one row
// table in every plane: whole token rows repeated, as padding or a layer that
// depends on the token alone gives them), a quarter of its rows or more: the
// distinct rows of all planes are merged into whole element rows, which are
// joined into the output and checksummed there. Joining each plane and then
// merging them all copies every repeat once per plane and merges it again.
// (bf16 rows of 32 channels, one thread, Zen 4: 1.5x at 90% repeats in dense
// and fast mode, 1.3x dense at 70%; below a quarter the extra checksum pass
// over the output costs more than it saves.) False where the block is not such
// a block (*st untouched); else *st is the block's outcome.
bool decode_shared_rows(const uint8_t* block, size_t size, uint64_t first, size_t n, const Header& h,
                        const shuffle::PlaneTransform& t, uint8_t* out, Scratch& scratch, Status* st) {
    const unsigned esize = dtype_size(h.dtype);
    if (esize < 2) return false;
    // Every plane a valid rows plane, with the first one's table (else the general path decodes,
    // or reports, the block).
    size_t pos = kBlockPrefixBytes;
    const uint8_t* table = nullptr;
    RowsPayload plane[4];
    for (unsigned p = 0; p < esize; ++p) {
        if (size - pos < kPlanePrefixBytes || block[pos] != static_cast<uint8_t>(Method::kRows)) return false;
        const size_t payload = get_u32(block + pos + 1);
        pos += kPlanePrefixBytes;
        if (payload > size - pos || !parse_rows_payload(block + pos, payload, n, &plane[p]).is_ok()) return false;
        if (p == 0) table = block + pos;
        if (plane[p].table.size != plane[0].table.size || std::memcmp(block + pos, table, plane[0].table.size) != 0)
            return false;
        pos += payload;
    }
    const lz::RowTable& rows = plane[0].table;
    // (Residual merges need each distinct row to start at the block's phase.)
    if (pos != size || rows.copies * 4 < rows.rows || (t.residual != nullptr && rows.row_bytes % t.period != 0))
        return false;
    const size_t dn = rows.distinct * rows.row_bytes;
    const uint8_t* distinct[4];
    for (unsigned p = 0; p < esize; ++p) {
        *st = decode_plane(plane[p].inner, plane[p].data, plane[p].size, dn, h.channels, scratch.plane(p, n, 0),
                           &distinct[p]);
        if (!st->is_ok()) return true;
    }
    thread_local std::vector<uint8_t> merged;
    if (merged.size() < dn * esize) merged.resize(dn * esize);
    shuffle::merge(distinct, dn, esize, t, merged.data());
    lz::RowTable element_rows = rows;
    element_rows.row_bytes = rows.row_bytes * esize;
    *st = lz::join_rows(element_rows, merged.data(), out);
    if (st->is_ok() && checksum64(out, n * esize, block_seed(h, first / h.block_elems)) != get_u64(block))
        *st = corrupt("block checksum mismatch");
    return true;
}

Status decode_block(const uint8_t* block, size_t size, uint64_t first, size_t n, const Header& h,
                    const OutputRuns& dst, shuffle::Stores stores, Scratch& scratch) {
    const unsigned esize = dtype_size(h.dtype);
    if (size < kBlockPrefixBytes) return corrupt("block too short for its checksum");
    const uint64_t expected = get_u64(block);
    const shuffle::PlaneTransform t = transform_of(h, first);
    // A single plane with no transform is the output itself: decode it in place
    // when the block's bytes are contiguous there.
    size_t run_left = 0;
    uint8_t* const block_out = dst.at(first * esize, &run_left);
    if (Status fused;
        run_left >= n * esize && decode_fast_pair(block, size, first, n, h, t, block_out, stores, scratch, &fused))
        return fused;
    if (Status joined; run_left >= n * esize && decode_shared_rows(block, size, first, n, h, t, block_out, scratch, &joined))
        return joined;
    const bool in_place = esize == 1 && !t.rotate && t.residual == nullptr && run_left >= n;
    const uint64_t seed = block_seed(h, first / h.block_elems);
    // A plane decoded in place may be checksummed while it is decoded (decode_plane):
    // where nothing was fed, checksum64, whose own SIMD pass is faster than
    // finishing every stripe.
    Xxh3Stripes plane_hash;
    Xxh3Stripes* const hash_in_place = in_place && n >= Xxh3Stripes::kMinLength ? &plane_hash : nullptr;
    if (hash_in_place) xxh3_stripes_begin(hash_in_place, seed, n);
    size_t pos = kBlockPrefixBytes;
    const uint8_t* planes[4];
    for (unsigned p = 0; p < esize; ++p) {
        if (size - pos < kPlanePrefixBytes) return corrupt("block too short for its planes");
        const uint8_t method = block[pos];
        const size_t payload = get_u32(block + pos + 1);
        pos += kPlanePrefixBytes;
        if (payload > size - pos) return corrupt("plane payload runs past its block");
        KVCORE_RETURN_IF_ERROR(decode_plane(method, block + pos, payload, n, h.channels,
                                            in_place ? block_out : scratch.plane(p, n, 0), &planes[p], hash_in_place));
        pos += payload;
    }
    if (pos != size) return corrupt("block has trailing bytes");
    if (in_place) {
        if (planes[0] != block_out) std::memcpy(block_out, planes[0], n);  // a raw plane points into the frame
        const uint64_t sum =
            plane_hash.fed > 0 ? xxh3_stripes_finish(&plane_hash, block_out) : checksum64(block_out, n, seed);
        if (sum != expected) return corrupt("block checksum mismatch");
        return Status::ok();
    }
    // A block long enough for XXH3's long-input path, whose output is one run (the
    // usual case) or runs it can chain (a token range of a larger KV tensor): one
    // merge pass that checksums its output from registers, run by run.
    // (A single untransformed plane was decoded in place above, or spans runs: its
    // merge is a copy, which feeds nothing.)
    const bool merge_feeds = esize > 1 || t.rotate || t.residual != nullptr;
    if (n * esize >= Xxh3Stripes::kMinLength && merge_feeds && chains_runs(dst, first * esize, n * esize)) {
        Xxh3Stripes hash;
        xxh3_stripes_begin(&hash, seed, n * esize);
        size_t done = 0, count = 0;
        uint8_t* out = nullptr;
        bool merged = true;
        while (merged && done < n) {
            size_t left = 0;
            out = dst.at((first + done) * esize, &left);
            count = std::min(n - done, left / esize);
            const uint8_t* at[4];
            for (unsigned p = 0; p < esize; ++p) at[p] = planes[p] + done;
            merged = shuffle::merge_hashed(at, count, esize, moved_on(t, done), out, &hash, stores);
            done += merged ? count : 0;
        }
        // (merge_hashed writes nothing when no SIMD variant is active: then the first run fails)
        const uint64_t tail_offset = uint64_t(n - count) * esize;  // where the last run starts
        if (done == n && 64 * hash.fed >= tail_offset) {
            if (xxh3_stripes_finish_tail(&hash, out, tail_offset) != expected)
                return corrupt("block checksum mismatch");
            return Status::ok();
        }
    }
    // Else merge and hash in cache-sized pieces, so the checksum reads hot data;
    // a piece also ends where its output run does.
    thread_local StreamingChecksum64 sum;
    sum.reset(seed);
    const size_t piece = std::max<size_t>(1, kVerifyPieceBytes / esize / h.channels) * h.channels;
    size_t count = 0;
    for (size_t done = 0; done < n; done += count) {
        uint8_t* out = dst.at((first + done) * esize, &run_left);
        count = std::min({piece, n - done, run_left / esize});
        const uint8_t* at[4];
        for (unsigned p = 0; p < esize; ++p) at[p] = planes[p] + done;
        const shuffle::PlaneTransform tp = moved_on(t, done);
        // Regular stores, also for large outputs (they stream only in the one-pass
        // path above): merging into a cached piece and copying it out with streaming
        // stores measured 10-18% slower on Zen 4, even for outputs of 4x the L3.
        shuffle::merge(at, count, esize, tp, out);
        sum.update(out, count * esize);
    }
    if (sum.digest() != expected) return corrupt("block checksum mismatch");
    return Status::ok();
}

}  // namespace

namespace {

// validate_shape's checks, also giving the element count.
Status check_shape(const TensorDesc& desc, uint32_t block_bytes, uint64_t* elems) {
    if (!dtype_valid(static_cast<uint8_t>(desc.dtype))) return invalid("unknown dtype");
    if (desc.shape.size() > kMaxDims) return invalid("rank above " + std::to_string(kMaxDims));
    KVCORE_RETURN_IF_ERROR(check_block_bytes(block_bytes));
    unsigned __int128 n = 1;
    for (uint64_t d : desc.shape) {
        n *= d;
        if (n > (UINT64_MAX >> 4)) return invalid("tensor too large");
    }
    // Fast mode's default blocks are the smaller: the frame's block count must fit a u32 with them.
    const uint64_t be =
        block_elems_for(block_bytes, Mode::kFast, dtype_size(desc.dtype), channel_count(desc.shape));
    if ((uint64_t(n) + be - 1) / be > UINT32_MAX) return invalid("tensor needs more than 2^32 - 1 blocks");
    *elems = uint64_t(n);
    return Status::ok();
}

}  // namespace

Status validate_shape(const TensorDesc& desc, uint32_t block_bytes) {
    uint64_t elems = 0;
    return check_shape(desc, block_bytes, &elems);
}

Status validate_desc(const TensorDesc& desc, size_t nbytes, uint32_t block_bytes) {
    uint64_t elems = 0;
    KVCORE_RETURN_IF_ERROR(check_shape(desc, block_bytes, &elems));
    if (elems * dtype_size(desc.dtype) != nbytes)
        return invalid("buffer size " + std::to_string(nbytes) + " does not match shape and dtype");
    return Status::ok();
}

size_t max_frame_size(const TensorDesc& desc, uint32_t block_bytes) {
    const unsigned esize = dtype_size(desc.dtype);
    uint64_t n = 1;
    for (uint64_t d : desc.shape) n *= d;
    const uint32_t channels = channel_count(desc.shape);
    const uint64_t be = block_elems_for(block_bytes, Mode::kFast, esize, channels);
    const uint64_t blocks = (n + be - 1) / be;
    return header_size(desc.shape.size(), true, channels, static_cast<uint32_t>(blocks)) +
           blocks * (kBlockPrefixBytes + esize * kPlanePrefixBytes) + n * esize;
}

size_t max_frame_size(const TensorDesc& desc) { return max_frame_size(desc, 0); }

namespace {

// A call takes one thread per kBytesPerThread of its tensors' bytes (rounded to
// the nearest), up to the threads asked for (0: all): a helper thread wakes in
// about 10-20 us, which ate what a second thread saved below a MiB a thread. On
// the Zen 4 VM, frames of MiniLM bf16 rows, 2 threads against 1 (best of 7 loops
// of 40 calls): fast mode 0.72-0.92x decode and 0.72-1.10x compress at 512 KiB-1
// MiB (2-5 blocks), 1.10-1.23x at 2 MiB; dense 1.50-1.52x at 2 MiB (2026-12-05).
constexpr uint64_t kBytesPerThread = uint64_t(1) << 20;

// The thread count a call runs on: at least 1, never the 0 that means all.
unsigned threads_for(unsigned threads, uint64_t bytes) {
    const uint64_t most = std::max<uint64_t>(1, (bytes + kBytesPerThread / 2) / kBytesPerThread);
    return static_cast<unsigned>(std::min<uint64_t>(threads == 0 ? hardware_threads() : threads, most));
}

// The threads default_pool().parallel_for(..., threads, ...) runs on.
unsigned used_threads(unsigned threads) { return std::min(threads, default_pool().workers() + 1); }

// One frame being encoded: its header and layout, and its index among the
// batch's BlockCommits (each block task codes one block of one frame).
struct FrameEncoder {
    FrameEncoder(const CompressJob& job, Header header, Layout chosen, const FrameDest& to, unsigned threads,
                 BlockCommits& commits)
        : src(job.src), dest(to), cap(job.cap), h(std::move(header)), layout(std::move(chosen)),
          id(commits.add_frame(dest, header_size(h), h.n_blocks)) {
        // A head freshly taken from the heap (where a caller keeps its frames, the
        // heap grows) is not advised by malloc: its 4 KiB faults ran the compression
        // of kept 37.7 MB tensors at 0.65x the speed of 2 MiB ones.
        advise_huge_pages(first(), first_bytes());
        if (job.fresh_dst && threads > 1 && first_bytes() >= 2 * kHugePageBytes) ahead.emplace(first(), first_bytes());
    }
    const uint8_t* src;
    FrameDest dest;
    size_t cap;
    Header h;
    Layout layout;
    size_t id;
    FirstError error;
    std::optional<FaultAhead> ahead;  // set for a fresh frame coded by several threads

    // The buffer the frame starts in, and its size: the head where one is used.
    uint8_t* first() const { return dest.head != nullptr ? dest.head : dest.dst; }
    size_t first_bytes() const { return dest.head != nullptr ? dest.head_bytes : cap; }

    // Once the first `committed` blocks have offsets, ending at `end`: the pages
    // the later blocks will write, as far as the sizes so far foretell (in the
    // buffer the frame starts in: a frame that outgrows its head faults the rest).
    void fault_ahead_of(size_t committed, uint64_t end) {
        const uint64_t left = h.n_blocks - committed;
        if (end < first_bytes()) ahead->keep_ahead(first() + end, left * (end / committed));
    }
};

// The size of job's blocks by its layout's per-plane order-0 estimate.
double estimated_blocks_bytes(const CompressJob& job, const Layout& layout) {
    double bits = 0;  // per element
    for (double e : layout.plane_entropy) bits += std::min(8.0, e);
    return bits / 8 * double(job.nbytes / dtype_size(job.desc.dtype));
}

// Whether job's frame is coded into its head: dense and max modes' planes came
// out 1-26% smaller than the layout's order-0 estimate on the kvdata files (fast
// mode's fixed-width codes up to 9% larger, DEFLATE's not compared), and a
// frame that outgrows the head after all costs only the copy of the head.
bool codes_into_head(const CompressJob& job, const EncodeOptions& o, const Layout& layout, const Header& h) {
    if (job.head == nullptr || o.mode != Mode::kDense || o.deflate || layout.try_rotated ||
        layout.plane_entropy.size() != dtype_size(h.dtype))
        return false;
    return header_size(h) + estimated_blocks_bytes(job, layout) <= double(job.head_bytes);
}

Status check_job(const CompressJob& job, const EncodeOptions& o) {
    KVCORE_RETURN_IF_ERROR(validate_desc(job.desc, job.nbytes, o.block_bytes));
    KVCORE_RETURN_IF_ERROR(check_layout(job.layout, job.desc, o));
    if (job.cap < max_frame_size(job.desc, o.block_bytes))
        return make_status(Code::kBufferTooSmall, "frame buffer too small");
    if (job.head != nullptr && job.head_bytes >= job.cap)
        return make_status(Code::kInvalidArgument, "a frame's head must be smaller than its buffer");
    return Status::ok();
}

Header plan_header(const CompressJob& job, const EncodeOptions& o, const Layout& layout) {
    Header h;
    h.dtype = job.desc.dtype;
    h.shape = job.desc.shape;
    h.n_elems = job.nbytes / dtype_size(job.desc.dtype);
    h.channels = channel_count(job.desc.shape);
    // Blocks hold whole rows, so channel i of every block is channel i of the tensor.
    h.block_elems = block_elems_for(o.block_bytes, o.mode, dtype_size(h.dtype), h.channels);
    h.n_blocks = static_cast<uint32_t>((h.n_elems + h.block_elems - 1) / h.block_elems);
    h.flags = (layout.rotate ? kFlagRotate : 0) | (o.mode == Mode::kFast ? kFlagFastMode : 0);
    if (!layout.residual.empty()) {
        h.flags |= kFlagResidual;
        h.residual = layout.residual;
    }
    h.block_sizes.assign(h.n_blocks, 0);
    bind_header(&h);
    return h;
}

// Codes block b of f: in place when every earlier block of its frame is placed,
// else into a spill buffer that goes to its place once the offset is known
// (BlockCommits; tasks are taken in (frame, block) order, so the earliest
// unfinished one is always in turn).
void encode_task(FrameEncoder& f, size_t b, const EncodeOptions& o, BlockCommits& commits) {
    const Header& h = f.h;
    const unsigned esize = dtype_size(h.dtype);
    const uint64_t first = uint64_t(b) * h.block_elems;
    const size_t count = static_cast<size_t>(std::min<uint64_t>(h.block_elems, h.n_elems - first));
    if (f.error.failed()) {
        commits.done(f.id, b, 0, nullptr);
        return;
    }
    const size_t encoded_bytes = block_bound(h.block_elems, esize);
    AlignedBuffer* spill = nullptr;
    size_t size = 0;
    Status st;
    // The block must reach done() whatever happens: later blocks wait for its size.
    try {
        commits.copy_ready();  // frees spill buffers before this block may need one
        Scratch& s = thread_scratch(esize, h.block_elems);
        const BlockCommits::Placement to = commits.place(f.id, b, encoded_bytes);
        spill = to.spill;
        // In place (always when single-threaded and no head is used), the rest of
        // the frame's capacity covers every remaining block's bound
        // (max_frame_size), so this block's raw fallback always fits.
        st = spill != nullptr
                 ? encode_block(f.src, first, count, h, f.layout, o, s, spill->data(), spill->size(), &size)
                 : encode_block(f.src, first, count, h, f.layout, o, s, to.in_place,
                                std::min<size_t>(encoded_bytes, f.cap - to.at), &size);
    } catch (const std::bad_alloc&) {
        st = make_status(Code::kOutOfMemory, "out of memory");
    }
    if (st.is_ok()) f.h.block_sizes[b] = static_cast<uint32_t>(size);
    const BlockCommits::Placed placed = commits.done(f.id, b, st.is_ok() ? size : 0, spill);
    if (!st.is_ok()) {
        f.error.set(st);
        return;
    }
    if (f.ahead && placed.committed > 0) f.fault_ahead_of(placed.committed, placed.end);
    // The spilled copies (first touches of the frame's pages included) come after
    // the commit, while later blocks commit and copy too.
    commits.copy_ready();
}

// Codes every job's frame in its layout (compress_many's second half).
Status encode_frames(CompressJob* jobs, size_t n, const EncodeOptions& o, const std::vector<Layout>& layouts) {
    // Two spill buffers per thread: a thread whose block is not in turn codes it
    // into one and moves on; the second covers its next block meanwhile.
    //
    // With several threads nearly every block is spilled (a 2-thread compress of
    // 64 MiB bf16 spilled 60 of its 65 blocks), so a frame is written twice. Where
    // the batch's frames will not stay cached (cpu::streaming_store_bytes(), as for
    // decode), the copies use streaming stores, which do not read the frame's lines
    // first: on the Zen 4 VM, 2 threads on 64 MiB of MiniLM bf16 into a reused
    // buffer took 24.0-24.6 ms of CPU time a call instead of 26.0-27.3, and ran
    // 1.77-1.83x the speed of 1 thread instead of 1.62-1.67x (into new bytes
    // objects, whose page faults dominate: 1.72-1.76x against 1.67-1.72x;
    // three alternating pairs, 2026-12-06).
    const unsigned threads = used_threads(o.threads);
    double estimated_bytes = 0;
    for (size_t i = 0; i < n; ++i) estimated_bytes += estimated_blocks_bytes(jobs[i], layouts[i]);
    BlockCommits commits(2 * size_t(threads),
                         threads > 1 && estimated_bytes >= double(cpu::streaming_store_bytes()));
    std::vector<std::unique_ptr<FrameEncoder>> frames;
    std::vector<std::pair<uint32_t, uint32_t>> tasks;  // (frame, block), frame-major
    for (size_t i = 0; i < n; ++i) {
        Header h = plan_header(jobs[i], o, layouts[i]);
        FrameDest dest{jobs[i].dst};
        if (codes_into_head(jobs[i], o, layouts[i], h)) {
            dest.head = jobs[i].head;
            dest.head_bytes = jobs[i].head_bytes;
            advise_huge_pages(jobs[i].dst, jobs[i].cap);  // where a frame that outgrows its head goes on
        }
        frames.push_back(std::make_unique<FrameEncoder>(jobs[i], std::move(h), layouts[i], dest, o.threads, commits));
        for (uint32_t b = 0; b < frames[i]->h.n_blocks; ++b) tasks.emplace_back(static_cast<uint32_t>(i), b);
    }
    // Every block of every frame is one task, so small frames still keep all threads busy.
    default_pool().parallel_for(tasks.size(), o.threads,
                                [&](size_t t) { encode_task(*frames[tasks[t].first], tasks[t].second, o, commits); });
    commits.copy_ready();  // every offset is known now
    for (size_t i = 0; i < n; ++i) {
        KVCORE_RETURN_IF_ERROR(frames[i]->error.take());
        const FrameDest& dest = frames[i]->dest;
        write_header(frames[i]->h, dest.contiguous(0, header_size(frames[i]->h)));
        jobs[i].written = commits.end(frames[i]->id);
        jobs[i].in_head = dest.head != nullptr && jobs[i].written <= dest.head_bytes;
        if (dest.head != nullptr && !jobs[i].in_head) std::memcpy(dest.dst, dest.head, dest.head_bytes);
    }
    return Status::ok();
}

// Max mode's second coding of a float8 frame (Layout::try_rotated): its two
// layouts estimate the same, and which one codes smaller depends on what the
// plane coders make of the sign. Plain, the channel groups follow each channel's
// sign; rotated, the low-bits split stores the sign raw and keeps the top
// mantissa bit coded. Per tensor of the kvdata files (e4m3) either won, by up to
// 2.8% (stories260K's V tensors rotated, most K tensors plain). A trial on four
// stripes of rows picked wrongly (MiniLM e4m3 frames of 256 and 2048 rows:
// 0.8160 -> 0.8171, 0.8140 -> 0.8143), so the whole frame is coded again rotated
// and kept where that is smaller: those frames 0.8156 and 0.8135, the stories260K
// e4m3 file 0.7511 -> 0.7465, for max compress at about half its speed (ad hoc,
// 2026-12-05).
Status encode_rotated_if_smaller(CompressJob* jobs, size_t n, const EncodeOptions& o,
                                 const std::vector<Layout>& layouts) {
    std::vector<size_t> tried;
    std::vector<CompressJob> again;
    std::vector<Layout> rotated;
    std::vector<AlignedBuffer> buffers;
    for (size_t i = 0; i < n; ++i) {
        if (!layouts[i].try_rotated) continue;
        const size_t bound = max_frame_size(jobs[i].desc, o.block_bytes);  // not the caller's capacity
        tried.push_back(i);
        buffers.emplace_back();
        buffers.back().ensure(bound);
        again.push_back(CompressJob{jobs[i].src, jobs[i].nbytes, jobs[i].desc, buffers.back().data(), bound});
        rotated.push_back(layouts[i]);
        rotated.back().rotate = true;
    }
    if (tried.empty()) return Status::ok();
    KVCORE_RETURN_IF_ERROR(encode_frames(again.data(), again.size(), o, rotated));
    for (size_t k = 0; k < tried.size(); ++k) {
        CompressJob& j = jobs[tried[k]];
        if (again[k].written >= j.written) continue;
        std::memcpy(j.dst, again[k].dst, again[k].written);
        j.written = again[k].written;
    }
    return Status::ok();
}

}  // namespace

Status check_options(const EncodeOptions& o) { return check_block_bytes(o.block_bytes); }

Status compress_many(CompressJob* jobs, size_t n, const EncodeOptions& options) {
    KVCORE_RETURN_IF_ERROR(check_options(options));
    BatchBuffers buffers;
    uint64_t in_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
        KVCORE_RETURN_IF_ERROR(check_job(jobs[i], options));
        buffers.add(OutputRuns{jobs[i].dst, jobs[i].cap}, jobs[i].src, jobs[i].nbytes);
        if (jobs[i].head != nullptr) buffers.outputs.push_back(OutputRuns{jobs[i].head, jobs[i].head_bytes});
        in_bytes += jobs[i].nbytes;
    }
    EncodeOptions o = options;
    o.threads = threads_for(options.threads, in_bytes);
    // Blocks are written concurrently, and an input must not change while it is read.
    KVCORE_RETURN_IF_ERROR(buffers.check_disjoint("compress", "a tensor being compressed"));
    // Layouts are chosen for all frames at once (each reads a sample of its tensor).
    std::vector<Layout> layouts(n);
    const LayoutCoding coding = layout_coding(o);
    default_pool().parallel_for(n, o.threads, [&](size_t i) {
        const CompressJob& j = jobs[i];
        if (j.layout != nullptr && j.nbytes != 0)
            layouts[i] = j.layout->layout;
        else
            layouts[i] = choose_layout(j.src, j.nbytes / dtype_size(j.desc.dtype), j.desc.dtype,
                                       channel_count(j.desc.shape), coding);
    });
    KVCORE_RETURN_IF_ERROR(encode_frames(jobs, n, o, layouts));
    return encode_rotated_if_smaller(jobs, n, o, layouts);
}

Status check_layout(const AnalyzedLayout* layout, const TensorDesc& desc, const EncodeOptions& o) {
    if (layout == nullptr) return Status::ok();
    const AnalyzedLayout& a = *layout;
    if (a.dtype != desc.dtype) return invalid("the layout was analysed for a tensor of another dtype");
    // An empty tensor is coded without blocks, whatever its channels (and the layout is not used).
    const uint32_t channels = channel_count(desc.shape);
    const bool empty = std::find(desc.shape.begin(), desc.shape.end(), uint64_t(0)) != desc.shape.end();
    if (a.channels != channels && !empty)
        return invalid("the layout was analysed for a tensor of " + std::to_string(a.channels) +
                       " channels (its last one or two dimensions), not " + std::to_string(channels));
    const LayoutCoding coding = layout_coding(o);
    if (!same_coding(a.coding, coding))
        return invalid(std::string("the layout was analysed for ") + coding_name(a.coding) + " coding, not " +
                       coding_name(coding));
    return Status::ok();
}

Status analyze(const uint8_t* src, size_t nbytes, const TensorDesc& desc, const EncodeOptions& o,
               AnalyzedLayout* out) {
    KVCORE_RETURN_IF_ERROR(check_options(o));
    KVCORE_RETURN_IF_ERROR(validate_desc(desc, nbytes, o.block_bytes));
    out->dtype = desc.dtype;
    out->channels = channel_count(desc.shape);
    out->coding = layout_coding(o);
    out->layout = choose_layout(src, nbytes / dtype_size(desc.dtype), desc.dtype, out->channels, out->coding);
    return Status::ok();
}

Status compress(const uint8_t* src, size_t nbytes, const TensorDesc& desc, const EncodeOptions& o, uint8_t* dst,
                size_t cap, size_t* written) {
    CompressJob job{src, nbytes, desc, dst, cap};
    KVCORE_RETURN_IF_ERROR(compress_many(&job, 1, o));
    *written = job.written;
    return Status::ok();
}

Status read_desc(const uint8_t* frame, size_t size, TensorDesc* desc) {
    Header h;
    size_t pos = 0;
    KVCORE_RETURN_IF_ERROR(parse_header(frame, size, &h, &pos));
    desc->dtype = h.dtype;
    desc->shape = std::move(h.shape);
    return Status::ok();
}

Status read_info(const uint8_t* frame, size_t size, FrameInfo* info) {
    Header h;
    size_t pos = 0;
    KVCORE_RETURN_IF_ERROR(parse_header(frame, size, &h, &pos));
    const unsigned esize = dtype_size(h.dtype);
    info->version = kVersion;
    info->desc.dtype = h.dtype;
    info->desc.shape = h.shape;
    info->original_bytes = h.n_elems * esize;
    info->frame_bytes = size;
    info->block_elems = h.block_elems;
    info->n_blocks = h.n_blocks;
    info->flags = h.flags;
    info->channels = h.channels;
    info->method_counts.assign(kMethodCount, 0);
    info->method_bytes.assign(kMethodCount, 0);
    for (uint32_t b = 0; b < h.n_blocks; ++b) {
        const uint8_t* block = frame + pos;
        const size_t bsize = h.block_sizes[b];
        size_t at = kBlockPrefixBytes;
        for (unsigned p = 0; p < esize; ++p) {
            if (at > bsize || bsize - at < kPlanePrefixBytes) return corrupt("block too short for its planes");
            const uint8_t m = block[at];
            const size_t payload = get_u32(block + at + 1);
            if (m >= kMethodCount) return corrupt("unknown plane method " + std::to_string(m));
            at += kPlanePrefixBytes;
            if (payload > bsize - at) return corrupt("plane payload runs past its block");
            ++info->method_counts[m];
            info->method_bytes[m] += payload;
            at += payload;
        }
        if (at != bsize) return corrupt("block has trailing bytes");
        pos += bsize;
    }
    return Status::ok();
}

namespace {

// One frame's parsed header and block offsets, ready to decode block by block.
struct PreparedFrame {
    Header h;
    std::vector<uint64_t> offsets;
    shuffle::Stores stores = shuffle::Stores::kCached;  // how its blocks' merges write the output
};

// Whether a decode call writes its outputs with streaming stores: where they total
// cpu::streaming_store_bytes() or more (see decompress_many), or where the calls
// before it show they have left the cache (frame/recent_outputs.h; 512 KiB frames
// of a KV chunk decoded one call each into 72 buffers by one thread: 1.03-1.14x,
// ad hoc, 2026-12-06). A fresh output is not judged by history: its pages are
// faulted in as it is written, or were freed by the caller just before. The call
// is recorded in the history either way.
bool stream_outputs(const FrameJob* jobs, size_t n, uint64_t out_bytes, uint64_t frames_bytes) {
    if (out_bytes == 0) return false;
    uintptr_t lo = UINTPTR_MAX, hi = 0;  // all the outputs, as one range
    bool fresh = false;
    for (size_t i = 0; i < n; ++i) {
        const OutputRuns& o = jobs[i].out;
        if (o.bytes == 0) continue;
        lo = std::min(lo, reinterpret_cast<uintptr_t>(o.base));
        hi = std::max(hi, reinterpret_cast<uintptr_t>(o.base) + o.span());
        fresh = fresh || jobs[i].fresh_out;
    }
    RecentOutputs& recent = recent_decode_outputs();
    const bool stream = out_bytes >= cpu::streaming_store_bytes() || (!fresh && recent.cold(lo, hi));
    recent.record(lo, hi, frames_bytes + out_bytes);
    return stream;
}

Status prepare(const FrameJob& job, PreparedFrame* f) {
    size_t pos = 0;
    KVCORE_RETURN_IF_ERROR(parse_header(job.frame, job.size, &f->h, &pos));
    const uint64_t want = f->h.n_elems * dtype_size(f->h.dtype);
    if (job.out.bytes != want)
        return make_status(Code::kBufferTooSmall, "output holds " + std::to_string(job.out.bytes) +
                                                      " bytes, the frame " + std::to_string(want));
    KVCORE_RETURN_IF_ERROR(check_runs(job.out, dtype_size(f->h.dtype)));
    f->offsets.resize(f->h.n_blocks);
    for (uint32_t b = 0; b < f->h.n_blocks; ++b) {
        f->offsets[b] = pos;
        pos += f->h.block_sizes[b];
    }
    return Status::ok();
}

}  // namespace

Status decompress_many(const FrameJob* jobs, size_t n, unsigned threads, const FrameDone& on_frame) {
    std::vector<PreparedFrame> frames(n);
    std::vector<std::pair<uint32_t, uint32_t>> tasks;  // (frame, block)
    BatchBuffers buffers;
    uint64_t out_bytes = 0, frames_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
        KVCORE_RETURN_IF_ERROR(prepare(jobs[i], &frames[i]));
        for (uint32_t b = 0; b < frames[i].h.n_blocks; ++b) tasks.emplace_back(static_cast<uint32_t>(i), b);
        buffers.add(jobs[i].out, jobs[i].frame, jobs[i].size);
        out_bytes += jobs[i].out.bytes;
        frames_bytes += jobs[i].size;
    }
    // Blocks are written concurrently, and a frame must not change while it is read.
    KVCORE_RETURN_IF_ERROR(buffers.check_disjoint("decompress", "a frame"));
    // A decode call whose outputs total cpu::streaming_store_bytes() or more (one frame's or a batch's,
    // such as the 72 frames of a KV chunk) writes them with streaming (non-temporal)
    // stores wherever the one-pass merge writes them: they do not stay cached anyway,
    // and cached stores pass them through the L2 that holds the decoder's planes and
    // tables. Measured on dense MiniLM bf16 frames decoded by one thread on a Xeon
    // (2 MiB L2): 1.01x at 9 MiB, 1.04x at 18, 1.10x at 32-36, 1.17x at 72; with the
    // output read right after, 0.96x at 18 MiB, 1.09x at 36. On a Zen 4 (1 MiB L2,
    // 32 MiB L3), one thread: whole frames 1.04-1.09x dense, 1.07-1.37x fast (36-144
    // MiB); batches of 512 KiB frames 1.06-1.10x dense, 1.14-1.21x fast (36 and 144
    // MiB); with the output read right after, 1.01-1.27x and 1.02-1.14x. Half the
    // last-level cache where that is lower: on the Zen 4 VM (32 MiB L3), one thread,
    // outputs of 18 MiB (MiniLM bf16 and fp16, first halves) and 30 MiB (stories260K
    // as fp32) streamed decoded 1.25-1.67x faster in fast mode and 1.12-1.24x in dense
    // mode; with the output read right after, 1.03-1.18x and 0.95-0.98x (2026-12-05).
    if (stream_outputs(jobs, n, out_bytes, frames_bytes))
        for (PreparedFrame& f : frames) f.stores = shuffle::Stores::kStreaming;
    threads = threads_for(threads, out_bytes);
    for (const OutputRuns& o : buffers.outputs)
        if (o.contiguous()) advise_huge_pages(o.base, o.bytes);
    std::vector<std::optional<FaultAhead>> ahead(n);  // set for a fresh output decoded by several threads
    if (threads > 1)
        for (size_t i = 0; i < n; ++i)
            if (jobs[i].fresh_out && jobs[i].out.contiguous() && jobs[i].out.bytes >= 2 * kHugePageBytes)
                ahead[i].emplace(jobs[i].out.base, jobs[i].out.bytes);
    FirstError error;
    // Per frame, for on_frame: blocks not yet settled, and the first error (written
    // by the one thread that wins `failed`, read by the thread that settles the
    // frame last: the acq_rel countdown orders the two).
    struct Countdown {
        std::atomic<uint32_t> left{0};
        std::atomic<bool> failed{false};
        Status error;
    };
    std::unique_ptr<Countdown[]> settle;
    if (on_frame) {
        settle = std::make_unique<Countdown[]>(n);
        for (size_t i = 0; i < n; ++i) {
            settle[i].left.store(frames[i].h.n_blocks, std::memory_order_relaxed);
            if (frames[i].h.n_blocks == 0) on_frame(i, Status::ok());  // an empty tensor
        }
    }
    // Every block of every frame is one task, so small frames still keep all threads busy.
    default_pool().parallel_for(tasks.size(), threads, [&](size_t t) {
        const auto [i, b] = tasks[t];
        Status st;
        if (error.failed()) {
            if (!on_frame) return;
            st = error.take();  // skipped: another frame failed
        } else {
            const Header& h = frames[i].h;
            const uint64_t first = uint64_t(b) * h.block_elems;
            const size_t count = static_cast<size_t>(std::min<uint64_t>(h.block_elems, h.n_elems - first));
            const size_t esize = dtype_size(h.dtype);
            try {  // so that the frame still settles
                Scratch& s = thread_scratch(esize, h.block_elems);
                st = decode_block(jobs[i].frame + frames[i].offsets[b], h.block_sizes[b], first, count, h,
                                  jobs[i].out, frames[i].stores, s);
            } catch (const std::bad_alloc&) {
                st = make_status(Code::kOutOfMemory, "out of memory");
            }
            if (!st.is_ok()) error.set(st);
            // Blocks are taken in order: the later ones write past this one's end.
            if (ahead[i]) ahead[i]->keep_ahead(jobs[i].out.base + (first + count) * esize, (h.n_elems - first - count) * esize);
        }
        if (!on_frame) return;
        Countdown& c = settle[i];
        if (!st.is_ok() && !c.failed.exchange(true, std::memory_order_relaxed)) c.error = std::move(st);
        if (c.left.fetch_sub(1, std::memory_order_acq_rel) == 1) on_frame(i, c.error);
    });
    return error.take();
}

Status decompress(const uint8_t* frame, size_t size, uint8_t* dst, size_t dst_size, unsigned threads) {
    const FrameJob job{frame, size, OutputRuns{dst, dst_size}};
    return decompress_many(&job, 1, threads);
}

}  // namespace kvcore::frame
