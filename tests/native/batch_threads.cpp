// Thread-sanitizer harness for the batch calls: compress_many codes the blocks
// of several frames at once (each frame commits its blocks in order while
// other frames' blocks run), decompress_many decodes them side by side into
// interleaved runs of one buffer. Every batch must give compress()'s frames
// and decode bit-exactly; ThreadSanitizer (or AddressSanitizer) reports any
// race or bad access. Usage: batch_threads SEED ITERATIONS
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "frame/codec.h"

namespace fr = kvcore::frame;

namespace {

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
    std::vector<std::vector<uint8_t>> src(n), dst(n);
    std::vector<fr::CompressJob> jobs;
    for (size_t i = 0; i < n; ++i) {
        cols[i] = 1 + rng() % 70;
        fr::TensorDesc desc{dtype, {rows, cols[i]}};
        src[i].resize(rows * cols[i] * esize + 1);  // + 1: data() is never null
        const unsigned spread = 1 + rng() % 8;      // few distinct bytes: every plane method
        for (uint8_t& b : src[i]) b = uint8_t(rng() % spread * 17);
        dst[i].resize(fr::max_frame_size(desc, o.block_bytes));
        jobs.push_back({src[i].data(), rows * cols[i] * esize, desc, dst[i].data(), dst[i].size()});
    }
    if (!fr::compress_many(jobs.data(), n, o).is_ok()) return fail("compress_many failed");

    fr::EncodeOptions one = o;
    one.threads = 1;
    std::vector<fr::FrameJob> decodes;
    size_t row_bytes = 0;  // of the shared output: every tensor's row, side by side
    for (size_t i = 0; i < n; ++i) row_bytes += cols[i] * esize;
    std::vector<uint8_t> shared(rows * row_bytes + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
        std::vector<uint8_t> ref(jobs[i].cap);
        size_t written = 0;
        if (!fr::compress(jobs[i].src, jobs[i].nbytes, jobs[i].desc, one, ref.data(), ref.size(), &written).is_ok() ||
            written != jobs[i].written || std::memcmp(ref.data(), dst[i].data(), written) != 0)
            return fail("a batch frame differs from compress()'s");
        decodes.push_back({dst[i].data(), written, fr::OutputRuns{shared.data() + at, jobs[i].nbytes,
                                                                   cols[i] * esize, row_bytes}});
        at += cols[i] * esize;
    }
    if (!fr::decompress_many(decodes.data(), n, o.threads).is_ok()) return fail("decompress_many failed");
    at = 0;
    for (size_t i = 0; i < n; ++i) {
        const size_t run = cols[i] * esize;
        for (uint64_t r = 0; r < rows; ++r)
            if (std::memcmp(shared.data() + r * row_bytes + at, src[i].data() + r * run, run) != 0)
                return fail("a decoded run differs from its tensor's row");
        at += run;
    }
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
    std::printf("ok: %ld batches\n", iterations);
    return 0;
}
