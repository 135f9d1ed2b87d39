#include "frame/output_runs.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcore::frame {

bool OutputRuns::touches(uintptr_t lo, uintptr_t hi) const {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    if (bytes == 0 || hi <= lo || hi <= b || lo >= b + span()) return false;
    if (contiguous()) return true;
    // The first run that ends after lo; runs start in increasing order, so if it
    // starts at or after hi, so does every later one.
    const size_t first = lo < b + run_bytes ? 0 : (lo - b - run_bytes) / stride + 1;
    return first < runs() && b + first * stride < hi;
}

Status check_runs(const OutputRuns& out, unsigned elem_size) {
    if (out.contiguous()) return Status::ok();
    if (out.run_bytes % elem_size != 0) return invalid("output runs must hold whole elements");
    if (out.bytes % out.run_bytes != 0) return invalid("output size is not a whole number of runs");
    if (out.stride < out.run_bytes) return invalid("output runs overlap (stride below run length)");
    if (out.stride > (SIZE_MAX - out.run_bytes) / (out.runs() - 1)) return invalid("output span overflows");
    return Status::ok();
}

Status BatchBuffers::check_disjoint(const char* call, const char* input_kind) const {
    const OutputRuns* outs = outputs.data();
    const size_t n = outputs.size();
    std::vector<size_t> order;
    for (size_t i = 0; i < n; ++i)
        if (outs[i].bytes != 0) order.push_back(i);
    auto start = [&](size_t i) { return reinterpret_cast<uintptr_t>(outs[i].base); };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return start(a) < start(b); });
    // Outputs whose spans meet (chunks side by side in one tensor interleave their
    // runs) are compared run by run, walking the one with fewer runs.
    for (size_t x = 0; x < order.size(); ++x) {
        const OutputRuns& a = outs[order[x]];
        const uintptr_t a_end = start(order[x]) + a.span();
        for (size_t y = x + 1; y < order.size() && start(order[y]) < a_end; ++y) {
            const OutputRuns& b = outs[order[y]];
            const OutputRuns& walk = a.runs() <= b.runs() ? a : b;
            const OutputRuns& other = a.runs() <= b.runs() ? b : a;
            size_t left = 0;
            for (size_t off = 0; off < walk.bytes; off += left) {
                const uintptr_t lo = reinterpret_cast<uintptr_t>(walk.at(off, &left));
                if (other.touches(lo, lo + left)) return invalid(std::string(call) + ": two outputs overlap");
            }
        }
    }
    // Each input against the outputs that start before its end, latest first, while
    // one of them may still reach its start (reach[k]: the furthest end among the
    // first k + 1 in order). A batch of many small frames into as many outputs then
    // compares each input with the few outputs near it, where comparing every pair
    // took 11% of decoding 1152 frames of 32 KiB.
    std::vector<uintptr_t> starts(order.size()), reach(order.size());
    uintptr_t furthest = 0;
    for (size_t k = 0; k < order.size(); ++k) {
        starts[k] = start(order[k]);
        furthest = std::max(furthest, starts[k] + outs[order[k]].span());
        reach[k] = furthest;
    }
    for (const auto& [lo, hi] : inputs) {
        if (hi <= lo) continue;
        for (size_t k = size_t(std::lower_bound(starts.begin(), starts.end(), hi) - starts.begin());
             k > 0 && reach[k - 1] > lo; --k)
            if (outs[order[k - 1]].touches(lo, hi))
                return invalid(std::string(call) + ": an output overlaps " + input_kind);
    }
    return Status::ok();
}

}  // namespace kvcore::frame
