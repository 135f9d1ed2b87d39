// Thread-sanitizer harness for the batch calls: compress_many codes the blocks
// of several frames at once (each frame commits its blocks in order while
// other frames' blocks run), decompress_many decodes them side by side into
// interleaved runs of one buffer, then again reporting each frame as it settles
// (on_frame). Some frames are given a head (CompressJob::head) that the whole
// frame fits in, or one byte short of it, or of a random size. Every batch must
// give compress()'s frames and decode bit-exactly,
// each frame complete when reported; ThreadSanitizer (or AddressSanitizer) reports any
// race or bad access. Usage: batch_threads SEED ITERATIONS
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "frame/codec.h"

namespace fr = kvcore::frame;

namespace {

// Frames coded whole into their heads, and frames that outgrew the head they were coded into.
size_t in_head_frames = 0, outgrown_heads = 0;

bool fail(const char* what) {
    std::fprintf(stderr, "%s\n", what);
    return false;
}

// One batch of 1-6 tensors of one dtype and row count, with different row widths.
bool run_batch(std::mt19937_64& rng) {
    fr::EncodeOptions o;
    o.mode = rng() % 2 ? fr::Mode::kFast : fr::Mode::kDense;
    o.block_bytes = 64 + rng() % 20000;
    o.threads = 1 + rng() % 4;
    const fr::DType dtype = fr::DType(1 + rng() % 7);
    const size_t esize = fr::dtype_size(dtype);
    const uint64_t rows = rng() % 300;
    const size_t n = 1 + rng() % 6;
    std::vector<uint64_t> cols(n);
    std::vector<std::vector<uint8_t>> src(n), dst(n), heads(n), refs(n);
    std::vector<fr::CompressJob> jobs;
    fr::EncodeOptions one = o;
    one.threads = 1;
    for (size_t i = 0; i < n; ++i) {
        cols[i] = 1 + rng() % 70;
        fr::TensorDesc desc{dtype, {rows, cols[i]}};
        src[i].resize(rows * cols[i] * esize + 1);  // + 1: data() is never null
        // Few distinct bytes (every plane method), or any (raw planes, frames past the estimate).
        const unsigned spread = rng() % 4 ? 1 + rng() % 8 : 256;
        for (uint8_t& b : src[i]) b = uint8_t(rng() % spread * (spread == 256 ? 1 : 17));
        dst[i].resize(fr::max_frame_size(desc, o.block_bytes));
        jobs.push_back({src[i].data(), rows * cols[i] * esize, desc, dst[i].data(), dst[i].size()});
        refs[i].resize(jobs[i].cap);
        size_t written = 0;
        if (!fr::compress(jobs[i].src, jobs[i].nbytes, desc, one, refs[i].data(), refs[i].size(), &written).is_ok())
            return fail("compress failed");
        refs[i].resize(written);
        const size_t pick = rng() % 4;
        if (pick == 0) continue;  // no head
        const size_t head = pick == 1 ? written : pick == 2 ? written - 1 : rng() % jobs[i].cap;
        if (head >= jobs[i].cap) continue;
        heads[i].resize(head + 1);  // + 1: data() is never null
        jobs[i].head = heads[i].data();
        jobs[i].head_bytes = head;
    }
    if (!fr::compress_many(jobs.data(), n, o).is_ok()) return fail("compress_many failed");

    std::vector<fr::FrameJob> decodes;
    std::vector<uint8_t*> frames(n);
    size_t row_bytes = 0;  // of the shared output: every tensor's row, side by side
    for (size_t i = 0; i < n; ++i) row_bytes += cols[i] * esize;
    std::vector<uint8_t> shared(rows * row_bytes + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        const size_t written = jobs[i].written;
        if (jobs[i].in_head && (jobs[i].head == nullptr || written > jobs[i].head_bytes))
            return fail("a frame said to be in its head does not fit it");
        frames[i] = jobs[i].in_head ? heads[i].data() : dst[i].data();
        in_head_frames += jobs[i].in_head;
        // The head holds the frame's first bytes (the magic first) only where it was coded into.
        outgrown_heads += !jobs[i].in_head && jobs[i].head_bytes >= 4 &&
                          std::memcmp(heads[i].data(), dst[i].data(), jobs[i].head_bytes) == 0;
        if (written != refs[i].size() || std::memcmp(refs[i].data(), frames[i], written) != 0)
            return fail("a batch frame differs from compress()'s");
        decodes.push_back({frames[i], written, fr::OutputRuns{shared.data() + at, jobs[i].nbytes,
                                                               cols[i] * esize, row_bytes}});
        at += cols[i] * esize;
    }
    if (!fr::decompress_many(decodes.data(), n, o.threads).is_ok()) return fail("decompress_many failed");
    std::vector<size_t> offset(n);
    for (size_t i = 1; i < n; ++i) offset[i] = offset[i - 1] + cols[i - 1] * esize;
    auto decoded = [&](size_t i) {
        const size_t run = cols[i] * esize;
        for (uint64_t r = 0; r < rows; ++r)
            if (std::memcmp(shared.data() + r * row_bytes + offset[i], src[i].data() + r * run, run) != 0) return false;
        return true;
    };
    for (size_t i = 0; i < n; ++i)
        if (!decoded(i)) return fail("a decoded run differs from its tensor's row");

    // Again with on_frame: each frame settles once, ok, with its runs complete (read
    // on the settling pool thread while other frames' runs are still being written).
    std::fill(shared.begin(), shared.end(), 0);
    std::vector<std::atomic<int>> settled(n);
    std::atomic<bool> early{false};
    const kvcore::Status st = fr::decompress_many(decodes.data(), n, o.threads, [&](size_t i, const kvcore::Status& s) {
        settled[i].fetch_add(1);
        if (!s.is_ok() || !decoded(i)) early = true;
    });
    if (!st.is_ok()) return fail("decompress_many with on_frame failed");
    if (early) return fail("a frame settled before its runs were decoded");
    for (size_t i = 0; i < n; ++i)
        if (settled[i].load() != 1) return fail("a frame did not settle exactly once");

    // A damaged frame (its last block's last byte): still every frame settles once,
    // and that one with an error (the others may be skipped, with the same error).
    if (rows == 0) return true;
    const size_t k = rng() % n;
    frames[k][decodes[k].size - 1] ^= 0x5a;
    std::vector<std::atomic<int>> again(n);
    std::atomic<bool> damaged_ok{false};
    const kvcore::Status bad = fr::decompress_many(decodes.data(), n, o.threads, [&](size_t i, const kvcore::Status& s) {
        again[i].fetch_add(1);
        if (i == k && s.is_ok()) damaged_ok = true;
    });
    frames[k][decodes[k].size - 1] ^= 0x5a;
    if (bad.is_ok() || damaged_ok) return fail("a damaged frame was not reported");
    for (size_t i = 0; i < n; ++i)
        if (again[i].load() != 1) return fail("with a damaged frame, a frame did not settle exactly once");
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SEED ITERATIONS\n", argv[0]);
        return 2;
    }
    std::mt19937_64 rng(std::strtoull(argv[1], nullptr, 10));
    const long iterations = std::strtol(argv[2], nullptr, 10);
    for (long it = 0; it < iterations; ++it)
        if (!run_batch(rng)) return 1;
    std::printf("ok: %ld batches (frames in their heads: %zu, heads outgrown: %zu)\n", iterations, in_head_frames,
                outgrown_heads);
    return 0;
}
