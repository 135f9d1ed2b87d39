// Stress harness for frame::BlockCommits, the in-order placement of compressed
// blocks: more threads than the machine has cores claim (frame, block) tasks in
// order, as the thread pool's parallel_for does, and "code" each block (a random
// size, a random delay, bytes that name the block) in place or into a spill
// buffer, with as few as one spill buffer for all of them. Some frames start in a
// head buffer of a random size (FrameDest), so blocks straddle its end, and half
// the rounds copy spilled blocks with streaming stores (from 512 bytes on). Every
// frame must end up as its blocks back to back, each where the sizes before it
// put it, split between head and frame at the head's end, and nothing may
// deadlock. Built with ThreadSanitizer and with AddressSanitizer.
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
    std::vector<std::vector<uint8_t>> frames(n_frames), heads(n_frames);
    std::vector<std::pair<size_t, size_t>> tasks;  // (frame, block), frame-major
    fr::BlockCommits commits(max_spills, rng() % 2 == 0);
    std::vector<size_t> ids(n_frames);
    for (size_t i = 0; i < n_frames; ++i) {
        const size_t blocks = rng() % 12;
        size_t total = header;
        for (size_t b = 0; b < blocks; ++b) {
            sizes[i].push_back(rng() % 3 == 0 ? 0 : rng() % 5000);  // some blocks empty
            total += sizes[i].back();
        }
        frames[i].assign(total + 1, 0);
        fr::FrameDest dest{frames[i].data()};
        if (rng() % 2 == 0) {  // a head ending anywhere, past the frame's end included
            heads[i].assign(header + rng() % (total - header + 5000), 0);
            dest.head = heads[i].data();
            dest.head_bytes = heads[i].size();
        }
        ids[i] = commits.add_frame(dest, header, blocks);
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
            const fr::BlockCommits::Placement to = commits.place(ids[i], b, sizes[i][b] + 1);
            kvcore::AlignedBuffer* spill = to.spill;
            if (spill == nullptr) {  // in place: its bytes and the extra one lie in one buffer
                const bool in_head = !heads[i].empty() && to.at < heads[i].size();
                const std::vector<uint8_t>& buf = in_head ? heads[i] : frames[i];
                if (to.in_place != buf.data() + to.at || to.at + sizes[i][b] + 1 > buf.size()) bad = true;
            }
            uint8_t* out = spill != nullptr ? spill->data() : to.in_place;
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
        const size_t head_bytes = heads[i].size();
        for (size_t b = 0; b < sizes[i].size(); ++b) {
            for (size_t k = 0; k < sizes[i][b]; ++k) {
                const size_t pos = at + k;
                const uint8_t got = pos < head_bytes ? heads[i][pos] : frames[i][pos];
                if (got != block_byte(i, b, k)) return fail("a block's bytes are not where they belong", round);
            }
            at += sizes[i][b];
        }
        if (std::any_of(frames[i].begin(), frames[i].begin() + std::min(head_bytes, frames[i].size()),
                        [](uint8_t v) { return v != 0; }))
            return fail("a byte of a frame's head was written to the frame", round);
        if (commits.end(ids[i]) != at) return fail("a frame's end is not the sum of its sizes", round);
        const std::vector<uint8_t>& first = head_bytes != 0 ? heads[i] : frames[i];
        if (std::any_of(first.begin(), first.begin() + header, [](uint8_t v) { return v != 0; }))
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
