#include "frame/plane_methods.h"

#include <cstring>
#include <string>
#include <vector>

#include "deflate/deflate_plane.h"
#include "entropy/channel_groups.h"
#include "entropy/fastcode.h"
#include "entropy/histogram.h"
#include "entropy/huffman.h"
#include "lz/zstd_plane.h"

namespace kvcore::frame {
namespace {

constexpr int kZstdLevel = 1;
constexpr int kDeflateLevel = 1;  // QATzip's default level; ISA-L level 1

// Scratch for a second candidate, so the better of two can be kept.
uint8_t* thread_candidate_scratch(size_t n) {
    thread_local std::vector<uint8_t> scratch;
    if (scratch.size() < n) scratch.resize(n);
    return scratch.data();
}

// Codes the plane with the mode's entropy coder. *constant is set instead when
// the plane holds one value (found from the histogram the coders need anyway).
Status entropy_encode(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t cap,
                      Method* method, size_t* written, bool* constant) {
    uint32_t hist[256];
    bool exact = true;
    const bool grouped = policy.mode == Mode::kDense && policy.channels > 1 && n % policy.channels == 0;
    Status st = make_status(Code::kBufferTooSmall, "not tried");
    if (grouped) {
        st = entropy::grouped_encode(plane, n / policy.channels, policy.channels, hist, &exact, dst, cap, written);
    } else {
        exact = entropy::histogram_estimate(plane, n, hist);
    }
    *constant = exact && hist[plane[0]] == n;  // weights that are estimates never prove it
    if (*constant || st.code != Code::kBufferTooSmall) {
        *method = Method::kGrouped;
        return st;
    }
    if (policy.mode == Mode::kFast) {
        *method = Method::kFastcode;
        return exact ? entropy::fastcode_encode(plane, n, hist, dst, cap, written)
                     : entropy::fastcode_encode_estimated(plane, n, hist, dst, cap, written);
    }
    *method = Method::kHuffman;
    return entropy::huffman_encode(plane, n, hist, dst, cap, written, exact);
}

// kOk: kept; kBufferTooSmall: not smaller than cap; anything else: a real failure.
bool not_smaller(const Status& st) { return st.code == Code::kBufferTooSmall; }

}  // namespace

const char* method_name(uint8_t method) {
    switch (static_cast<Method>(method)) {
        case Method::kRaw: return "raw";
        case Method::kHuffman: return "huffman";
        case Method::kFastcode: return "fastcode";
        case Method::kZstd: return "zstd";
        case Method::kDeflate: return "deflate";
        case Method::kConstant: return "constant";
        case Method::kGrouped: return "grouped";
    }
    return "unknown";
}

Status encode_plane(const uint8_t* plane, size_t n, const PlanePolicy& policy, uint8_t* dst, size_t cap,
                    Method* method, size_t* written) {
    if (cap < n) return make_status(Code::kBufferTooSmall, "plane output capacity below the plane size");
    if (policy.deflate) {
        // DEFLATE planes (QAT-compatible, deflate/): raw DEFLATE pieces, or raw when that does not shrink.
        // DEFLATE's LZ stage also takes planes that only repeat (duplicate rows).
        if ((policy.try_entropy || policy.try_lz) && n > 1) {
            size_t size = 0;
            const Status st = deflate::deflate_plane_encode(plane, n, policy.backend, kDeflateLevel, dst, n - 1,
                                                            &size, nullptr, 1);
            if (st.is_ok()) {
                *method = Method::kDeflate;
                *written = size;
                return Status::ok();
            }
            if (!not_smaller(st)) return st;
        }
        std::memcpy(dst, plane, n);
        *method = Method::kRaw;
        *written = n;
        return Status::ok();
    }
    Method best_method = Method::kRaw;
    size_t best = n;
    if (policy.try_entropy && n > 1) {
        Method m;
        size_t size = 0;
        bool constant = false;
        const Status st = entropy_encode(plane, n, policy, dst, n - 1, &m, &size, &constant);
        if (constant) {
            dst[0] = plane[0];
            *method = Method::kConstant;
            *written = 1;
            return Status::ok();
        }
        if (st.is_ok()) {
            best_method = m;
            best = size;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    if (policy.try_lz && n > 1 && best > 1) {
        // Fast mode keeps LZ only where it halves the plane: zstd decodes several times slower
        // than fastcode unless its matches are long (duplicate rows), which is what halving means.
        const size_t limit = policy.mode == Mode::kFast ? best / 2 : best - 1;
        uint8_t* scratch = thread_candidate_scratch(limit);
        size_t size = 0;
        const Status st = lz::zstd_plane_encode(plane, n, kZstdLevel, scratch, limit, &size);
        if (st.is_ok()) {
            std::memcpy(dst, scratch, size);
            best_method = Method::kZstd;
            best = size;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    if (best_method == Method::kRaw && dst != plane) std::memcpy(dst, plane, n);
    *method = best_method;
    *written = best;
    return Status::ok();
}

Status decode_plane(uint8_t method, const uint8_t* payload, size_t size, size_t n, uint32_t channels,
                    uint8_t* scratch, const uint8_t** out) {
    *out = scratch;
    switch (static_cast<Method>(method)) {
        case Method::kRaw:
            if (size != n) return corrupt("raw plane: payload size does not match the block");
            *out = payload;
            return Status::ok();
        case Method::kConstant:
            if (size != 1) return corrupt("constant plane: payload must be one byte");
            std::memset(scratch, payload[0], n);
            return Status::ok();
        case Method::kHuffman: return entropy::huffman_decode(payload, size, scratch, n);
        case Method::kFastcode: return entropy::fastcode_decode(payload, size, scratch, n);
        case Method::kZstd: return lz::zstd_plane_decode(payload, size, scratch, n);
        case Method::kGrouped:
            if (channels < 2 || n % channels) return corrupt("grouped plane in a block without whole rows");
            return entropy::grouped_decode(payload, size, n / channels, channels, scratch);
        case Method::kDeflate: return deflate::deflate_plane_decode(payload, size, scratch, n, Backend::kSoftware, 1);
    }
    return corrupt("unknown plane method " + std::to_string(method));
}

}  // namespace kvcore::frame
