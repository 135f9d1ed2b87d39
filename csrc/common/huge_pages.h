// Large fresh buffers: transparent huge pages, and faulting pages in ahead of
// the writer that would otherwise fault them.
//
// A freshly allocated output (a decompressed tensor, a frame) is touched for
// the first time by the codec; with 4 KiB pages that costs one page fault per
// 4 KiB, which on a large buffer takes longer than decoding it. Asking for
// huge pages first (where THP is in "madvise" mode) cuts the faults 512-fold.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/mman.h>
#include <unistd.h>

namespace kvcore {

constexpr uintptr_t kHugePageBytes = uintptr_t(2) << 20;

inline void advise_huge_pages(void* data, size_t size) {
    if (size < 2 * kHugePageBytes) return;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(kHugePageBytes - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advisory only
}

// Faults a buffer's pages in ahead of a writer that fills it front to back
// (the in-order blocks of a frame). A fault that hits the writer holds up
// whoever waits for its block; faulted here, by a thread between blocks, it
// does not. That matters where page faults do not run in parallel: on the
// 2-vCPU Firecracker VM a fresh 64 MiB buffer faulted in no faster with two
// threads than with one (5.2 ms with huge pages), and 2-thread compression of
// 64 MiB into a new bytes object ran 1.1-1.3x the speed of one thread, against
// 1.75x into a reused buffer (1.7x with the pages faulted in here).
// MADV_POPULATE_WRITE (Linux 5.14) maps the pages writable without writing
// them, so it never races the writer's bytes; where the kernel lacks it,
// nothing is faulted ahead and the writer faults as before.
class FaultAhead {
public:
    FaultAhead(uint8_t* data, size_t size)
        : end_(reinterpret_cast<uintptr_t>(data) + size),
          done_((reinterpret_cast<uintptr_t>(data) + page_bytes() - 1) & ~(page_bytes() - 1)) {}

    // Keeps the `window` bytes past `at` faulted in (clipped to the buffer), in
    // whole huge pages, topping them up once fewer than half remain, so that
    // pages are faulted in few large calls (many 2 MiB calls ran slower on the
    // VM). Skipped while another thread is faulting pages in already: faults
    // from two threads at once ran no faster than from one there.
    void keep_ahead(const uint8_t* at, size_t window) {
        const uintptr_t from_at = reinterpret_cast<uintptr_t>(at);
        if (done_.load(std::memory_order_relaxed) >= from_at + window / 2) return;
        uintptr_t want = (from_at + window + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
        if (want > end_) want = end_ & ~(page_bytes() - 1);
        if (busy_.exchange(true, std::memory_order_acquire)) return;
        const uintptr_t from = done_.load(std::memory_order_relaxed);
        if (from < want) {
            // Unsupported (before Linux 5.14): stop trying; the writer faults its pages.
            const bool ok = madvise(reinterpret_cast<void*>(from), want - from, kPopulateWrite) == 0;
            done_.store(ok ? want : UINTPTR_MAX, std::memory_order_relaxed);
        }
        busy_.store(false, std::memory_order_release);
    }

private:
    static uintptr_t page_bytes() {
        static const uintptr_t bytes = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        return bytes;
    }
    static constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, missing from older headers
    const uintptr_t end_;
    std::atomic<uintptr_t> done_;  // pages below are faulted in
    std::atomic<bool> busy_{false};
};

}  // namespace kvcore
