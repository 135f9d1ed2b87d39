#include "copy/copy_engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/arch.h"
#include "cpu/cpu_features.h"
#include "parallel/thread_pool.h"

#if KVCORE_X86
#include <immintrin.h>
#endif

namespace kvcore::copy {
namespace {

constexpr size_t kDefaultSlice = size_t(1) << 20;
// Below this size one thread copies alone (the pool's hand-off costs more).
constexpr size_t kParallelMin = size_t(2) << 20;

bool overlaps(const uint8_t* a, const uint8_t* b, size_t n) { return a < b + n && b < a + n; }

#if KVCORE_X86
// Streaming copy: align the destination to 32 bytes, then 128 bytes per
// iteration with non-temporal stores; sfence makes them visible before return.
__attribute__((target("avx2,bmi,bmi2"))) void copy_stream_avx2(uint8_t* d, const uint8_t* s, size_t n) {
    if (n < 512) {
        std::memcpy(d, s, n);
        return;
    }
    const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        _mm_prefetch(reinterpret_cast<const char*>(s) + 512, _MM_HINT_NTA);
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
        const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
        const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
    }
    for (; n >= 32; n -= 32, d += 32, s += 32)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
    _mm_sfence();
    std::memcpy(d, s, n);
}
#endif

size_t threshold_of(const CopyOptions& o) { return o.nt_threshold ? o.nt_threshold : cpu::llc_bytes(); }
size_t slice_of(const CopyOptions& o) { return o.slice_bytes ? o.slice_bytes : kDefaultSlice; }

// A task is a run of segments [first, last] where the first starts at
// `first_offset` and the last ends at `last_end` (slices of big segments).
struct Task {
    size_t first, last;
    size_t first_offset, last_end;
};

std::vector<Task> plan(const Segment* segs, size_t count, size_t slice) {
    std::vector<Task> tasks;
    size_t i = 0, off = 0;
    while (i < count) {
        Task t{i, i, off, 0};
        size_t budget = slice;
        for (;;) {
            const size_t left = segs[i].size - off;
            if (left > budget) {  // cut this segment
                off += budget;
                t.last = i;
                t.last_end = off;
                break;
            }
            budget -= left;
            t.last = i;
            t.last_end = segs[i].size;
            ++i;
            off = 0;
            if (i == count || budget == 0) break;
        }
        tasks.push_back(t);
    }
    return tasks;
}

}  // namespace

const char* variant() { return KVCORE_X86 && (cpu::active_isa() & cpu::kIsaAvx2) ? "avx2-nt" : "memcpy"; }

void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n, bool streaming) {
    if (n == 0) return;
#if KVCORE_X86
    if (streaming && (cpu::active_isa() & cpu::kIsaAvx2)) {
        copy_stream_avx2(dst, src, n);
        return;
    }
#else
    (void)streaming;  // no streaming stores in this build
#endif
    std::memcpy(dst, src, n);
}

Status copy(uint8_t* dst, const uint8_t* src, size_t n, const CopyOptions& options) {
    if (n == 0) return Status::ok();
    if (dst == nullptr || src == nullptr) return invalid("copy: null pointer");
    if (overlaps(dst, src, n)) {
        std::memmove(dst, src, n);
        return Status::ok();
    }
    const bool streaming = n >= threshold_of(options);
    if (n < kParallelMin || options.threads == 1) {
        copy_bytes(dst, src, n, streaming);
        return Status::ok();
    }
    const size_t slice = std::max(slice_of(options), size_t(64) << 10);
    const size_t parts = (n + slice - 1) / slice;
    default_pool().parallel_for(parts, options.threads, [&](size_t p) {
        const size_t begin = p * slice, len = std::min(slice, n - begin);
        copy_bytes(dst + begin, src + begin, len, streaming);
    });
    return Status::ok();
}

Status copy_many(const Segment* all, size_t all_count, const CopyOptions& options) {
    for (size_t i = 0; i < all_count; ++i)
        if (all[i].size && (all[i].dst == nullptr || all[i].src == nullptr)) return invalid("copy: null pointer");
    // A segment that overlaps its own source is moved whole (memmove order),
    // never split over threads.
    std::vector<Segment> rest;
    const Segment* segs = all;
    size_t count = all_count;
    bool any_overlap = false;
    for (size_t i = 0; i < all_count && !any_overlap; ++i)
        any_overlap = all[i].size && overlaps(all[i].dst, all[i].src, all[i].size);
    if (any_overlap) {
        for (size_t i = 0; i < all_count; ++i) {
            if (all[i].size && overlaps(all[i].dst, all[i].src, all[i].size))
                std::memmove(all[i].dst, all[i].src, all[i].size);
            else
                rest.push_back(all[i]);
        }
        segs = rest.data();
        count = rest.size();
    }
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) total += segs[i].size;
    if (total == 0) return Status::ok();
    const bool streaming = total >= threshold_of(options);
    auto run = [&](const Task& t) {
        for (size_t i = t.first; i <= t.last; ++i) {
            const size_t begin = i == t.first ? t.first_offset : 0;
            const size_t end = i == t.last ? t.last_end : segs[i].size;
            if (end <= begin) continue;
            copy_bytes(segs[i].dst + begin, segs[i].src + begin, end - begin, streaming);
        }
    };
    if (total < kParallelMin || options.threads == 1) {
        run(Task{0, count - 1, 0, segs[count - 1].size});
        return Status::ok();
    }
    const std::vector<Task> tasks = plan(segs, count, std::max(slice_of(options), size_t(64) << 10));
    default_pool().parallel_for(tasks.size(), options.threads, [&](size_t k) { run(tasks[k]); });
    return Status::ok();
}

Status gather(uint8_t* dst, const uint8_t* const* srcs, size_t count, size_t block_bytes, const CopyOptions& options) {
    std::vector<Segment> segs(count);
    for (size_t i = 0; i < count; ++i) segs[i] = {dst + i * block_bytes, srcs[i], block_bytes};
    return copy_many(segs.data(), count, options);
}

Status scatter(uint8_t* const* dsts, const uint8_t* src, size_t count, size_t block_bytes, const CopyOptions& options) {
    std::vector<Segment> segs(count);
    for (size_t i = 0; i < count; ++i) segs[i] = {dsts[i], src + i * block_bytes, block_bytes};
    return copy_many(segs.data(), count, options);
}

}  // namespace kvcore::copy
