// Dense-mode round trips of tensors built to take the plane methods that nest:
// random low bits under skewed high bits (lowbits, its high bits grouped or
// Huffman coded), and repeated rows (rows, with lowbits inside). Every dtype,
// row widths 1-200 (misaligned planes), random block sizes and thread counts;
// a quarter of the frames are one block of a multiple of 2048 rows, which the
// grouped coder transposes into spaced channel streams and closes up; half are
// coded with lane-interleaved Huffman streams (EncodeOptions::lanes). Each frame
// is coded and decoded by SIMD variants drawn apart (AVX-512, AVX2, portable).
// Run under ASan + UBSan by tests/test_low_bits.py (it found a misaligned
// 8-byte store in the grouped decoder's transpose).
// Usage: dense_round_trip <seed> <frames>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "frame/codec.h"

namespace fr = kvcore::frame;

int main(int argc, char** argv) {
    if (argc < 3) return 64;
    std::mt19937_64 rng(std::strtoull(argv[1], nullptr, 10));
    const int frames = std::atoi(argv[2]);
    size_t with_low_bits = 0;
    // Disabled-feature masks that leave AVX-512, AVX2 or no SIMD variant active.
    const uint32_t masks[3] = {0, kvcore::cpu::kIsaAvx512, kvcore::cpu::kIsaAvx512 | kvcore::cpu::kIsaAvx2};
    for (int it = 0; it < frames; ++it) {
        const fr::DType dtype = fr::DType(1 + rng() % 7);
        const size_t esize = fr::dtype_size(dtype);
        uint64_t cols = 1 + rng() % 200, rows = (4096 + rng() % 60000) / cols + 1;
        const bool spaced = rng() % 4 == 0;
        if (spaced) cols = 16u << (rng() % 3), rows = 2048 * (1 + rng() % 3);
        const fr::TensorDesc desc{dtype, {rows, cols}};
        const size_t n = rows * cols;
        std::vector<uint8_t> src(n * esize);
        const unsigned k = 1 + rng() % 6, spread = 1 + rng() % (1u << (8 - k));
        for (auto& byte : src) {
            const unsigned high = unsigned(std::min<uint64_t>(rng() % spread, rng() % spread));
            byte = uint8_t(high << k | (rng() & ((1u << k) - 1)));
        }
        if (rng() % 3 == 0)  // repeat about half the rows
            for (size_t r = 1; r < rows; ++r)
                if (rng() % 2) std::memcpy(&src[r * cols * esize], &src[(rng() % r) * cols * esize], cols * esize);
        fr::EncodeOptions o;
        o.mode = fr::Mode::kDense;
        o.lanes = rng() % 2;  // half the frames with lane-interleaved Huffman streams
        o.block_bytes = spaced ? uint32_t(n * esize) : rng() % 2 ? 0 : uint32_t(4096 * esize + rng() % 200000);
        o.threads = 1 + rng() % 3;
        std::vector<uint8_t> frame(fr::max_frame_size(desc, o.block_bytes));
        size_t written = 0;
        kvcore::cpu::set_disabled_isa(masks[rng() % 3]);
        if (!fr::compress(src.data(), src.size(), desc, o, frame.data(), frame.size(), &written).is_ok()) {
            std::puts("compress failed");
            return 1;
        }
        fr::FrameInfo info;
        if (!fr::read_info(frame.data(), written, &info).is_ok()) {
            std::puts("read_info failed");
            return 1;
        }
        if (info.method_counts.size() > 8 && info.method_counts[8]) ++with_low_bits;
        std::vector<uint8_t> back(src.size());
        kvcore::cpu::set_disabled_isa(masks[rng() % 3]);
        if (!fr::decompress(frame.data(), written, back.data(), back.size(), 2).is_ok() || back != src) {
            std::puts("round trip differs");
            return 1;
        }
    }
    std::printf("ok: %d frames, %zu with low-bits planes\n", frames, with_low_bits);
    return with_low_bits * 4 >= size_t(frames) ? 0 : 2;  // the inputs must reach the method
}
