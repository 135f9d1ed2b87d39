// Internals of the byte-plane shuffle: the per-ISA variants and the residual
// pattern they share. Not part of the public interface (see shuffle.h).
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "shuffle/shuffle.h"

namespace kvcore::shuffle::detail {

// The widest block (in elements) any variant consumes per loop iteration.
constexpr size_t kMaxBlock = 128;

// The residual bytes unrolled so that SIMD code reads the residuals of a block
// of up to kMaxBlock consecutive elements with one unaligned load and no
// division: element j (counted from the start of the call) uses
// bytes()[pos] where pos = j mod period, and a block starting at position pos
// reads bytes()[pos .. pos + block). Advance pos between blocks with
// `advance(pos, step(block))`, one compare and subtract.
//
// Only the channels the call touches are materialised: min(n, period) + kMaxBlock
// bytes, built once per call in O(that) without divisions; nothing at all when
// the call does not wrap around the period (phase + n <= period).
class ResidualPattern {
public:
    ResidualPattern(const PlaneTransform& t, size_t n) : period_(t.period) {
        if (t.residual == nullptr) return;
        if (size_t(t.phase) + n <= period_) {
            // No wrap within the call: blocks read residual[phase + i, phase + i + block)
            // with i + block <= n, all inside the caller's residual.
            base_ = t.residual + t.phase;
            return;
        }
        const size_t len = (n < period_ ? n : period_) + kMaxBlock;
        own_.resize(len);
        uint32_t c = t.phase;
        for (size_t j = 0; j < len; ++j) {
            own_[j] = t.residual[c];
            if (++c == period_) c = 0;
        }
        base_ = own_.data();
    }

    bool active() const { return base_ != nullptr; }
    const uint8_t* bytes() const { return base_; }
    size_t step(size_t block) const { return block % period_; }
    void advance(size_t& pos, size_t step) const {
        pos += step;
        if (pos >= period_) pos -= period_;
    }

private:
    size_t period_;
    const uint8_t* base_ = nullptr;
    std::vector<uint8_t> own_;
};

// The transform for the elements from `done` on (phase moved by `done`).
inline PlaneTransform tail_transform(const PlaneTransform& t, size_t done) {
    PlaneTransform r = t;
    if (t.residual != nullptr) r.phase = static_cast<uint32_t>((t.phase + done) % t.period);
    return r;
}

void split_scalar(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes);
void merge_scalar(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst);

void split_avx2(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes);
void merge_avx2(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst);
void merge_hashed_avx2(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                       uint8_t* dst, Xxh3Stripes* hash, bool streaming);

void split_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* const* planes);
// split_avx512's kernel on whole steps of [0, n) that also feeds hash (nothing fed
// yet) the stripes of the hashed input, which starts at `input` (src or before it),
// as many as the steps cover and at most its in-order ones; returns the elements done.
size_t split_hashed_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                           uint8_t* const* planes, const uint8_t* input, Xxh3Stripes* hash);
// split with streaming stores (shuffle.h: Stores::kStreaming), planes at any alignment.
void split_streamed_avx512(const uint8_t* src, size_t n, unsigned elem_size, const PlaneTransform& t,
                           uint8_t* const* planes);
void merge_avx512(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t, uint8_t* dst);
void merge_hashed_avx512(const uint8_t* const* planes, size_t n, unsigned elem_size, const PlaneTransform& t,
                         uint8_t* dst, Xxh3Stripes* hash, bool streaming);

// A hashing merge kernel's loop is a loop of inner loops, each of steps of B
// elements that feed kStripes stripes: the feed's block ends (XXH3's scramble)
// fall between inner loops, so that no branch or call inside them makes GCC keep
// the accumulators on the stack (a store and a load per stripe). The end of the
// inner loop from element i: a block's worth of steps, or fewer where n ends
// first (*full = false: the last one).
template <size_t B, unsigned kStripes, typename Feed>
inline size_t inner_end(size_t i, size_t n, bool* full) {
    static_assert(Feed::kStripesPerBlock % kStripes == 0, "a step must not straddle a block end");
    constexpr size_t per_block = Feed::kStripesPerBlock / kStripes;
    const size_t steps = std::min(per_block, (n - i) / B);
    *full = steps == per_block;
    return i + steps * B;
}

// Scalar finish of a SIMD pass: elements [done, n) with the phase moved on.
inline void split_rest(const uint8_t* src, size_t n, size_t done, unsigned elem_size, const PlaneTransform& t,
                       uint8_t* const* planes) {
    if (done >= n) return;
    uint8_t* p[4] = {};
    for (unsigned k = 0; k < elem_size; ++k) p[k] = planes[k] + done;
    split_scalar(src + done * elem_size, n - done, elem_size, tail_transform(t, done), p);
}

inline void merge_rest(const uint8_t* const* planes, size_t n, size_t done, unsigned elem_size,
                       const PlaneTransform& t, uint8_t* dst) {
    if (done >= n) return;
    const uint8_t* p[4] = {};
    for (unsigned k = 0; k < elem_size; ++k) p[k] = planes[k] + done;
    merge_scalar(p, n - done, elem_size, tail_transform(t, done), dst + done * elem_size);
}

}  // namespace kvcore::shuffle::detail
