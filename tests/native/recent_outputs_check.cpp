// Checks frame::RecentOutputs (csrc/frame/recent_outputs.h), the history that
// tells a decode call whether its output is still cached:
// - scripted cases, one rule each;
// - random histories against a plain model of the rule that keeps every call;
// - several threads recording and asking at once (run under TSan by the test).
// Usage: recent_outputs_check SEED ROUNDS. Prints "ok: ROUNDS rounds ..." on success.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "frame/recent_outputs.h"

using kvcore::frame::RecentOutputs;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::printf("FAIL: %s\n", what);
        ++failures;
    }
}

constexpr uint64_t kWindow = 1000;

void scripted() {
    {
        RecentOutputs r(kWindow);
        expect(!r.cold(0, 100), "no history: warm");
        r.record(1000, 2000, kWindow - 1);
        expect(!r.cold(0, 100), "less than the window of traffic: warm");
        r.record(3000, 4000, 1);
        expect(r.cold(0, 100), "a window of traffic that did not write the range: cold");
        expect(!r.cold(1999, 2500), "the range overlaps a cached write 1 byte of traffic ago: warm");
        expect(!r.cold(3999, 4001), "the range overlaps the last cached write: warm");
        expect(r.cold(2000, 3000), "ranges are half-open: [2000, 3000) touches neither: cold");
    }
    {
        RecentOutputs r(kWindow);
        r.record(0, 100, 10);
        r.record(500, 600, kWindow);
        expect(r.cold(0, 100), "a write followed by a window of traffic: cold");
        expect(!r.cold(550, 551), "inside the last write: warm");
        r.record(0, 50, 10);
        expect(!r.cold(40, 60), "part of the range written since: warm");
        expect(r.cold(60, 70), "the part not written since: cold");
    }
    {
        // Only the last kCalls calls are kept: tiny calls never add up to a window.
        RecentOutputs r(kWindow);
        for (size_t i = 0; i < 3 * RecentOutputs::kCalls; ++i) r.record(10000 + i, 10001 + i, 1);
        expect(!r.cold(0, 1), "kCalls calls of 1 byte each: too little history, warm");
        r.record(10000, 10001, kWindow);
        expect(r.cold(0, 1), "then a call of a window's traffic: cold");
    }
}

// The rule over an unbounded list of calls, newest last; `from` is the oldest call
// the bounded history still holds.
struct Model {
    struct Call {
        uint64_t lo, hi, bytes;
    };
    std::vector<Call> calls;
    bool cold(uint64_t lo, uint64_t hi) const {
        uint64_t traffic = 0;
        const size_t held = std::min(calls.size(), RecentOutputs::kCalls);
        for (size_t k = 1; k <= held; ++k) {
            const Call& c = calls[calls.size() - k];
            if (c.lo < hi && lo < c.hi) return false;
            traffic += c.bytes;
            if (traffic >= kWindow) return true;
        }
        return false;
    }
};

size_t random_histories(std::mt19937_64& rng, int rounds) {
    size_t colds = 0, asks = 0;
    for (int round = 0; round < rounds; ++round) {
        RecentOutputs r(kWindow);
        Model m;
        const uint64_t space = 1 + rng() % 5000;  // address space: small ones overlap often
        const uint64_t max_bytes = 1 + rng() % 400;
        const int calls = static_cast<int>(rng() % (3 * RecentOutputs::kCalls));
        for (int i = 0; i < calls; ++i) {
            const uint64_t lo = rng() % space, hi = lo + rng() % 200;
            const bool got = r.cold(lo, hi);
            if (got != m.cold(lo, hi)) {
                std::printf("FAIL: round %d call %d: cold(%llu, %llu) = %d, the model says %d\n", round, i,
                            static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi), got, !got);
                ++failures;
                return asks;
            }
            colds += got;
            ++asks;
            const uint64_t bytes = rng() % max_bytes;
            r.record(lo, hi, bytes);
            m.calls.push_back({lo, hi, bytes});
        }
    }
    std::printf("asked %zu times, %zu cold\n", asks, colds);
    expect(colds > 0 && colds < asks, "random histories gave both answers");
    return asks;
}

void concurrent(uint64_t seed) {
    RecentOutputs r(kWindow);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; ++t)
        threads.emplace_back([&r, t, seed] {
            std::mt19937_64 rng(seed * 4 + t);
            for (int i = 0; i < 20000; ++i) {
                const uint64_t lo = rng() % 100000;
                r.record(lo, lo + 512, r.cold(lo, lo + 512) ? 300 : 800);
            }
        });
    for (std::thread& t : threads) t.join();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::printf("usage: %s SEED ROUNDS\n", argv[0]);
        return 2;
    }
    const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
    const int rounds = std::atoi(argv[2]);
    std::mt19937_64 rng(seed);
    scripted();
    random_histories(rng, rounds);
    concurrent(seed);
    if (failures) return 1;
    std::printf("ok: %d rounds\n", rounds);
    return 0;
}
