#include "deflate/deflate_plane.h"

#include <isa-l/igzip_lib.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/little_endian.h"
#include "parallel/thread_pool.h"
#include "qat/qat.h"

namespace kvcore::deflate {

namespace {

constexpr size_t kStoredBlockMax = 65535;  // RFC 1951 stored block LEN limit

size_t piece_count(size_t n) { return (n + kPieceBytes - 1) / kPieceBytes; }
size_t table_bytes(size_t pieces) { return 4 + 8 * pieces; }

// Size of p bytes written as stored blocks: 5 bytes of block header per 65535 bytes.
size_t stored_bytes(size_t p) { return p + 5 * ((p + kStoredBlockMax - 1) / kStoredBlockMax); }

// Writes p bytes as a raw DEFLATE stream of stored blocks (the last one final).
size_t write_stored(const uint8_t* src, size_t p, uint8_t* out) {
    uint8_t* o = out;
    size_t left = p;
    do {
        const size_t len = left < kStoredBlockMax ? left : kStoredBlockMax;
        const bool final = len == left;
        o[0] = final ? 1 : 0;  // BFINAL, BTYPE = 00, then padding to the byte boundary
        o[1] = static_cast<uint8_t>(len);
        o[2] = static_cast<uint8_t>(len >> 8);
        o[3] = static_cast<uint8_t>(~len);
        o[4] = static_cast<uint8_t>(~len >> 8);
        std::memcpy(o + 5, src, len);
        o += 5 + len;
        src += len;
        left -= len;
    } while (left > 0);
    return static_cast<size_t>(o - out);
}

int isal_level(int level) {
    if (level <= 0) return 0;
    if (level == 1) return 1;
    if (level <= 5) return 2;
    return 3;
}

uint32_t isal_level_buf_size(int isal_lvl) {
    switch (isal_lvl) {
        case 1: return ISAL_DEF_LVL1_DEFAULT;
        case 2: return ISAL_DEF_LVL2_DEFAULT;
        case 3: return ISAL_DEF_LVL3_DEFAULT;
        default: return 0;
    }
}

// ISA-L stateless deflate of one piece. Returns false when the output does not fit.
bool isal_compress(const uint8_t* src, size_t p, int level, uint8_t* out, size_t cap, size_t* len) {
    thread_local std::vector<uint8_t> level_buf;
    const int lvl = isal_level(level);
    const uint32_t buf_size = isal_level_buf_size(lvl);
    if (level_buf.size() < buf_size) level_buf.resize(buf_size);
    // Zeroed first, the stream and the level buffer: stateless_init does not set every
    // field stateless deflate reads (hist_bits, which sizes the match window, 0
    // selecting the full 32 KiB, is one), and a thread's level buffer holds what its
    // last piece left. Zeroing the buffer (about 330 KiB at level 3) costs under 1%
    // of coding a 64 KiB piece. Even so, a piece is not always coded to the same
    // stream twice (a valid stream a token apart, cause unknown; docs/QAT.md), so a
    // DEFLATE plane is promised only by what it decodes to.
    std::memset(level_buf.data(), 0, buf_size);
    isal_zstream s{};
    isal_deflate_stateless_init(&s);
    s.hist_bits = 0;
    s.next_in = const_cast<uint8_t*>(src);
    s.avail_in = static_cast<uint32_t>(p);
    s.next_out = out;
    s.avail_out = static_cast<uint32_t>(cap);
    s.level = static_cast<uint32_t>(lvl);
    s.level_buf = buf_size ? level_buf.data() : nullptr;
    s.level_buf_size = buf_size;
    s.end_of_stream = 1;
    s.flush = NO_FLUSH;
    s.gzip_flag = IGZIP_DEFLATE;
    if (isal_deflate_stateless(&s) != COMP_OK || s.avail_in != 0) return false;
    *len = s.total_out;
    return true;
}

// ISA-L stateless inflate of one piece into exactly n bytes.
Status isal_decompress(const uint8_t* src, uint32_t size, uint8_t* dst, uint32_t n, size_t index) {
    inflate_state st;
    isal_inflate_init(&st);
    st.next_in = const_cast<uint8_t*>(src);
    st.avail_in = size;
    st.next_out = dst;
    st.avail_out = n;
    st.crc_flag = ISAL_DEFLATE;
    const int rc = isal_inflate_stateless(&st);
    if (rc != ISAL_DECOMP_OK)
        return corrupt("deflate piece " + std::to_string(index) + ": invalid DEFLATE data (ISA-L code " +
                       std::to_string(rc) + ")");
    if (st.block_state != ISAL_BLOCK_FINISH || st.avail_in != 0 || st.total_out != n)
        return corrupt("deflate piece " + std::to_string(index) + ": stream does not end exactly at its size (" +
                       std::to_string(st.total_out) + " of " + std::to_string(n) + " bytes, " +
                       std::to_string(st.avail_in) + " input bytes left)");
    return Status::ok();
}

enum class PieceKind { kQat, kSoftware, kStored };

struct PieceResult {
    size_t len = 0;
    PieceKind kind = PieceKind::kSoftware;
    bool fallback = false;
};

// Codes one piece into out (capacity slot >= stored_bytes(p)).
Status encode_piece(const uint8_t* src, size_t p, frame::Backend backend, bool qat_ok, uint32_t qat_min, int level,
                    uint8_t* out, size_t slot, PieceResult* r) {
    const bool want_qat = backend == frame::Backend::kQat ||
                          (backend == frame::Backend::kAuto && qat_ok && p >= qat_min);
    if (want_qat && p >= kQatMinPieceBytes) {
        // QAT writes into a buffer of QATzip's own output bound (9/8 of the input
        // + 1 KiB), so incompressible pieces are not reported as QZ_BUF_ERROR.
        thread_local std::vector<uint8_t> qat_out;
        const size_t qat_cap = 9 * p / 8 + 1024;
        if (qat_out.size() < qat_cap) qat_out.resize(qat_cap);
        uint32_t w = 0;
        const Status st = qat::compress_piece(src, static_cast<uint32_t>(p), qat_out.data(),
                                              static_cast<uint32_t>(qat_cap), level < 1 ? 1 : level, &w);
        if (st.is_ok()) {
            if (w <= slot && w <= stored_bytes(p)) {
                std::memcpy(out, qat_out.data(), w);
                r->len = w;
                r->kind = PieceKind::kQat;
                return Status::ok();
            }
            // QAT's output is larger than storing: fall through to stored blocks.
        } else if (st.code == Code::kBufferTooSmall) {
            // does not compress into the slot: stored blocks below
        } else if (backend == frame::Backend::kQat) {
            return st;
        } else {
            r->fallback = true;
            qat::count_fallback();
            if (isal_compress(src, p, level, out, slot, &r->len)) {
                r->kind = PieceKind::kSoftware;
                return Status::ok();
            }
        }
    } else {
        if (want_qat) {
            r->fallback = true;
            qat::count_fallback();
        }
        if (isal_compress(src, p, level, out, slot, &r->len) && r->len <= stored_bytes(p)) {
            r->kind = PieceKind::kSoftware;
            return Status::ok();
        }
    }
    r->len = write_stored(src, p, out);
    r->kind = PieceKind::kStored;
    return Status::ok();
}

}  // namespace

size_t deflate_plane_bound(size_t n) {
    const size_t pieces = piece_count(n);
    size_t bound = table_bytes(pieces);
    if (pieces > 0) bound += (pieces - 1) * stored_bytes(kPieceBytes) + stored_bytes(n - (pieces - 1) * kPieceBytes);
    return bound;
}

Status deflate_plane_encode(const uint8_t* src, size_t n, frame::Backend backend, int level, uint8_t* dst,
                            size_t cap, size_t* written, EncodeReport* report, unsigned threads) {
    *written = 0;
    if (level < 0 || level > 9) return invalid("deflate level must be 0 to 9");
    if (n > 0 && src == nullptr) return invalid("deflate: null input");
    const size_t pieces = piece_count(n);
    if (pieces > UINT32_MAX) return invalid("deflate: plane too large");

    bool qat_ok = false;
    uint32_t qat_min = 0;
    if (backend != frame::Backend::kSoftware) {
        qat_ok = qat::hardware_available();
        qat_min = qat::min_bytes();
        if (backend == frame::Backend::kQat && !qat_ok) {
            const qat::StatusReport s = qat::status();
            return make_status(Code::kUnsupported, "QAT backend requested but not available: " + s.message);
        }
    }

    const size_t bound = deflate_plane_bound(n);
    // Pieces are coded into fixed slots (slot i starts where it would if every
    // piece were stored), then moved together.
    // A caller that offers less than the bound (the frame asks "smaller than raw?")
    // gets the pieces coded in this thread's scratch first.
    // (kept per thread up to 4 MiB, so block-sized planes allocate nothing).
    thread_local std::vector<uint8_t> kept;
    std::vector<uint8_t> once;
    uint8_t* out = dst;
    if (cap < bound) {
        std::vector<uint8_t>& scratch = bound <= (4u << 20) ? kept : once;
        if (scratch.size() < bound) scratch.resize(bound);
        out = scratch.data();
    }
    const size_t table = table_bytes(pieces);
    const size_t full_slot = stored_bytes(kPieceBytes);
    std::vector<PieceResult> results(pieces);
    std::vector<Status> errors(pieces);
    std::atomic<bool> failed{false};
    auto work = [&](size_t i) {
        if (failed.load(std::memory_order_relaxed)) return;
        const size_t off = i * kPieceBytes;
        const size_t p = (n - off) < kPieceBytes ? n - off : kPieceBytes;
        const Status st = encode_piece(src + off, p, backend, qat_ok, qat_min, level, out + table + i * full_slot,
                                       stored_bytes(p), &results[i]);
        if (!st.is_ok()) {
            errors[i] = st;
            failed.store(true, std::memory_order_relaxed);
        }
    };
    if (threads == 1 || pieces < 2) {
        size_t total = table;
        for (size_t i = 0; i < pieces; ++i) {
            work(i);
            if (!errors[i].is_ok()) return errors[i];
            total += results[i].len;
            if (total > cap) return make_status(Code::kBufferTooSmall, "deflate: output does not fit");
        }
    } else {
        default_pool().parallel_for(pieces, threads, work);
    }
    for (const Status& st : errors)
        if (!st.is_ok()) return st;

    EncodeReport rep;
    rep.pieces = static_cast<uint32_t>(pieces);
    put_u32(out, static_cast<uint32_t>(pieces));
    size_t pos = table;
    for (size_t i = 0; i < pieces; ++i) {
        const size_t off = i * kPieceBytes;
        const size_t p = (n - off) < kPieceBytes ? n - off : kPieceBytes;
        const PieceResult& r = results[i];
        put_u32(out + 4 + 8 * i, static_cast<uint32_t>(p));
        put_u32(out + 8 + 8 * i, static_cast<uint32_t>(r.len));
        const size_t from = table + i * full_slot;
        if (from != pos) std::memmove(out + pos, out + from, r.len);
        pos += r.len;
        rep.qat_pieces += r.kind == PieceKind::kQat;
        rep.software_pieces += r.kind == PieceKind::kSoftware;
        rep.stored_pieces += r.kind == PieceKind::kStored;
        rep.fallback_pieces += r.fallback;
    }
    if (out != dst) {
        if (pos > cap) return make_status(Code::kBufferTooSmall, "deflate: output buffer too small");
        std::memcpy(dst, out, pos);
    }
    *written = pos;
    if (report) *report = rep;
    return Status::ok();
}

Status deflate_plane_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n, frame::Backend backend,
                            unsigned threads) {
    if (src_size < 4) return corrupt("deflate payload shorter than its piece count");
    const uint32_t pieces = get_u32(src);
    if ((src_size - 4) / 8 < pieces) return corrupt("deflate payload shorter than its piece table");
    if (n > 0 && dst == nullptr) return invalid("deflate: null output");
    const size_t table = table_bytes(pieces);
    // Validate the whole table first: sizes, sums, and offsets of every piece.
    std::vector<size_t> in_off(pieces), out_off(pieces);
    size_t in_pos = table, out_pos = 0;
    for (uint32_t i = 0; i < pieces; ++i) {
        const uint32_t orig = get_u32(src + 4 + 8 * size_t{i});
        const uint32_t comp = get_u32(src + 8 + 8 * size_t{i});
        if (orig == 0 || orig > kMaxPieceBytes)
            return corrupt("deflate piece " + std::to_string(i) + ": original size " + std::to_string(orig) +
                           " out of range");
        if (comp == 0) return corrupt("deflate piece " + std::to_string(i) + ": empty");
        if (orig > n - out_pos) return corrupt("deflate pieces decode to more than the plane size");
        if (comp > src_size - in_pos) return corrupt("deflate piece " + std::to_string(i) + " runs past the payload");
        in_off[i] = in_pos;
        out_off[i] = out_pos;
        in_pos += comp;
        out_pos += orig;
    }
    if (out_pos != n) return corrupt("deflate pieces decode to less than the plane size");
    if (in_pos != src_size) return corrupt("deflate payload has bytes after its last piece");

    const bool try_qat = backend != frame::Backend::kSoftware && qat::hardware_available();
    std::vector<Status> errors(pieces);
    std::atomic<bool> failed{false};
    auto work = [&](size_t i) {
        if (failed.load(std::memory_order_relaxed)) return;
        const uint8_t* p = src + in_off[i];
        const uint32_t orig = get_u32(src + 4 + 8 * i);
        const uint32_t comp = get_u32(src + 8 + 8 * i);
        if (try_qat && orig >= kQatMinPieceBytes && comp >= kQatMinPieceBytes &&
            qat::decompress_piece(p, comp, dst + out_off[i], orig).is_ok())
            return;
        if (try_qat) qat::count_fallback();
        // ISA-L is the judge of every piece QAT did not decode.
        Status st = isal_decompress(p, comp, dst + out_off[i], orig, i);
        if (!st.is_ok()) {
            errors[i] = std::move(st);
            failed.store(true, std::memory_order_relaxed);
        }
    };
    if (threads == 1 || pieces < 2)
        for (size_t i = 0; i < pieces; ++i) work(i);
    else
        default_pool().parallel_for(pieces, threads, work);
    for (const Status& st : errors)
        if (!st.is_ok()) return st;
    return Status::ok();
}

}  // namespace kvcore::deflate
