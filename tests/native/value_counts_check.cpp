// Checks every variant of frame/value_counts (SSE2, AVX2, AVX-512) against a
// plain count: the distinct values in increasing order, their counts and the
// mode (the most common, the smallest on ties). Inputs: one value; two values
// tied; ranges at and around the SSE2 and AVX-512 compare limits (15 to 25
// values), so both ways of counting run in each variant; 64 distinct values;
// the extremes 0 and 255 together; skewed random channels. The AVX-512 variant
// runs natively where the CPU has AVX-512 (tests/test_layout_analysis.py) or
// compiled against emulated intrinsics (KVCORE_EMULATE_AVX512,
// test_shuffle_avx512_emulated.py); AVX2 where the CPU has it; SSE2 always.
// Prints "ok: N cases".
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "avx512_native_only.h"
#include "cpu/cpu_features.h"
#include "frame/value_counts_internal.h"

using namespace kvcore::frame;

namespace {

struct Expected {
    std::vector<uint8_t> value, count;
    unsigned mode = 0;
};

Expected expected(const uint8_t* bytes) {
    unsigned n[256] = {};
    for (unsigned k = 0; k < kValueCountBytes; ++k) ++n[bytes[k]];
    Expected e;
    for (unsigned v = 0; v < 256; ++v)
        if (n[v]) {
            if (n[v] > n[e.value.empty() ? v : e.value[e.mode]]) e.mode = unsigned(e.value.size());
            e.value.push_back(uint8_t(v));
            e.count.push_back(uint8_t(n[v]));
        }
    return e;
}

bool matches(ValueCountsKernel kernel, const uint8_t* bytes, const Expected& e) {
    uint8_t value[kValueCountBytes], count[kValueCountBytes];
    const ValueCounts got = kernel(bytes, value, count);
    return got.distinct == e.value.size() && got.mode == e.mode &&
           std::memcmp(value, e.value.data(), got.distinct) == 0 && std::memcmp(count, e.count.data(), got.distinct) == 0;
}

}  // namespace

int main() {
    std::vector<std::pair<const char*, ValueCountsKernel>> variants = {{"sse2", detail::value_counts_sse2}};
    if (kvcore::cpu::detected_isa() & kvcore::cpu::kIsaAvx2) variants.push_back({"avx2", detail::value_counts_avx2});
    if (avx512_runs_here()) variants.push_back({"avx512", detail::value_counts_avx512});
    std::mt19937 rng(5);
    std::vector<std::vector<uint8_t>> inputs;
    auto add = [&](auto&& fill) {
        std::vector<uint8_t> b(kValueCountBytes);
        for (unsigned k = 0; k < kValueCountBytes; ++k) b[k] = uint8_t(fill(k));
        inputs.push_back(b);
    };
    for (unsigned v : {0u, 1u, 128u, 255u}) add([&](unsigned) { return v; });
    for (unsigned base : {0u, 100u, 254u}) add([&](unsigned k) { return (base + k % 2) & 0xff; });  // a tie
    add([](unsigned k) { return k; });                          // 64 distinct values
    add([](unsigned k) { return 255 - 4 * k; });                // 64 distinct, descending
    add([](unsigned k) { return k % 3 ? 0 : 255; });            // the two extremes
    add([](unsigned k) { return k < 32 ? 7 : 7 + k % 9; });     // a clear mode
    for (unsigned width = 1; width <= 256; width = width < 30 ? width + 1 : width * 2)
        for (int trial = 0; trial < 24; ++trial) {
            const unsigned base = rng() % 256;
            const bool skewed = trial % 2;
            add([&](unsigned) {
                unsigned r = rng() % width;
                if (skewed) r = r * (rng() % width) / width;  // small offsets more common, ties rarer
                return (base + r) & 0xff;
            });
        }
    size_t cases = 0;
    int bad = 0;
    for (const auto& b : inputs) {
        const Expected e = expected(b.data());
        for (const auto& [name, kernel] : variants) {
            ++cases;
            if (!matches(kernel, b.data(), e) && bad++ < 20) {
                std::printf("MISMATCH %s on input %zu:", name, size_t(&b - inputs.data()));
                for (uint8_t x : b) std::printf(" %u", x);
                std::printf("\n");
            }
        }
    }
    if (bad) {
        std::printf("FAILED: %d of %zu cases\n", bad, cases);
        return 1;
    }
    std::printf("ok: %zu cases of", cases);
    for (const auto& [name, kernel] : variants) std::printf(" %s", name);
    std::printf("\n");
    return 0;
}
