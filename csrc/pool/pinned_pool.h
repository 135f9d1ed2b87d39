// A bounded pool of page-locked host memory for KV chunks and compressed frames.
//
// The pool reserves its capacity up front in segments (separate mappings, so
// no single page-lock or CUDA registration is huge), backs them with 2 MiB huge
// pages when the system has them (normal pages otherwise), binds them to a NUMA
// node when asked, and page-locks them with mlock. Variable-size blocks are
// handed out by a best-fit allocator with immediate coalescing (address order
// breaks ties), which keeps fragmentation low; a block never spans two
// segments. The pool never grows past its capacity: when no free block is
// large enough, allocate() fails with kPoolExhausted or waits for a release.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvcore::pool {

constexpr size_t kHugePageBytes = size_t(2) << 20;
constexpr size_t kDefaultSegmentBytes = size_t(1) << 30;

struct PoolOptions {
    size_t capacity = 0;          // bytes the allocator may hand out (rounded up to alignment)
    size_t segment_bytes = 0;     // 0: min(capacity, 1 GiB); also the largest block
    size_t alignment = 4096;      // power of two, 64 .. 2 MiB: block start and size granule
    bool huge_pages = true;       // try MAP_HUGETLB 2 MiB pages first
    bool lock = true;             // mlock every segment (fails with a message naming RLIMIT_MEMLOCK)
    int numa_node = -1;           // >= 0: mbind(MPOL_BIND) every segment to this node
};

// How a segment is backed.
enum class PageKind : uint8_t { kHugeTlb = 0, kTransparentHuge = 1, kNormal = 2 };
const char* page_kind_name(PageKind kind);

struct PoolStats {
    uint64_t capacity = 0;
    uint64_t used = 0;            // bytes in live blocks (rounded sizes)
    uint64_t free = 0;
    uint64_t largest_free = 0;    // largest block allocate() could return now
    uint64_t allocations = 0;     // live blocks
    uint64_t total_allocations = 0;
    uint64_t failed_allocations = 0;
    uint64_t free_blocks = 0;     // number of free extents (fragmentation indicator)
    uint64_t segments = 0;
    uint64_t segment_bytes = 0;
    uint64_t reserved_bytes = 0;  // bytes mapped (>= capacity: huge-page rounding)
    uint64_t alignment = 0;
    PageKind page_kind = PageKind::kNormal;
    bool locked = false;
    int numa_node = -1;
};

struct SegmentInfo {
    uint8_t* base;
    size_t size;  // bytes usable by the allocator
};

// One mapping; unmapped on destruction.
class Mapping {
public:
    Mapping() = default;
    Mapping(void* base, size_t length) : base_(static_cast<uint8_t*>(base)), length_(length) {}
    Mapping(Mapping&& other) noexcept;
    Mapping& operator=(Mapping&& other) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
    uint8_t* data() const { return base_; }
    size_t length() const { return length_; }

private:
    uint8_t* base_ = nullptr;
    size_t length_ = 0;
};

class PinnedPool {
public:
    static Status create(const PoolOptions& options, std::shared_ptr<PinnedPool>* out);

    PinnedPool(const PinnedPool&) = delete;
    PinnedPool& operator=(const PinnedPool&) = delete;

    // Allocates a block of at least nbytes (nbytes == 0 takes one granule).
    // timeout_ms < 0 waits without limit, 0 never waits. A request larger than
    // a segment fails with kInvalidArgument (it can never be satisfied). A
    // kPoolExhausted failure counts in stats().failed_allocations unless
    // count_failure is false (the attempts of a wait in slices, which counts once).
    Status allocate(size_t nbytes, int64_t timeout_ms, uint8_t** out, bool count_failure = true);
    // Returns a block to the pool; unknown pointers give kInvalidArgument.
    Status release(uint8_t* ptr);

    PoolStats stats() const;
    std::vector<SegmentInfo> segments() const;
    // Rounded size of the live block at ptr (0 if none).
    size_t block_size(const uint8_t* ptr) const;
    // True if [ptr, ptr + n) lies inside one segment.
    bool contains(const uint8_t* ptr, size_t n) const;

    struct Key {  // only create() can construct a pool
    private:
        friend class PinnedPool;
        Key() = default;
    };
    PinnedPool(Key, const PoolOptions& options) : options_(options) {}

private:
    Status reserve();
    bool try_allocate_locked(size_t rounded, uint8_t** out);
    uint64_t largest_free_locked() const;

    PoolOptions options_;
    std::vector<Mapping> mappings_;
    std::vector<SegmentInfo> segments_;
    PageKind page_kind_ = PageKind::kNormal;
    bool locked_ = false;

    // Allocator state. Offsets live in a virtual space where segment i starts
    // at i * stride_ (stride_ > segment size, so extents never merge across
    // segments).
    uint64_t stride_ = 0;
    mutable std::mutex mutex_;
    std::condition_variable released_;
    std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> size
    std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (size, offset)
    std::unordered_map<uint64_t, uint64_t> live_;           // offset -> size
    uint64_t used_ = 0;
    uint64_t total_allocations_ = 0;
    uint64_t failed_allocations_ = 0;

    uint64_t to_offset(const uint8_t* ptr) const;  // UINT64_MAX if outside
    uint8_t* to_pointer(uint64_t offset) const;
    void insert_free(uint64_t offset, uint64_t size);
    void erase_free(std::map<uint64_t, uint64_t>::iterator it);
};

// Current RLIMIT_MEMLOCK soft limit in bytes (UINT64_MAX = unlimited).
uint64_t memlock_limit();
// Number of NUMA nodes the system reports (1 if unknown).
int numa_node_count();

}  // namespace kvcore::pool
