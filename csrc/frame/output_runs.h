// Where a decoded frame's bytes go: one contiguous buffer, or equal contiguous
// runs at a fixed stride (a token range of a larger KV tensor: out[:, :, a:b]
// of a contiguous [layers, 2, tokens, heads, dim] tensor is 2 * layers runs of
// (b - a) * heads * dim elements). Decoding into the runs directly saves the
// staging buffer and the copy a caller would otherwise make.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvcore::frame {

struct OutputRuns {
    uint8_t* base = nullptr;
    size_t bytes = 0;      // logical size: the decoded bytes, in order
    size_t run_bytes = 0;  // 0: contiguous (one run of `bytes`)
    size_t stride = 0;     // from one run's start to the next, >= run_bytes

    bool contiguous() const { return run_bytes == 0 || run_bytes >= bytes; }
    size_t runs() const { return contiguous() ? 1 : bytes / run_bytes; }
    // Bytes from base to the end of the last run.
    size_t span() const { return contiguous() ? bytes : (runs() - 1) * stride + run_bytes; }
    // Address of logical byte `offset`; *left: bytes from there to the end of its run.
    uint8_t* at(size_t offset, size_t* left) const {
        if (contiguous()) {
            *left = bytes - offset;
            return base + offset;
        }
        const size_t within = offset % run_bytes;
        *left = run_bytes - within;
        return base + offset / run_bytes * stride + within;
    }
    // Whether any run touches [lo, hi) (addresses as integers).
    bool touches(uintptr_t lo, uintptr_t hi) const;
};

// kInvalidArgument unless: bytes is a whole number of runs, runs hold whole
// elements of elem_size bytes and do not overlap one another.
Status check_runs(const OutputRuns& out, unsigned elem_size);

// The buffers of one batch call: outputs written concurrently, and inputs read
// meanwhile.
struct BatchBuffers {
    std::vector<OutputRuns> outputs;
    std::vector<std::pair<uintptr_t, uintptr_t>> inputs;  // [start, end) addresses
    void add(const OutputRuns& out, const uint8_t* in, size_t in_bytes) {
        outputs.push_back(out);
        inputs.emplace_back(reinterpret_cast<uintptr_t>(in), reinterpret_cast<uintptr_t>(in) + in_bytes);
    }
    // kInvalidArgument when two outputs share a byte, or an output shares one with an
    // input; the message names the operation (`call`) and what its inputs are (`input_kind`).
    Status check_disjoint(const char* call, const char* input_kind) const;
};

}  // namespace kvcore::frame
