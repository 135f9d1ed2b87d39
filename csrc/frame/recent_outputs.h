// Whether a decode call's output is still cached, judged from the decode calls
// before it.
//
// A decode merges its planes into the output. Where the output's lines are not
// cached, cached stores first read each of them from DRAM; streaming stores do
// not. One call whose outputs total cpu::streaming_store_bytes() knows that from
// its size. A KV chunk restored one frame per call (72 calls of 512 KiB into the
// buffers of its layers) does not: each call's output is small, but all of them
// together are twice the cache, so by the time a buffer is written again it has
// long left the cache. The merge then costs 93 ps a byte instead of about 49.
//
// RecentOutputs remembers the address ranges of the last calls and the bytes each
// moved through the cache: the frame it read and the output it wrote (which its
// caller then reads, whether it was written with streaming stores or not). A
// call's output counts as cold when the calls before it moved at least `window`
// bytes through the cache without writing any byte of its range: a buffer written
// again only after that much traffic has been evicted. Otherwise, and without that
// much history (a process's first calls, or only small frames), it counts as warm:
// cached stores, as before this existed. A caller's own use of the buffer in
// between is not seen; the worst case is a buffer that the caller has just filled,
// which streaming stores then evict.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace kvcore::frame {

class RecentOutputs {
public:
    // Calls remembered: enough to cover a window of 16-32 MiB with frames of 256
    // KiB or more (smaller outputs gain little from streaming stores).
    static constexpr size_t kCalls = 128;

    explicit RecentOutputs(uint64_t window_bytes) : window_(window_bytes) {}

    // Whether [lo, hi) (the addresses of a call's outputs, as one range) is cold by
    // the rule above.
    bool cold(uintptr_t lo, uintptr_t hi) const;
    // Records a call: its output range and the bytes it moved through the cache.
    void record(uintptr_t lo, uintptr_t hi, uint64_t bytes);

    // fork() handlers: the lock is held across fork(), so that a child never starts
    // with it taken by a thread that does not exist there.
    void before_fork() { mu_.lock(); }
    void after_fork() { mu_.unlock(); }

private:
    struct Call {
        uintptr_t lo = 0, hi = 0;
        uint64_t bytes = 0;
    };
    const uint64_t window_;
    mutable std::mutex mu_;  // decode calls may run on several Python threads at once
    std::array<Call, kCalls> calls_{};
    size_t next_ = 0;   // where the next call goes
    size_t count_ = 0;  // calls held, at most kCalls
};

// The history of this process's decode calls, with a window of
// cpu::streaming_store_bytes() (fork-safe: see before_fork).
RecentOutputs& recent_decode_outputs();

}  // namespace kvcore::frame
