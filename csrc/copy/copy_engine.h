// CPU copy engine: byte copies split over the native thread pool.
//
// Large copies are cut into slices that the pool's workers and the caller copy
// in parallel. Above the non-temporal threshold (the last-level cache size by
// default) the AVX2 variant writes with streaming stores, so a copy that does
// not fit in the cache does not evict the working set or pay for reading the
// destination lines first. Many small blocks (gather/scatter of paged KV
// blocks) are grouped into tasks of about one slice each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kvcore::copy {

struct Segment {
    uint8_t* dst;
    const uint8_t* src;
    size_t size;
};

struct CopyOptions {
    unsigned threads = 0;        // 0: all pool threads + caller
    size_t slice_bytes = 0;      // 0: default (1 MiB): work per task
    size_t nt_threshold = 0;     // 0: last-level cache size (cpu::llc_bytes); SIZE_MAX: never stream
};

// One-thread copy of n bytes with the active variant (non-temporal when
// `streaming`); dst and src must not overlap.
void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n, bool streaming);

// Copies n bytes; overlapping ranges are handled like memmove (one thread).
Status copy(uint8_t* dst, const uint8_t* src, size_t n, const CopyOptions& options);

// Copies every segment. Destinations must not overlap each other or any source.
Status copy_many(const Segment* segments, size_t count, const CopyOptions& options);

// gather: block i of the output is the block_bytes at srcs[i].
// scatter: block i of src goes to dsts[i].
Status gather(uint8_t* dst, const uint8_t* const* srcs, size_t count, size_t block_bytes, const CopyOptions& options);
Status scatter(uint8_t* const* dsts, const uint8_t* src, size_t count, size_t block_bytes, const CopyOptions& options);

// Name of the variant copy_bytes uses for streaming copies ("avx2-nt" or "memcpy").
const char* variant();

}  // namespace kvcore::copy
