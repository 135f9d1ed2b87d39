// Lane-interleaved Huffman stream (see lane_code.h): the code, the header, and
// the choice of pass variant.
#include "entropy/lane_code.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/arch.h"
#include "cpu/cpu_features.h"
#include "entropy/code_lengths.h"
#include "entropy/lane_kernels.h"

namespace kvcore::entropy::lanes {
namespace {

constexpr size_t kFixedHeader = 1 + 4 + kSymbolBitmapBytes;
// Symbols under 1/512 of the weight are escaped (p < 2^-9, two bits past the
// longest code). On the kvdata exponent streams this came within 0.03% of the
// best set of rarest symbols to escape; 1/256 and 1/1024 cost 0.4% and 0.08%.
constexpr uint64_t kEscapeShare = 512;

#if KVCORE_X86
bool use_avx512() { return (cpu::active_isa() & cpu::kIsaAvx512) != 0; }
bool use_avx2() { return (cpu::active_isa() & cpu::kIsaAvx2) != 0; }
#endif

size_t header_bytes(unsigned codes) { return kFixedHeader + (codes + 1) / 2; }

void store_le32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint32_t load_le32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// The codes in canonical order, by (length, symbol), ESC as its placeholder:
// calls f(symbol or kEsc, length, code) for each. syms: the m directly coded
// symbols, increasing.
constexpr unsigned kEsc = 256;
template <typename F>
void canonical_codes(const uint8_t* syms, unsigned m, const uint8_t* lens, unsigned esc_len, unsigned placeholder,
                     F f) {
    unsigned code = 0;
    for (unsigned len = 1; len <= kMaxLen; ++len) {
        bool esc = esc_len == len;
        for (unsigned i = 0; i < m; ++i) {
            if (lens[syms[i]] != len) continue;
            if (esc && syms[i] > placeholder) {
                f(kEsc, len, code++);
                esc = false;
            }
            f(syms[i], len, code++);
        }
        if (esc) f(kEsc, len, code++);
        code <<= 1;
    }
}

}  // namespace

bool plan(const uint64_t* weights, Plan* p) {
    uint64_t total = 0;
    uint8_t order[256];
    unsigned m = 0;
    for (unsigned s = 0; s < 256; ++s) {
        total += weights[s];
        if (weights[s]) order[m++] = uint8_t(s);
    }
    if (m < 2) return false;
    // The rarest first (ties: smaller symbols first).
    std::stable_sort(order, order + m, [&](uint8_t a, uint8_t b) { return weights[a] < weights[b]; });
    unsigned escaped = 0;
    while (escaped < m && weights[order[escaped]] * kEscapeShare < total) ++escaped;
    if (escaped == 1) escaped = 0;  // ESC would only rename it, at 8 bits more a use
    // At most kCodeSpace codes, ESC included.
    if (m - escaped > (escaped ? kCodeSpace - 1 : kCodeSpace)) escaped = m - (kCodeSpace - 1);
    if (escaped == 1) escaped = 2;
    const unsigned direct = m - escaped;
    if (direct + (escaped ? 1 : 0) < 2) return false;

    uint64_t counts[256] = {};
    std::memset(p->lens, 0, sizeof(p->lens));
    for (unsigned i = escaped; i < m; ++i) counts[order[i]] = weights[order[i]];
    p->escaped = 0;
    for (unsigned i = 0; i < escaped; ++i) p->escaped += weights[order[i]];
    p->placeholder = 0;
    if (escaped) {
        while (counts[p->placeholder]) ++p->placeholder;
        counts[p->placeholder] = p->escaped;
    }
    uint8_t lens[256];
    limited_lengths(counts, kMaxLen, lens);
    p->bits = 8 * p->escaped;
    for (unsigned s = 0; s < 256; ++s) p->bits += counts[s] * lens[s];
    p->esc_len = escaped ? lens[p->placeholder] : 0;
    for (unsigned i = escaped; i < m; ++i) p->lens[order[i]] = lens[order[i]];
    p->codes = direct + (escaped ? 1 : 0);
    return true;
}

size_t estimate(const Plan& p, size_t n, uint64_t total, bool exact_counts) {
    const uint64_t code_bits = p.bits - 8 * p.escaped;
    double escaped = double(p.escaped), bytes = double(code_bits) / 8;
    if (!exact_counts) {
        const double scale = total ? double(n) / double(total) * (1 + 1.0 / 64) : 0.0;
        escaped *= scale;
        bytes *= scale;
    }
    return header_bytes(p.codes) + size_t(escaped) + size_t(bytes) + 2 + 2 * std::min<size_t>(n, kLanes);
}

Status encode(const uint8_t* src, size_t n, const Plan& p, uint8_t* dst, size_t cap, size_t* written) {
    *written = 0;
    const size_t hsize = header_bytes(p.codes);
    if (n == 0 || cap < hsize) return make_status(Code::kBufferTooSmall, "lanes: capacity below the header");
    detail::EncodeTables t;
    std::memset(&t, 0, sizeof(t));
    t.esc_rank = kCodeSpace;
    dst[0] = kTag;
    uint8_t syms[256];
    const unsigned m = write_symbol_map(p.lens, p.esc_len ? 1 : 0, dst + 5);
    if (p.esc_len) {
        uint8_t* nibbles = dst + 5 + kSymbolBitmapBytes;
        nibbles[m / 2] |= uint8_t(p.esc_len << (4 * (m & 1)));
    }
    read_symbol_bitmap(dst + 5, syms);
    unsigned rank = 0;
    canonical_codes(syms, m, p.lens, p.esc_len, p.placeholder, [&](unsigned s, unsigned len, unsigned code) {
        if (s == kEsc) {
            t.esc_rank = rank;
        } else {
            t.rank[s] = uint8_t(rank);
        }
        t.code[rank] = uint8_t(code);
        t.len[rank] = uint8_t(len);
        ++rank;
    });
    t.codes = rank;
    // Symbols without a code of their own are escaped (weights from a sample may
    // have missed none of src's symbols, by their contract, but call some rare).
    if (p.esc_len)
        for (unsigned s = 0; s < 256; ++s)
            if (!p.lens[s]) t.rank[s] = uint8_t(t.esc_rank);

    // Scratch: the ranks, the lane stream (laid out down from its end, with the
    // AVX-512 pass's 32 bytes of slack below), and the escaped symbols.
    thread_local std::vector<uint8_t> scratch;
    const size_t ranks_bytes = (n + 63) / 64 * 64, stream_room = n + 2 * kLanes + 32, escaped_room = n + 64;
    if (scratch.size() < ranks_bytes + stream_room + escaped_room) scratch.resize(ranks_bytes + stream_room + escaped_room);
    uint8_t* ranks = scratch.data();
    uint8_t* const stream_end = ranks + ranks_bytes + stream_room;
    uint8_t* const escaped_start = stream_end;
    uint8_t lane_bits[kLanes];
    uint8_t* stream = stream_end;
    uint8_t* escaped = escaped_start;
#if KVCORE_X86
    if (use_avx512()) {
        detail::rank_pass_avx512(src, n, t, ranks, lane_bits, &escaped);
        detail::lay_out_avx512(ranks, n, t, lane_bits, &stream);
    } else if (use_avx2()) {
        detail::rank_pass_avx2(src, n, t, ranks, lane_bits, &escaped);
        detail::lay_out_avx2(ranks, n, t, lane_bits, &stream);
    } else
#endif
    {
        detail::rank_pass_portable(src, n, t, ranks, lane_bits, &escaped);
        detail::lay_out_portable(ranks, n, t, lane_bits, &stream);
    }
    const size_t e = size_t(escaped - escaped_start), lanes_size = size_t(stream_end - stream);
    if (cap - hsize < e || cap - hsize - e < lanes_size)
        return make_status(Code::kBufferTooSmall, "lanes: stream would exceed the capacity");
    store_le32(dst + 1, uint32_t(e));
    std::memcpy(dst + hsize, escaped_start, e);
    std::memcpy(dst + hsize + e, stream, lanes_size);
    *written = hsize + e + lanes_size;
    return Status::ok();
}

Status decode(const uint8_t* src, size_t size, uint8_t* dst, size_t n) {
    if (size < kFixedHeader) return corrupt("lanes: truncated header");
    if (n == 0) return corrupt("lanes: stream for an empty plane");
    const size_t e = load_le32(src + 1);
    const uint8_t* bitmap = src + 5;
    uint8_t syms[256];  // the directly coded symbols, increasing
    const unsigned direct = read_symbol_bitmap(bitmap, syms);
    const unsigned codes = direct + (e ? 1 : 0);
    if (codes < 2 || codes > kCodeSpace) return corrupt("lanes: code count out of range");
    const size_t hsize = header_bytes(codes);
    if (size < hsize) return corrupt("lanes: truncated header");
    const uint8_t* nib = bitmap + kSymbolBitmapBytes;
    const auto length_at = [&](unsigned i) { return length_nibble(nib, i); };
    uint8_t lens[256];
    unsigned kraft = 0, placeholder = 0;
    for (unsigned i = 0; i < direct; ++i) {
        const unsigned len = length_at(i);
        if (len < 1 || len > kMaxLen) return corrupt("lanes: code length out of range");
        lens[syms[i]] = uint8_t(len);
        kraft += kCodeSpace >> len;
        if (syms[i] == placeholder) ++placeholder;  // the smallest value not coded directly
    }
    const unsigned esc_len = e ? length_at(direct) : 0;
    if (e && (esc_len < 1 || esc_len > kMaxLen)) return corrupt("lanes: code length out of range");
    if ((codes & 1) && length_at(codes) != 0) return corrupt("lanes: nonzero pad nibble");
    if (e) kraft += kCodeSpace >> esc_len;
    if (kraft != kCodeSpace) return corrupt("lanes: code lengths do not form a complete code");
    if (e > n || e > size - hsize) return corrupt("lanes: escaped bytes exceed the stream");

    detail::DecodeTables t;
    canonical_codes(syms, direct, lens, esc_len, placeholder, [&](unsigned s, unsigned len, unsigned code) {
        const uint8_t sym = uint8_t(s == kEsc ? placeholder : s);
        const unsigned span = kCodeSpace >> len;
        std::memset(t.sym + code * span, sym, span);
        std::memset(t.len + code * span, int(len), span);
    });
    const uint8_t* pos = src + hsize + e;
    const uint8_t* const end = src + size;
    size_t used = 0;
    thread_local std::vector<uint64_t> hits;
#if KVCORE_X86
    const auto kernel = use_avx512() ? detail::decode_steps_avx512 : use_avx2() ? detail::decode_steps_avx2 : nullptr;
#else
    constexpr decltype(&detail::decode_steps_avx2) kernel = nullptr;  // no SIMD decode steps in this build
#endif
    if (e && kernel && hits.size() < n / 64) hits.resize(n / 64);
    const detail::Escapes esc{src + hsize, e, uint8_t(placeholder), &used, hits.data()};
    detail::LaneState state;
    std::memset(&state, 0, sizeof(state));
    size_t step = 0;
    if (kernel) {
        step = kernel(&pos, end, t, state, 0, n, dst, esc);
        if (step < n / kLanes) {
            // The last whole steps, from a copy of the stream's last bytes (fewer than
            // kLanes) with room for the kernel's reads; a valid stream never takes
            // from the zeros past them.
            alignas(64) uint8_t rest[2 * kLanes] = {};
            const size_t left = size_t(end - pos);
            std::memcpy(rest, pos, left);
            const uint8_t* p = rest;
            step = kernel(&p, rest + sizeof(rest), t, state, step, n, dst, esc);
            if (size_t(p - rest) > left) return corrupt("lanes: lane stream ends early");
            pos += p - rest;
        }
    }
    const size_t portable_from = step * kLanes;
    if (!detail::decode_steps_portable(&pos, end, t, state, step, n, dst))
        return corrupt("lanes: lane stream ends early");
    if (pos != end) return corrupt("lanes: lane stream does not end at its size");
    // What each lane holds after its last code is the pad of the last byte it took
    // (a whole byte where it took one ahead), which the encoder leaves zero: an edit
    // there would otherwise decode to the same bytes unseen.
    for (unsigned l = 0; l < kLanes; ++l)
        if (state.window[l] != 0) return corrupt("lanes: nonzero pad bits");
    if (e) {
        detail::patch_marked_escapes(dst, portable_from / 64, esc);
        detail::patch_escapes_portable(dst + portable_from, n - portable_from, esc);
    }
    if (used != e) return corrupt("lanes: escape count does not match the escaped bytes");
    return Status::ok();
}

}  // namespace kvcore::entropy::lanes
