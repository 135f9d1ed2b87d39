// Stress harness for frame::BlockCommits, the in-order placement of compressed
// blocks: more threads than the machine has cores claim (frame, block) tasks in
// order, as the thread pool's parallel_for does, and "code" each block (a random
// size, a random delay, bytes that name the block) in place or into a spill
// buffer, with as few as one spill buffer for all of them. Every frame must end
// up as its blocks back to back, each where the sizes before it put it, and
// nothing may deadlock. Built with ThreadSanitizer and with AddressSanitizer.
// Usage: block_commits_check SEED ROUNDS
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "frame/block_commit.h"

namespace fr = kvcore::frame;

namespace {

uint8_t block_byte(size_t frame, size_t block, size_t k) { return uint8_t(frame * 131 + block * 31 + k * 7 + 1); }

bool fail(const char* what, size_t round) {
    std::fprintf(stderr, "round %zu: %s\n", round, what);
    return false;
}

bool run_round(std::mt19937_64& rng, size_t round) {
    const size_t threads = 1 + rng() % 8;
    const size_t max_spills = 1 + rng() % 4;
    const size_t n_frames = 1 + rng() % 5;
    const size_t header = rng() % 100;
    std::vector<std::vector<size_t>> sizes(n_frames);
    std::vector<std::vector<uint8_t>> frames(n_frames);
    std::vector<std::pair<size_t, size_t>> tasks;  // (frame, block), frame-major
    fr::BlockCommits commits(max_spills);
    std::vector<size_t> ids(n_frames);
    for (size_t i = 0; i < n_frames; ++i) {
        const size_t blocks = rng() % 12;
        size_t total = header;
        for (size_t b = 0; b < blocks; ++b) {
            sizes[i].push_back(rng() % 3 == 0 ? 0 : rng() % 5000);  // some blocks empty
            total += sizes[i].back();
        }
        frames[i].assign(total + 1, 0);
        ids[i] = commits.add_frame(frames[i].data(), header, blocks);
        for (size_t b = 0; b < blocks; ++b) tasks.emplace_back(i, b);
    }
    std::vector<unsigned> delay_us(tasks.size());
    for (unsigned& d : delay_us) d = rng() % 4 == 0 ? unsigned(rng() % 300) : 0;

    std::atomic<size_t> next{0};
    std::atomic<bool> bad{false};
    auto worker = [&] {
        for (size_t t; (t = next.fetch_add(1)) < tasks.size();) {
            const auto [i, b] = tasks[t];
            commits.copy_ready();
            uint64_t at = 0;
            kvcore::AlignedBuffer* spill = commits.place(ids[i], b, sizes[i][b] + 1, &at);
            if (spill == nullptr && at + sizes[i][b] > frames[i].size()) bad = true;
            uint8_t* out = spill != nullptr ? spill->data() : frames[i].data() + at;
            if (spill != nullptr && spill->size() < sizes[i][b] + 1) bad = true;
            if (bad) continue;
            for (size_t k = 0; k < sizes[i][b]; ++k) out[k] = block_byte(i, b, k);
            if (delay_us[t]) std::this_thread::sleep_for(std::chrono::microseconds(delay_us[t]));
            commits.done(ids[i], b, sizes[i][b], spill);
            commits.copy_ready();
        }
    };
    std::vector<std::thread> pool;
    for (size_t k = 1; k < threads; ++k) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
    commits.copy_ready();
    if (bad) return fail("a block was placed outside its frame or given a short buffer", round);

    for (size_t i = 0; i < n_frames; ++i) {
        size_t at = header;
        for (size_t b = 0; b < sizes[i].size(); ++b) {
            for (size_t k = 0; k < sizes[i][b]; ++k)
                if (frames[i][at + k] != block_byte(i, b, k)) return fail("a block's bytes are not where they belong", round);
            at += sizes[i][b];
        }
        if (commits.end(ids[i]) != at) return fail("a frame's end is not the sum of its sizes", round);
        if (std::any_of(frames[i].begin(), frames[i].begin() + header, [](uint8_t v) { return v != 0; }))
            return fail("a block was written over the header", round);
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s SEED ROUNDS\n", argv[0]);
        return 2;
    }
    std::mt19937_64 rng(std::strtoull(argv[1], nullptr, 10));
    const size_t rounds = std::strtoull(argv[2], nullptr, 10);
    for (size_t r = 0; r < rounds; ++r)
        if (!run_round(rng, r)) return 1;
    std::printf("ok: %zu rounds\n", rounds);
    return 0;
}
