// The lane coder's passes, portable (see lane_kernels.h; the format is in
// lane_code.h).
#include "entropy/lane_kernels.h"

#include <algorithm>
#include <cstring>

namespace kvcore::entropy::lanes::detail {

void rank_pass_portable(const uint8_t* src, size_t n, const EncodeTables& t, uint8_t* ranks, uint8_t* lane_bits,
                        uint8_t** escaped) {
    std::fill(lane_bits, lane_bits + kLanes, uint8_t(0));
    uint8_t* x = *escaped;
    for (size_t i = 0; i < n; ++i) {
        const uint8_t r = t.rank[src[i]];
        ranks[i] = r;
        lane_bits[i % kLanes] = uint8_t(lane_bits[i % kLanes] + t.len[r]);
        *x = src[i];
        x += r == t.esc_rank;
    }
    *escaped = x;
}

// Backwards, each lane's window holds the first 16 bits of its bit string from
// its current symbol on (zeros past its end), and `bit` the string's length
// before that symbol, mod 256. The decoder takes a byte at step t exactly when
// its count drops below 8 (lane_code.h), which, with B the bits before symbol t
// and d the previous symbol's length (8 at t = 0), is when (B + 7) mod 8 < d; the
// byte it takes starts (-B) mod 8 bits into the window.
void lay_steps_portable(const uint8_t* ranks, size_t n, const EncodeTables& t, LayState& s, size_t first_step,
                        size_t end_step, uint8_t** stream) {
    uint8_t* q = *stream;
    for (size_t step = end_step; step-- > first_step;) {
        const size_t base = step * kLanes;
        const unsigned active = unsigned(std::min<size_t>(kLanes, n - base));
        for (unsigned l = active; l-- > 0;) {
            const unsigned r = ranks[base + l], len = t.len[r];
            s.window[l] = uint16_t((s.window[l] >> len) | (unsigned(t.code[r]) << (16 - len)));
            s.bit[l] = uint8_t(s.bit[l] - len);
            const unsigned prev = step ? t.len[ranks[base - kLanes + l]] : 8;
            // Stored below the stream either way; kept where the lane takes it (a
            // branch on that mispredicts about a third of the time).
            q[-1] = uint8_t(uint16_t(s.window[l] << ((0u - s.bit[l]) & 7u)) >> 8);
            q -= ((s.bit[l] + 7u) & 7u) < prev;
        }
    }
    *stream = q;
}

void lay_out_portable(const uint8_t* ranks, size_t n, const EncodeTables& t, const uint8_t* lane_bits,
                      uint8_t** stream) {
    LayState s{};
    std::copy(lane_bits, lane_bits + kLanes, s.bit);
    lay_steps_portable(ranks, n, t, s, 0, (n + kLanes - 1) / kLanes, stream);
}

// One step of the lanes [0, active): each refills from p (bytes read: p[0, active)
// when `checked` is false, else only those below end) and decodes a symbol.
// Returns p past the bytes taken, or nullptr when the stream runs out.
template <bool kChecked>
inline const uint8_t* step_lanes(const DecodeTables& t, uint16_t* __restrict window, uint16_t* __restrict bits,
                                 unsigned active, const uint8_t* p, const uint8_t* end, uint8_t* __restrict out) {
    for (unsigned l = 0; l < active; ++l) {
        unsigned w = window[l], b = bits[l];
        const unsigned take = (b - 8u) >> 31;  // b < 8, without a setcc (its partial write chained the lanes)
        if (kChecked && take && p == end) return nullptr;
        const unsigned byte = !kChecked || p < end ? *p : 0u;
        w |= (byte << ((8 - b) & 15)) & (0u - take);  // without a branch (taken about a third of the time)
        p += take;
        b += 8 * take;
        const unsigned idx = (w >> 9) & (kCodeSpace - 1), len = t.len[idx];
        const uint8_t sym = t.sym[idx];
        window[l] = uint16_t(w << len);
        bits[l] = uint16_t(b - len);
        out[l] = sym;
    }
    return p;
}

bool decode_steps_portable(const uint8_t** pos, const uint8_t* end, const DecodeTables& t, LaneState& s,
                           size_t step, size_t n, uint8_t* dst) {
    const uint8_t* p = *pos;
    const size_t steps = (n + kLanes - 1) / kLanes;
    for (; step < steps; ++step) {
        const size_t base = step * kLanes;
        const unsigned active = unsigned(std::min<size_t>(kLanes, n - base));
        // More bytes left than lanes: p[0, active) is in bounds for the whole step.
        p = size_t(end - p) > active ? step_lanes<false>(t, s.window, s.bits, active, p, end, dst + base)
                                     : step_lanes<true>(t, s.window, s.bits, active, p, end, dst + base);
        if (p == nullptr) return false;
    }
    *pos = p;
    return true;
}

void patch_escapes_portable(uint8_t* dst, size_t n, const Escapes& esc) {
    size_t j = *esc.used;
    const auto patch = [&](size_t from, size_t to) {
        for (size_t i = from; i < to; ++i) {
            if (dst[i] != esc.placeholder) continue;
            if (j < esc.count) dst[i] = esc.bytes[j];
            ++j;
        }
    };
    // Eight bytes at a time, looked at one by one only where one is a placeholder
    // (a word holds a zero byte exactly when (x - 0x01..) & ~x & 0x80.. is nonzero).
    constexpr uint64_t kOnes = 0x0101010101010101ull, kTops = 0x8080808080808080ull;
    const uint64_t marks = kOnes * esc.placeholder;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        std::memcpy(&x, dst + i, 8);
        x ^= marks;
        if ((x - kOnes) & ~x & kTops) patch(i, i + 8);
    }
    patch(i, n);
    *esc.used = j;
}

void patch_marked_escapes(uint8_t* dst, size_t words, const Escapes& esc) {
    size_t j = *esc.used;
    // Marked words are found 64 at a time through a mask of them made without
    // branches (a branch on each word mispredicts on the 10-20% that hold one).
    for (size_t k0 = 0; k0 < words; k0 += 64) {
        const unsigned span = unsigned(std::min<size_t>(64, words - k0));
        uint64_t marked = 0;
        for (unsigned i = 0; i < span; ++i) marked |= uint64_t(esc.hits[k0 + i] != 0) << i;
        for (; marked; marked &= marked - 1) {
            const size_t k = k0 + unsigned(__builtin_ctzll(marked));
            for (uint64_t m = esc.hits[k]; m; m &= m - 1, ++j)
                if (j < esc.count) dst[64 * k + unsigned(__builtin_ctzll(m))] = esc.bytes[j];
        }
    }
    *esc.used = j;
}

}  // namespace kvcore::entropy::lanes::detail
