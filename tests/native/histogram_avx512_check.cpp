// Checks the AVX-512 presence scan of entropy/histogram (find_values_avx512)
// against the scalar one: planes of 0 to 5000 bytes at odd offsets, rare values
// planted at the start, the end and the last vector's tail, candidate sets of 1
// to 256 values (repeats included). And its window count (count_window_avx512)
// against counting byte by byte: windows of 1 to 40 values, wrapping past 255,
// planes up to past two counter flushes (255 vectors). Runs natively where the CPU has AVX-512
// (tests/test_huffman.py) or compiled against emulated intrinsics
// (KVCORE_EMULATE_AVX512, test_shuffle_avx512_emulated.py). Prints "ok: N cases".
#include <cstdio>
#include <random>
#include <vector>

#include "avx512_native_only.h"
#include "entropy/histogram_internal.h"

using namespace kvcore::entropy::detail;

int main() {
    if (skip_without_avx512()) return 0;
    std::mt19937 rng(11);
    size_t cases = 0;
    int bad = 0;
    for (size_t n : {size_t(0), size_t(1), size_t(63), size_t(64), size_t(65), size_t(1000), size_t(5000)})
        for (unsigned k : {1u, 7u, 33u, 100u, 256u})
            for (int trial = 0; trial < 4; ++trial) {
                const size_t off = 1 + trial;
                std::vector<uint8_t> buf(n + off);
                for (size_t i = 0; i < n; ++i) buf[off + i] = static_cast<uint8_t>(100 + rng() % 8);  // common values
                const uint8_t* src = buf.data() + off;
                for (size_t at : {size_t(0), n - 1, n - n % 64, n / 2})  // a few rare values
                    if (n && at < n) buf[off + at] = static_cast<uint8_t>(rng());
                std::vector<uint8_t> cand(k);
                for (auto& c : cand) c = static_cast<uint8_t>(rng());
                bool want[256], got[256];
                find_values_scalar(src, n, cand.data(), k, want);
                find_values_avx512(src, n, cand.data(), k, got);
                ++cases;
                for (unsigned j = 0; j < k; ++j)
                    if (want[j] != got[j]) {
                        if (bad++ < 20) std::printf("MISMATCH n=%zu k=%u trial=%d value=%u\n", n, k, trial, cand[j]);
                        break;
                    }
            }
    for (size_t n : {size_t(0), size_t(5), size_t(64), size_t(1001), size_t(64 * 255), size_t(64 * 510 + 77)})
        for (unsigned width : {1u, 8u, 9u, 24u, 40u})
            for (unsigned lo : {0u, 120u, 250u}) {
                std::vector<uint8_t> buf(n + 3);
                const uint8_t* src = buf.data() + 3;
                for (size_t i = 0; i < n; ++i) buf[3 + i] = static_cast<uint8_t>(lo + rng() % width);
                uint32_t want[256] = {}, got[256];
                for (size_t i = 0; i < n; ++i) ++want[src[i]];
                count_window_avx512(src, n, static_cast<uint8_t>(lo), width, got);
                ++cases;
                for (unsigned v = 0; v < 256; ++v)
                    if (want[v] != got[v]) {
                        if (bad++ < 20) std::printf("MISMATCH count n=%zu width=%u lo=%u value=%u\n", n, width, lo, v);
                        break;
                    }
            }
    if (bad) {
        std::printf("%d of %zu cases mismatch\n", bad, cases);
        return 1;
    }
    std::printf("ok: %zu cases\n", cases);
    return 0;
}
