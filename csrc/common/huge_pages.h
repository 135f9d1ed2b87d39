// Transparent huge pages for large fresh buffers.
//
// A freshly allocated output (a decompressed tensor, a frame) is touched for
// the first time by the codec; with 4 KiB pages that costs one page fault per
// 4 KiB, which on a large buffer takes longer than decoding it. Asking for
// huge pages first (where THP is in "madvise" mode) cuts the faults 512-fold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/mman.h>

namespace kvcore {

inline void advise_huge_pages(void* data, size_t size) {
    constexpr uintptr_t kHuge = uintptr_t(2) << 20;
    if (size < 2 * kHuge) return;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(kHuge - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advisory only
}

}  // namespace kvcore
