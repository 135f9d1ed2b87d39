// Thread-sanitizer harness for DSA descriptors that time out: several threads
// copy at once through one engine on an emulated dedicated queue whose first
// descriptors are held past the engine's timeout and run late by the emulator's
// own thread. Copies time out, their slots and memory are parked, reaped when the
// late completion comes, and while every slot is parked copies run on the CPU.
// Every copy that succeeds must arrive intact, every failure be a timeout, and in
// the end every parked slot come back; ThreadSanitizer reports any race.
// Usage: dsa_overdue_threads SEED ROUNDS
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "dsa/dsa_engine.h"

namespace dsa = kvcore::dsa;

namespace {

constexpr int kThreads = 3;
constexpr int kBlocksPerCopy = 12;
constexpr uint32_t kStalled = 8;

std::atomic<int> failures{0};
std::atomic<int> timeouts{0};

void fail(const char* what) {
    std::printf("%s\n", what);
    failures.fetch_add(1);
}

struct Blocks {
    std::vector<std::vector<uint8_t>> src, dst;
};

// Copies `rounds` sets of blocks; the sets of copies that timed out go to `kept`
// (the device may still write their destinations).
void copier(dsa::EmulatedEngine& engine, uint64_t seed, int rounds, std::vector<Blocks>* kept) {
    std::mt19937_64 rng(seed);
    for (int r = 0; r < rounds; ++r) {
        Blocks b;
        std::vector<kvcore::copy::Segment> segs;
        for (int i = 0; i < kBlocksPerCopy; ++i) {
            const size_t n = 1 + rng() % 100000;
            b.src.emplace_back(n);
            for (size_t k = 0; k < n; k += 61) b.src.back()[k] = uint8_t(rng());
            b.dst.emplace_back(n, 0);
        }
        for (int i = 0; i < kBlocksPerCopy; ++i) segs.push_back({b.dst[i].data(), b.src[i].data(), b.src[i].size()});
        const kvcore::Status st = engine.copy_many(segs.data(), segs.size());
        if (!st.is_ok()) {
            if (st.message.find("did not complete") == std::string::npos) fail(st.message.c_str());
            timeouts.fetch_add(1);
            kept->push_back(std::move(b));
            continue;
        }
        for (int i = 0; i < kBlocksPerCopy; ++i)
            if (b.dst[i] != b.src[i]) fail("a copy arrived damaged");
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s SEED ROUNDS\n", argv[0]);
        return 2;
    }
    const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
    const int rounds = std::atoi(argv[2]);
    std::vector<std::vector<Blocks>> kept(kThreads);  // outlives the engine: late writes land here
    dsa::EmulationOptions o;
    o.max_batch = 4;
    o.max_transfer = 64 << 10;
    o.wq_size = 3;
    o.fault_every = 7;
    o.fault_after = 1000;
    o.stall_first = kStalled;
    o.stall_ms = 40;
    o.timeout_ms = 10;
    dsa::EmulatedEngine engine(o);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(copier, std::ref(engine), seed * 31 + t, rounds, &kept[t]);
    for (auto& t : threads) t.join();

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (engine.engine().overdue() != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const dsa::EmulationStats s = engine.stats();
    if (engine.engine().overdue() != 0) fail("parked slots never came back");
    if (s.stalled != kStalled || s.late_completions != kStalled) fail("the stalled descriptors did not all run late");
    if (engine.engine().timeouts() == 0 || timeouts.load() == 0) fail("nothing timed out");
    if (s.errors != 0) fail("a descriptor broke a device rule");
    if (failures.load()) return 1;
    std::printf("ok: %d copies, %d timed out, %llu engine timeouts, %llu on the CPU\n", kThreads * rounds,
                timeouts.load(), static_cast<unsigned long long>(engine.engine().timeouts()),
                static_cast<unsigned long long>(engine.engine().cpu_fallbacks()));
    return 0;
}
