#include "frame/block_commit.h"

#include <algorithm>

#include "copy/copy_engine.h"
#include "parallel/thread_pool.h"

namespace kvcore::frame {
namespace {

// Spill buffers kept between batches (at most one per hardware thread, as many
// as the per-thread encode buffers they replaced), so a batch does not allocate
// and fault in fresh ones on every call.
std::mutex cache_mutex;
std::vector<std::unique_ptr<AlignedBuffer>> cache;

std::unique_ptr<AlignedBuffer> cached_buffer() {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.empty()) return std::make_unique<AlignedBuffer>();
    std::unique_ptr<AlignedBuffer> buf = std::move(cache.back());
    cache.pop_back();
    return buf;
}

}  // namespace

void FrameDest::write(uint64_t at, const uint8_t* src, uint64_t n, bool streaming) const {
    if (head != nullptr && at < head_bytes) {
        const uint64_t first = std::min(n, head_bytes - at);
        copy::copy_bytes(head + at, src, first, streaming);
        at += first;
        src += first;
        n -= first;
    }
    copy::copy_bytes(dst + at, src, n, streaming);
}

BlockCommits::BlockCommits(size_t max_spills, bool streaming_copies)
    : max_spills_(std::max<size_t>(1, max_spills)), streaming_copies_(streaming_copies) {
    // Each list holds at most every spill buffer: reserved, so that done() and
    // copy_ready() never allocate (a block must reach them whatever happens).
    pending_.reserve(max_spills_);
    free_.reserve(max_spills_);
    owned_.reserve(max_spills_);
}

BlockCommits::~BlockCommits() {
    std::lock_guard<std::mutex> lock(cache_mutex);
    for (auto& buf : owned_)
        if (cache.size() < hardware_threads()) cache.push_back(std::move(buf));
}

size_t BlockCommits::add_frame(const FrameDest& dest, uint64_t first_offset, size_t n_blocks) {
    std::lock_guard<std::mutex> lock(mutex_);
    Frame f;
    f.dest = dest;
    f.end = first_offset;
    f.sizes.assign(n_blocks, kUnknown);
    f.offsets.assign(n_blocks, 0);
    frames_.push_back(std::move(f));
    return frames_.size() - 1;
}

BlockCommits::Placement BlockCommits::place(size_t i, size_t b, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        const Frame& f = frames_[i];
        const bool in_turn = f.next == b;
        if (in_turn) {
            if (uint8_t* p = f.dest.contiguous(f.end, bytes)) return {p, f.end, nullptr};
        }
        AlignedBuffer* buf = nullptr;
        Spilled ready;
        uint64_t ready_at = 0;
        if (!free_.empty()) {
            buf = free_.back();
            free_.pop_back();
        } else if (owned_.size() < max_spills_ || in_turn) {
            buf = add_spill();
        } else if (take_ready(&ready, &ready_at)) {
            // Every buffer is taken: place a block whose offset is known and reuse its buffer.
            lock.unlock();
            copy(ready, ready_at);
            buf = ready.buf;
        } else {
            cv_.wait(lock);
            continue;
        }
        if (lock.owns_lock()) lock.unlock();
        buf->ensure(bytes);
        return {nullptr, 0, buf};
    }
}

AlignedBuffer* BlockCommits::add_spill() {
    // The lists hold at most every buffer: room for one more now keeps done()
    // and copy_ready() from allocating.
    pending_.reserve(owned_.size() + 1);
    free_.reserve(owned_.size() + 1);
    owned_.reserve(owned_.size() + 1);
    owned_.push_back(cached_buffer());
    return owned_.back().get();
}

BlockCommits::Placed BlockCommits::done(size_t i, size_t b, size_t size, AlignedBuffer* spill) {
    Placed placed;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        Frame& f = frames_[i];
        f.sizes[b] = size;
        while (f.next < f.sizes.size() && f.sizes[f.next] != kUnknown) {
            f.offsets[f.next] = f.end;
            f.end += f.sizes[f.next];
            ++f.next;
        }
        if (spill != nullptr) pending_.push_back({i, b, spill, size});
        placed = {f.end, f.next};
    }
    cv_.notify_all();
    return placed;
}

void BlockCommits::copy_ready() {
    for (;;) {
        Spilled s;
        uint64_t at = 0;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!take_ready(&s, &at)) return;
        }
        copy(s, at);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            free_.push_back(s.buf);
        }
        cv_.notify_all();
    }
}

uint64_t BlockCommits::end(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return frames_[i].end;
}

bool BlockCommits::take_ready(Spilled* out, uint64_t* at) {
    for (size_t k = 0; k < pending_.size(); ++k) {
        const Spilled& s = pending_[k];
        const Frame& f = frames_[s.frame];
        if (s.block >= f.next) continue;
        *out = s;
        *at = f.offsets[s.block];
        pending_[k] = pending_.back();
        pending_.pop_back();
        return true;
    }
    return false;
}

void BlockCommits::copy(const Spilled& s, uint64_t at) {
    // The frame's bytes are written once: the offset is final and no other block overlaps it.
    frames_[s.frame].dest.write(at, s.buf->data(), s.size, streaming_copies_);
}

}  // namespace kvcore::frame
