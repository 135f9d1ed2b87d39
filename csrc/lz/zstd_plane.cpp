#include "lz/zstd_plane.h"

#include <memory>
#include <zstd.h>
#include <zstd_errors.h>

namespace kvcore::lz {
namespace {

struct CCtxDeleter {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// One context per thread: creating them per call costs more than small planes.
ZSTD_CCtx* thread_cctx() {
    thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
    return ctx.get();
}
ZSTD_DCtx* thread_dctx() {
    thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
    return ctx.get();
}

}  // namespace

Status zstd_plane_encode(const uint8_t* src, size_t n, int level, uint8_t* dst, size_t cap, size_t* written) {
    ZSTD_CCtx* ctx = thread_cctx();
    if (ctx == nullptr) return make_status(Code::kOutOfMemory, "zstd: cannot create a compression context");
    const size_t r = ZSTD_compressCCtx(ctx, dst, cap, src, n, level);
    if (ZSTD_isError(r)) {
        if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
            return make_status(Code::kBufferTooSmall, "zstd: output does not fit");
        return make_status(Code::kBackendError, std::string("zstd: ") + ZSTD_getErrorName(r));
    }
    *written = r;
    return Status::ok();
}

Status zstd_plane_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n) {
    ZSTD_DCtx* ctx = thread_dctx();
    if (ctx == nullptr) return make_status(Code::kOutOfMemory, "zstd: cannot create a decompression context");
    const unsigned long long declared = ZSTD_getFrameContentSize(src, src_size);
    if (declared != n) return corrupt("zstd plane: declared size does not match the block");
    const size_t r = ZSTD_decompressDCtx(ctx, dst, n, src, src_size);
    if (ZSTD_isError(r)) return corrupt(std::string("zstd plane: ") + ZSTD_getErrorName(r));
    if (r != n) return corrupt("zstd plane: decoded size does not match the block");
    return Status::ok();
}

}  // namespace kvcore::lz
