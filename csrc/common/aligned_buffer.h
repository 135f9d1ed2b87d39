// A heap byte buffer that starts on a cache line.
//
// SIMD kernels that store whole 64-byte vectors into scratch planes pay for
// every store that straddles two lines; on Intel cores that halved the speed of
// a 1 MiB bf16 split (11 against 24 GB/s, measured on an H200 host's Xeon).
// std::vector's large allocations start 16 bytes past a line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace kvcore {

constexpr size_t kCacheLine = 64;

inline size_t round_up_to_line(size_t n) { return (n + kCacheLine - 1) / kCacheLine * kCacheLine; }

class AlignedBuffer {
public:
    uint8_t* data() const { return data_.get(); }
    size_t size() const { return size_; }

    // At least n bytes; what the buffer held before is not kept when it grows.
    void ensure(size_t n) {
        if (n <= size_) return;
        const size_t bytes = round_up_to_line(n);
        data_.reset();
        size_ = 0;
        void* p = std::aligned_alloc(kCacheLine, bytes);
        if (p == nullptr) throw std::bad_alloc();
        data_.reset(static_cast<uint8_t*>(p));
        size_ = bytes;
    }

private:
    struct Free {
        void operator()(uint8_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, Free> data_;
    size_t size_ = 0;
};

}  // namespace kvcore
