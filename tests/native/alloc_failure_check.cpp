// Fault injection for the batch calls: operator new and aligned_alloc start
// failing after a random number of allocations while compress_many and
// decompress_many run on up to 4 threads of the shared pool. Every call must
// end in ok, kOutOfMemory or a std::bad_alloc thrown to the caller: never an
// abort (a pool thread's exception), a hang (a block that never reports its
// size), a frame that never settles, or a wrong frame. What does succeed is
// checked against compress() and the original bytes with injection off. Built
// without a sanitizer (it replaces the allocator).
// Usage: alloc_failure_check SEED ROUNDS
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "frame/codec.h"

namespace fr = kvcore::frame;

namespace {

std::atomic<long> allocations_left{-1};  // < 0: no injection

bool allocation_fails() {
    if (allocations_left.load(std::memory_order_relaxed) < 0) return false;
    return allocations_left.fetch_sub(1, std::memory_order_relaxed) == 0;
}

}  // namespace

void* operator new(size_t n) {
    if (allocation_fails()) throw std::bad_alloc();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

extern "C" void* aligned_alloc(size_t alignment, size_t n) {
    using Fn = void* (*)(size_t, size_t);
    static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "aligned_alloc"));
    if (allocation_fails()) return nullptr;
    return real(alignment, n);
}

namespace {

struct Outcome {
    int ok = 0, out_of_memory = 0, thrown = 0;
};

bool fail(const char* what) {
    std::fprintf(stderr, "%s\n", what);
    return false;
}

bool accepted(const kvcore::Status& st) { return st.is_ok() || st.code == kvcore::Code::kOutOfMemory; }

bool run_round(std::mt19937_64& rng, Outcome& seen) {
    fr::EncodeOptions o;
    o.mode = rng() % 2 ? fr::Mode::kFast : fr::Mode::kDense;
    o.block_bytes = rng() % 2 ? 0 : 4096 + rng() % 60000;  // many blocks, or the mode's own
    o.threads = 1 + rng() % 4;
    const fr::DType dtype = fr::DType(1 + rng() % 7);
    const size_t esize = fr::dtype_size(dtype);
    const size_t n = 1 + rng() % 4;
    std::vector<std::vector<uint8_t>> src(n), dst(n), back(n);
    std::vector<fr::CompressJob> jobs;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t rows = 1 + rng() % 3000, cols = 1 + rng() % 200;
        fr::TensorDesc desc{dtype, {rows, cols}};
        src[i].resize(rows * cols * esize);
        const unsigned spread = 1 + rng() % 40;
        for (uint8_t& b : src[i]) b = uint8_t(rng() % spread * 5);
        dst[i].resize(fr::max_frame_size(desc, o.block_bytes));
        jobs.push_back({src[i].data(), src[i].size(), desc, dst[i].data(), dst[i].size()});
    }

    allocations_left = long(rng() % 400);
    kvcore::Status st;
    bool threw = false;
    try {
        st = fr::compress_many(jobs.data(), n, o);
    } catch (const std::bad_alloc&) {
        threw = true;
    }
    allocations_left = -1;
    if (threw) {
        ++seen.thrown;
        return true;
    }
    if (!accepted(st)) return fail(("compress_many: unexpected status: " + st.message).c_str());
    if (!st.is_ok()) {
        ++seen.out_of_memory;
        return true;
    }
    fr::EncodeOptions one = o;
    one.threads = 1;
    std::vector<fr::FrameJob> decodes;
    for (size_t i = 0; i < n; ++i) {
        std::vector<uint8_t> ref(jobs[i].cap);
        size_t written = 0;
        if (!fr::compress(jobs[i].src, jobs[i].nbytes, jobs[i].desc, one, ref.data(), ref.size(), &written).is_ok() ||
            written != jobs[i].written || std::memcmp(ref.data(), dst[i].data(), written) != 0)
            return fail("a frame coded under injection differs from compress()'s");
        back[i].assign(src[i].size() + 1, 0);
        decodes.push_back({dst[i].data(), written, fr::OutputRuns{back[i].data(), src[i].size()}});
    }

    // Decoded reporting each frame as it settles: under injection too, every frame
    // settles exactly once (the messages of out-of-memory statuses fit std::string's
    // inline buffer, so reporting one allocates nothing).
    std::vector<std::atomic<int>> settled(n);
    allocations_left = long(rng() % 200);
    threw = false;
    try {
        st = fr::decompress_many(decodes.data(), n, o.threads,
                                 [&](size_t i, const kvcore::Status&) { settled[i].fetch_add(1); });
    } catch (const std::bad_alloc&) {
        threw = true;
    }
    allocations_left = -1;
    if (!threw)
        for (size_t i = 0; i < n; ++i)
            if (settled[i].load() != 1) return fail("a frame did not settle exactly once");
    if (threw) {
        ++seen.thrown;
        return true;
    }
    if (!accepted(st)) return fail(("decompress_many: unexpected status: " + st.message).c_str());
    if (!st.is_ok()) {
        ++seen.out_of_memory;
        return true;
    }
    for (size_t i = 0; i < n; ++i)
        if (std::memcmp(back[i].data(), src[i].data(), src[i].size()) != 0)
            return fail("a frame decoded under injection differs from its tensor");
    ++seen.ok;
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SEED ROUNDS\n", argv[0]);
        return 2;
    }
    std::mt19937_64 rng(std::strtoull(argv[1], nullptr, 10));
    const long rounds = std::strtol(argv[2], nullptr, 10);
    Outcome seen;
    for (long r = 0; r < rounds; ++r)
        if (!run_round(rng, seen)) return 1;
    std::printf("ok: %ld rounds (%d succeeded, %d out of memory, %d threw bad_alloc)\n", rounds, seen.ok,
                seen.out_of_memory, seen.thrown);
    return 0;
}
