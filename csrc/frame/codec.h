// Whole-tensor compression into a kvcore frame (docs/FORMAT.md) and back.
//
// A tensor is cut into blocks that are coded independently (in parallel on the
// thread pool); each block is split into byte planes (shuffle/) and each plane
// is coded by the method that measures smallest (plane_methods.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "frame/output_runs.h"

namespace kvcore::frame {

// Element types; the values are stored in frames and never change.
enum class DType : uint8_t {
    kUInt8 = 1,
    kInt8 = 2,
    kFloat8E4M3 = 3,
    kFloat8E5M2 = 4,
    kFloat16 = 5,
    kBFloat16 = 6,
    kFloat32 = 7,
};
bool dtype_valid(uint8_t code);
unsigned dtype_size(DType dtype);

enum class Mode : uint8_t { kDense = 0, kFast = 1 };

// Which engine codes DEFLATE planes (method deflate): software only, QAT
// required, or QAT when present and the input is large enough.
enum class Backend : uint8_t { kAuto = 0, kSoftware = 1, kQat = 2 };

constexpr unsigned kMaxDims = 8;

struct AnalyzedLayout;  // frame/analysis.h

struct TensorDesc {
    DType dtype = DType::kUInt8;
    std::vector<uint64_t> shape;  // at most kMaxDims; product * dtype_size = byte size
};

struct EncodeOptions {
    Mode mode = Mode::kDense;
    bool max_ratio = false;       // dense mode only ("max"): also try the signs method on rotated floats,
                                  // and keep zstd planes wherever they are smaller
    Backend backend = Backend::kAuto;
    bool deflate = false;         // code planes with DEFLATE (QAT-compatible) instead of Huffman
    bool lanes = false;           // dense mode: Huffman streams in 128 lanes (huffman.h, tag 4) where
                                  // they cost at most 1/32 more (max mode: where not larger), which
                                  // AVX-512 (VBMI2) CPUs decode 1.3-1.6x as fast, others slower
    uint32_t block_bytes = 0;     // 0: default (256 KiB)
    unsigned threads = 0;         // at most (one a MiB of input); 0: all hardware threads
};

struct PlaneInfo {
    uint8_t method;
    uint32_t size;
};

struct FrameInfo {
    uint8_t version = 0;
    TensorDesc desc;
    uint64_t original_bytes = 0;
    uint64_t frame_bytes = 0;
    uint32_t block_elems = 0;
    uint32_t n_blocks = 0;
    uint32_t flags = 0;
    uint32_t channels = 0;
    // method_counts[m] = number of planes coded with method m, over all blocks.
    std::vector<uint64_t> method_counts;
    std::vector<uint64_t> method_bytes;
};

// kInvalidArgument unless the dtype and rank are valid, block_bytes is 0 (the
// default) or within [64, kMaxBlockBytes], the element count is below 2^60 and
// the frame's blocks fit its 32-bit block count. max_frame_size needs it.
Status validate_shape(const TensorDesc& desc, uint32_t block_bytes);
// validate_shape, and nbytes is the tensor's size.
Status validate_desc(const TensorDesc& desc, size_t nbytes, uint32_t block_bytes);

// Largest frame compress() can produce for this tensor: a function of its byte
// size, rank and block size (block_bytes 0 = default). See docs/FORMAT.md.
// desc must pass validate_shape.
size_t max_frame_size(const TensorDesc& desc, uint32_t block_bytes);
size_t max_frame_size(const TensorDesc& desc);

// Compresses nbytes at src (must equal the size desc describes) into dst, whose
// capacity must be at least max_frame_size(desc, options.block_bytes).
Status compress(const uint8_t* src, size_t nbytes, const TensorDesc& desc, const EncodeOptions& options,
                uint8_t* dst, size_t cap, size_t* written);

// kInvalidArgument for options no frame can be written with (block_bytes out
// of range), so a caller can check them before sizing outputs.
Status check_options(const EncodeOptions& options);

// One tensor to compress (nbytes at src, described by desc) and where its frame
// goes (cap bytes at dst, at least max_frame_size(desc, options.block_bytes)).
struct CompressJob {
    const uint8_t* src;
    size_t nbytes;
    TensorDesc desc;
    uint8_t* dst;
    size_t cap;
    size_t written = 0;  // the frame's size, on success
    // dst is newly allocated anonymous memory (a new bytes object) that no one
    // else reads or writes yet: its pages may be faulted in ahead of the blocks.
    bool fresh_dst = false;
    // Optional: head_bytes (less than cap) at head, where the frame is coded
    // instead when its tensor's sampled entropy says it fits (dense and max
    // modes; their frames came out 1-26% below that estimate on kvdata). The
    // frame's first head_bytes go to head and the rest to dst; in_head tells
    // where the whole frame is in the end (a frame that outgrew the head has its
    // head's bytes copied to dst). The caller's use: a fresh dst of cap bytes is
    // mapped anew, and faulted in, on every call where cap passes glibc's 32 MiB
    // mmap threshold, whereas a head below it comes from the heap's pages.
    uint8_t* head = nullptr;
    size_t head_bytes = 0;
    bool in_head = false;
    // Optional: the layout to code with (from analyze, for a tensor of the same
    // dtype and channel count, under options of the same mode and backend; else
    // kInvalidArgument) instead of the one chosen from this tensor's sample, which
    // is about a fifth of compressing a 512 KiB KV frame.
    const AnalyzedLayout* layout = nullptr;
};

// The layout compress would choose for the tensor under these options (mode and
// backend), to code later tensors of its kind with (CompressJob::layout): a
// layer's K or V keeps its statistics from one chunk of tokens to the next.
Status analyze(const uint8_t* src, size_t nbytes, const TensorDesc& desc, const EncodeOptions& options,
               AnalyzedLayout* out);
// kInvalidArgument unless layout (if not null) was analysed for tensors of desc's
// dtype and channel count under options of the same mode and backend.
Status check_layout(const AnalyzedLayout* layout, const TensorDesc& desc, const EncodeOptions& options);

// Compresses every job as compress does, the blocks of all frames spread over
// the threads (the layers of a KV chunk, frame by frame, keep every thread
// busy). Outputs must not overlap one another or any input (kInvalidArgument).
Status compress_many(CompressJob* jobs, size_t n, const EncodeOptions& options);

// Reads and validates the header only: what decompress will produce.
Status read_desc(const uint8_t* frame, size_t size, TensorDesc* desc);

// Reads and validates the header and block table (no plane is decoded).
Status read_info(const uint8_t* frame, size_t size, FrameInfo* info);

// Decodes the whole frame into dst (dst_size must equal the original size);
// every block's checksum is verified. threads: at most (one a MiB of output); 0 = all.
Status decompress(const uint8_t* frame, size_t size, uint8_t* dst, size_t dst_size, unsigned threads);

// One frame and where it decodes to (out.bytes must equal the original size).
struct FrameJob {
    const uint8_t* frame;
    size_t size;
    OutputRuns out;
    // out is newly allocated anonymous memory (a new tensor) that no one else
    // reads or writes yet: its pages may be faulted in ahead of the blocks.
    bool fresh_out = false;
};

// Called once for each frame of a decompress_many batch as soon as the frame is
// settled: every block decoded and verified (status ok), or not (the frame's
// first error; a frame skipped after another frame failed gets that error). It
// runs on whichever pool thread settled the frame, so it must be quick and
// thread-safe.
using FrameDone = std::function<void(size_t frame, const Status& status)>;

// Decodes every job as decompress does, the blocks of all frames spread over
// the threads (many small frames keep every thread busy) and taken in frame
// order, so earlier frames settle first. Every header and output layout is
// checked before any block is decoded (on such an error no frame is settled
// and nothing is written); outputs must not overlap one another or any frame
// (kInvalidArgument). on_frame (optional) reports each frame as it settles.
Status decompress_many(const FrameJob* jobs, size_t n, unsigned threads, const FrameDone& on_frame = {});

}  // namespace kvcore::frame
