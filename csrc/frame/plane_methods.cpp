#include "frame/plane_methods.h"

#include <cstring>
#include <string>
#include <vector>

#include "entropy/fastcode.h"
#include "entropy/huffman.h"
#include "lz/zstd_plane.h"

namespace kvcore::frame {
namespace {

constexpr int kZstdLevel = 1;

// Scratch for a second candidate, so the better of two can be kept.
uint8_t* thread_candidate_scratch(size_t n) {
    thread_local std::vector<uint8_t> scratch;
    if (scratch.size() < n) scratch.resize(n);
    return scratch.data();
}

Status entropy_encode(const uint8_t* plane, size_t n, const uint32_t* hist, const PlanePolicy& policy,
                      uint8_t* dst, size_t cap, Method* method, size_t* written) {
    if (policy.mode == Mode::kFast) {
        *method = Method::kFastcode;
        return entropy::fastcode_encode(plane, n, hist, dst, cap, written);
    }
    *method = Method::kHuffman;
    return entropy::huffman_encode(plane, n, hist, dst, cap, written);
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
    }
    return "unknown";
}

Status encode_plane(const uint8_t* plane, size_t n, const uint32_t* hist, const PlanePolicy& policy, uint8_t* dst,
                    size_t cap, Method* method, size_t* written) {
    if (cap < n) return make_status(Code::kBufferTooSmall, "plane output capacity below the plane size");
    if (n > 0 && hist != nullptr && hist[plane[0]] == n) {
        dst[0] = plane[0];
        *method = Method::kConstant;
        *written = 1;
        return Status::ok();
    }
    Method best_method = Method::kRaw;
    size_t best = n;
    if (policy.try_entropy && n > 1) {
        Method m;
        size_t size = 0;
        const Status st = entropy_encode(plane, n, hist, policy, dst, n - 1, &m, &size);
        if (st.is_ok()) {
            best_method = m;
            best = size;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    if (policy.try_lz && n > 1 && best > 1) {
        uint8_t* scratch = thread_candidate_scratch(best - 1);
        size_t size = 0;
        const Status st = lz::zstd_plane_encode(plane, n, kZstdLevel, scratch, best - 1, &size);
        if (st.is_ok()) {
            std::memcpy(dst, scratch, size);
            best_method = Method::kZstd;
            best = size;
        } else if (!not_smaller(st)) {
            return st;
        }
    }
    if (best_method == Method::kRaw) std::memcpy(dst, plane, n);
    *method = best_method;
    *written = best;
    return Status::ok();
}

Status decode_plane(uint8_t method, const uint8_t* payload, size_t size, size_t n, uint8_t* scratch,
                    const uint8_t** out) {
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
        case Method::kDeflate: break;
    }
    return corrupt("unknown plane method " + std::to_string(method));
}

}  // namespace kvcore::frame
