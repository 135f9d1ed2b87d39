// The in-order placement of a compress batch's blocks in their frames.
//
// Blocks are coded in parallel, but a block's offset in its frame is the sum of
// the sizes of the blocks before it. A block whose predecessors are all placed
// ("in turn") is coded straight into its frame. Any other block is coded into a
// spill buffer, and its thread moves on to its next block: the spilled bytes are
// copied to their place by whichever thread calls copy_ready() once the offset
// is known. Until 2026-12 such a thread instead waited for its predecessor: on
// a 2-vCPU VM a 2-thread compress of 64 MiB then kept its threads busy 1.70-1.96
// of 2 (a stalled vCPU stalled the other), and 1.93-1.96 with spilling. Spill
// buffers are bounded, so a thread still waits when all are taken by blocks
// whose offsets are unknown.
//
// A frame may start in a separate head buffer (FrameDest): a block in turn whose
// bytes would straddle the head's end is coded into a spill buffer too.
//
// Deadlock-free as long as tasks are claimed in (frame, block) order (the thread
// pool's parallel_for does): the earliest unfinished block is then in turn, and a
// block in turn never waits (a straddling one takes a spill buffer past the bound).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/aligned_buffer.h"

namespace kvcore::frame {

// Where a frame's bytes go: its first head_bytes to head when head is set, the
// rest (or all of them) to the same offsets in dst.
struct FrameDest {
    uint8_t* dst = nullptr;
    uint8_t* head = nullptr;
    uint64_t head_bytes = 0;

    // The address of bytes [at, at + n) when they lie in one buffer, else nullptr.
    uint8_t* contiguous(uint64_t at, uint64_t n) const {
        if (head == nullptr || at >= head_bytes) return dst + at;
        return n <= head_bytes - at ? head + at : nullptr;
    }
    // Writes n bytes at offset `at`, split between the two buffers where they
    // straddle; with streaming (non-temporal) stores where `streaming`.
    void write(uint64_t at, const uint8_t* src, uint64_t n, bool streaming = false) const;
};

class BlockCommits {
public:
    // At most max_spills spill buffers (at least 1) are in use at once. With
    // streaming_copies, spilled blocks are copied to their frames with streaming
    // stores (for frames too large to stay cached: see encode_frames).
    explicit BlockCommits(size_t max_spills, bool streaming_copies = false);
    ~BlockCommits();  // hands its buffers to a process-wide cache for the next batch
    BlockCommits(const BlockCommits&) = delete;
    BlockCommits& operator=(const BlockCommits&) = delete;

    // Registers a frame of n_blocks blocks whose first block starts first_offset
    // bytes into it; returns its index for the calls below.
    size_t add_frame(const FrameDest& dest, uint64_t first_offset, size_t n_blocks);

    // Where to code block b of frame i, of at most `bytes` bytes: either in place
    // (in_place set, with `at` its offset in the frame), when it is in turn and
    // those bytes lie in one of the frame's buffers, or a spill buffer of at least
    // `bytes` (waiting while none is free and the block is not in turn).
    struct Placement {
        uint8_t* in_place = nullptr;
        uint64_t at = 0;
        AlignedBuffer* spill = nullptr;
    };
    Placement place(size_t i, size_t b, size_t bytes);

    struct Placed {
        uint64_t end;      // the end of the frame's blocks whose offsets are known
        size_t committed;  // how many blocks those are
    };
    // Block b of frame i took `size` bytes, coded in place or into `spill` (the
    // buffer place() returned, now pending until copied).
    Placed done(size_t i, size_t b, size_t size, AlignedBuffer* spill);

    // Copies every pending spilled block whose offset is known into its frame.
    // After every block is done, this places the rest.
    void copy_ready();

    // The frame's size so far: the end of its known blocks.
    uint64_t end(size_t i);

private:
    struct Frame {
        FrameDest dest;
        uint64_t end;                   // end of blocks [0, next)
        size_t next = 0;                // blocks before it have known offsets
        std::vector<uint64_t> sizes;    // kUnknown until done
        std::vector<uint64_t> offsets;  // valid below next
    };
    struct Spilled {
        size_t frame, block;
        AlignedBuffer* buf;
        size_t size;
    };
    static constexpr uint64_t kUnknown = UINT64_MAX;

    // Under mutex_: removes a pending block whose offset is known into *out.
    bool take_ready(Spilled* out, uint64_t* at);
    // Under mutex_: one more spill buffer, whatever the bound (for a block in turn).
    AlignedBuffer* add_spill();
    // Copies s's bytes to `at` in its frame (outside mutex_: only its taker holds s).
    void copy(const Spilled& s, uint64_t at);

    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<Frame> frames_;
    std::vector<Spilled> pending_;
    std::vector<AlignedBuffer*> free_;
    std::vector<std::unique_ptr<AlignedBuffer>> owned_;
    const size_t max_spills_;
    const bool streaming_copies_;
};

}  // namespace kvcore::frame
