#include "pool/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>

#include "parallel/thread_pool.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif

namespace kvcore::pool {
namespace {

constexpr int kMpolBind = 2;            // MPOL_BIND (linux/mempolicy.h)
constexpr unsigned kMpolMfStrict = 1u;  // MPOL_MF_STRICT
constexpr unsigned kMpolMfMove = 2u;    // MPOL_MF_MOVE

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

bool is_power_of_two(size_t v) { return v && !(v & (v - 1)); }

std::string bytes_text(uint64_t n) {
    if (n == UINT64_MAX) return "unlimited";
    return std::to_string(n) + " bytes (" + std::to_string(n >> 20) + " MiB)";
}

Status bind_to_node(void* addr, size_t len, int node) {
    const size_t words = size_t(node) / (8 * sizeof(unsigned long)) + 1;
    std::vector<unsigned long> mask(words, 0);
    mask[size_t(node) / (8 * sizeof(unsigned long))] |= 1ul << (size_t(node) % (8 * sizeof(unsigned long)));
    const unsigned long maxnode = words * 8 * sizeof(unsigned long) + 1;
    if (syscall(SYS_mbind, addr, len, kMpolBind, mask.data(), maxnode, kMpolMfStrict | kMpolMfMove) != 0) {
        const int err = errno;
        return make_status(Code::kBackendError, "mbind to NUMA node " + std::to_string(node) +
                                                    " failed: " + std::strerror(err));
    }
    return Status::ok();
}

Status lock_error(size_t segment_bytes, size_t total_bytes, int err) {
    return make_status(
        Code::kOutOfMemory,
        "cannot page-lock the pinned pool: mlock of a " + bytes_text(segment_bytes) + " segment failed (" +
            std::strerror(err) + "). RLIMIT_MEMLOCK (ulimit -l) is " + bytes_text(memlock_limit()) +
            " and the pool needs " + bytes_text(total_bytes) +
            " locked. Raise RLIMIT_MEMLOCK (ulimit -l unlimited; LimitMEMLOCK=infinity for a systemd "
            "service; docker --ulimit memlock=-1), or create the pool with lock=False.");
}

}  // namespace

const char* page_kind_name(PageKind kind) {
    switch (kind) {
        case PageKind::kHugeTlb: return "hugetlb";
        case PageKind::kTransparentHuge: return "thp";
        case PageKind::kNormal: break;
    }
    return "normal";
}

uint64_t memlock_limit() {
    struct rlimit rl {};
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
    return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(rl.rlim_cur);
}

int numa_node_count() {
    int n = 0;
    while (access(("/sys/devices/system/node/node" + std::to_string(n)).c_str(), F_OK) == 0) ++n;
    return n == 0 ? 1 : n;
}

Mapping::Mapping(Mapping&& other) noexcept : base_(other.base_), length_(other.length_) {
    other.base_ = nullptr;
    other.length_ = 0;
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
    if (this != &other) {
        if (base_) munmap(base_, length_);
        base_ = other.base_;
        length_ = other.length_;
        other.base_ = nullptr;
        other.length_ = 0;
    }
    return *this;
}

Mapping::~Mapping() {
    if (base_) munmap(base_, length_);  // also drops the page lock
}

Status PinnedPool::create(const PoolOptions& options, std::shared_ptr<PinnedPool>* out) {
    if (options.capacity == 0) return invalid("pool capacity must be > 0 bytes");
    if (!is_power_of_two(options.alignment) || options.alignment < 64 || options.alignment > kHugePageBytes)
        return invalid("pool alignment must be a power of two between 64 and 2097152, got " +
                       std::to_string(options.alignment));
    if (options.capacity > (uint64_t(1) << 50)) return invalid("pool capacity above 1 PiB");
    if (options.numa_node >= 0 && options.numa_node >= numa_node_count())
        return invalid("numa_node " + std::to_string(options.numa_node) + " does not exist (this system has " +
                       std::to_string(numa_node_count()) + " node(s))");
    auto pool = std::make_shared<PinnedPool>(Key{}, options);
    KVCORE_RETURN_IF_ERROR(pool->reserve());
    *out = std::move(pool);
    return Status::ok();
}

Status PinnedPool::reserve() {
    const size_t align = options_.alignment;
    const size_t capacity = round_up(options_.capacity, align);
    size_t seg = options_.segment_bytes ? options_.segment_bytes : std::min(capacity, kDefaultSegmentBytes);
    seg = std::min(round_up(seg, align), capacity);
    options_.capacity = capacity;
    options_.segment_bytes = seg;
    stride_ = seg + align;

    const size_t n_segments = (capacity + seg - 1) / seg;
    const long sys_page = sysconf(_SC_PAGESIZE);
    const size_t page = sys_page > 0 ? size_t(sys_page) : 4096;

    // Map every segment: huge pages first (if asked), normal pages when the
    // system has none reserved.
    bool huge = options_.huge_pages;
    bool thp = false;
    for (size_t i = 0; i < n_segments; ++i) {
        const size_t size = std::min(seg, capacity - i * seg);
        void* p = MAP_FAILED;
        size_t length = 0;
        if (huge) {
            length = round_up(size, kHugePageBytes);
            p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB,
                     -1, 0);
            if (p == MAP_FAILED) {
                if (i > 0) {  // earlier segments got huge pages: the pool would be mixed; use normal pages
                    mappings_.clear();
                    segments_.clear();
                    i = size_t(-1);
                    huge = false;
                    continue;
                }
                huge = false;
            }
        }
        if (p == MAP_FAILED) {
            length = round_up(size, page);
            p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                const int err = errno;
                return make_status(Code::kOutOfMemory, "cannot map " + bytes_text(length) +
                                                           " for the pinned pool: " + std::strerror(err));
            }
            if (options_.huge_pages && madvise(p, length, MADV_HUGEPAGE) == 0) thp = true;
        }
        mappings_.emplace_back(p, length);
        segments_.push_back({static_cast<uint8_t*>(p), size});
    }
    page_kind_ = huge ? PageKind::kHugeTlb : (thp ? PageKind::kTransparentHuge : PageKind::kNormal);

    if (options_.numa_node >= 0) {
        for (const Mapping& m : mappings_) KVCORE_RETURN_IF_ERROR(bind_to_node(m.data(), m.length(), options_.numa_node));
    }

    if (options_.lock) {
        // mlock faults every page in; segments are locked in parallel.
        size_t total = 0;
        for (const Mapping& m : mappings_) total += m.length();
        std::vector<int> errs(mappings_.size(), 0);
        default_pool().parallel_for(mappings_.size(), 0, [&](size_t i) {
            if (mlock(mappings_[i].data(), mappings_[i].length()) != 0) errs[i] = errno;
        });
        for (size_t i = 0; i < errs.size(); ++i)
            if (errs[i] != 0) return lock_error(mappings_[i].length(), total, errs[i]);
        locked_ = true;
    }

    for (size_t i = 0; i < segments_.size(); ++i) insert_free(i * stride_, segments_[i].size);
    return Status::ok();
}

void PinnedPool::insert_free(uint64_t offset, uint64_t size) {
    free_by_offset_.emplace(offset, size);
    free_by_size_.emplace(size, offset);
}

void PinnedPool::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
    free_by_size_.erase({it->second, it->first});
    free_by_offset_.erase(it);
}

uint64_t PinnedPool::to_offset(const uint8_t* ptr) const {
    for (size_t i = 0; i < segments_.size(); ++i) {
        const SegmentInfo& s = segments_[i];
        if (ptr >= s.base && ptr < s.base + s.size) return i * stride_ + uint64_t(ptr - s.base);
    }
    return UINT64_MAX;
}

uint8_t* PinnedPool::to_pointer(uint64_t offset) const {
    return segments_[offset / stride_].base + offset % stride_;
}

bool PinnedPool::try_allocate_locked(size_t rounded, uint8_t** out) {
    auto best = free_by_size_.lower_bound({rounded, 0});
    if (best == free_by_size_.end()) return false;
    const uint64_t size = best->first, offset = best->second;
    free_by_size_.erase(best);
    free_by_offset_.erase(offset);
    if (size > rounded) insert_free(offset + rounded, size - rounded);
    live_.emplace(offset, rounded);
    used_ += rounded;
    ++total_allocations_;
    *out = to_pointer(offset);
    return true;
}

Status PinnedPool::allocate(size_t nbytes, int64_t timeout_ms, uint8_t** out, bool count_failure) {
    const size_t align = options_.alignment;
    if (nbytes > options_.segment_bytes)
        return invalid("cannot allocate " + std::to_string(nbytes) + " bytes from a pinned pool whose largest block is " +
                       std::to_string(options_.segment_bytes) + " bytes (its segment size)");
    const size_t rounded = nbytes == 0 ? align : round_up(nbytes, align);
    std::unique_lock<std::mutex> lock(mutex_);
    if (try_allocate_locked(rounded, out)) return Status::ok();
    if (timeout_ms != 0) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            if (timeout_ms < 0) {
                released_.wait(lock);
            } else if (released_.wait_until(lock, deadline) == std::cv_status::timeout) {
                if (try_allocate_locked(rounded, out)) return Status::ok();
                break;
            }
            if (try_allocate_locked(rounded, out)) return Status::ok();
        }
    }
    if (count_failure) ++failed_allocations_;
    return make_status(Code::kPoolExhausted,
                       "pinned pool exhausted: no free block of " + std::to_string(rounded) + " bytes (capacity " +
                           std::to_string(options_.capacity) + ", used " + std::to_string(used_) +
                           ", largest free block " + std::to_string(largest_free_locked()) + ")");
}

Status PinnedPool::release(uint8_t* ptr) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const uint64_t offset = to_offset(ptr);
        auto it = offset == UINT64_MAX ? live_.end() : live_.find(offset);
        if (it == live_.end()) return invalid("pointer is not a live block of this pinned pool");
        uint64_t start = offset, size = it->second;
        live_.erase(it);
        used_ -= size;
        auto next = free_by_offset_.lower_bound(start);
        if (next != free_by_offset_.end() && next->first == start + size) {
            size += next->second;
            auto after = std::next(next);
            erase_free(next);
            next = after;
        }
        if (next != free_by_offset_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == start) {
                start = prev->first;
                size += prev->second;
                erase_free(prev);
            }
        }
        insert_free(start, size);
    }
    released_.notify_all();
    return Status::ok();
}

uint64_t PinnedPool::largest_free_locked() const {
    return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

PoolStats PinnedPool::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    PoolStats s;
    s.capacity = options_.capacity;
    s.used = used_;
    s.free = options_.capacity - used_;
    s.largest_free = largest_free_locked();
    s.allocations = live_.size();
    s.total_allocations = total_allocations_;
    s.failed_allocations = failed_allocations_;
    s.free_blocks = free_by_offset_.size();
    s.segments = segments_.size();
    s.segment_bytes = options_.segment_bytes;
    for (const Mapping& m : mappings_) s.reserved_bytes += m.length();
    s.alignment = options_.alignment;
    s.page_kind = page_kind_;
    s.locked = locked_;
    s.numa_node = options_.numa_node;
    return s;
}

std::vector<SegmentInfo> PinnedPool::segments() const { return segments_; }

size_t PinnedPool::block_size(const uint8_t* ptr) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t offset = to_offset(ptr);
    auto it = offset == UINT64_MAX ? live_.end() : live_.find(offset);
    return it == live_.end() ? 0 : it->second;
}

bool PinnedPool::contains(const uint8_t* ptr, size_t n) const {
    for (const SegmentInfo& s : segments_)
        if (ptr >= s.base && ptr <= s.base + s.size && n <= size_t(s.base + s.size - ptr)) return true;
    return false;
}

}  // namespace kvcore::pool
