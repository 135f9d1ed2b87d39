// Sanitizer harness for the frame decoder: mutates real frames (bit flips,
// byte overwrites, truncations, extensions) and decodes each one into an
// exact-size heap buffer, so AddressSanitizer sees any read or write outside
// the frame or the output. Every mutant must decode or fail with a Status.
// Odd iterations run the portable kernels, even ones the widest the CPU has.
// Usage: frame_fuzz SEED ITERATIONS FRAME_FILE...
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "frame/codec.h"

namespace {

std::vector<uint8_t> read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Decodes into exactly the size the header declares (when it is sane).
bool decode(const std::vector<uint8_t>& frame) {
    // A copy on the heap of exactly the frame's size: reads past it are caught.
    std::unique_ptr<uint8_t[]> data(new uint8_t[frame.size() ? frame.size() : 1]);
    std::copy(frame.begin(), frame.end(), data.get());
    kvcore::frame::FrameInfo info;
    const kvcore::Status st = kvcore::frame::read_info(data.get(), frame.size(), &info);
    if (!st.is_ok()) return false;
    if (info.original_bytes > (64u << 20)) return false;
    std::unique_ptr<uint8_t[]> out(new uint8_t[info.original_bytes ? info.original_bytes : 1]);
    return kvcore::frame::decompress(data.get(), frame.size(), out.get(), info.original_bytes, 1).is_ok();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s SEED ITERATIONS FRAME...\n", argv[0]);
        return 2;
    }
    std::mt19937_64 rng(std::strtoull(argv[1], nullptr, 10));
    const long iterations = std::strtol(argv[2], nullptr, 10);
    std::vector<std::vector<uint8_t>> seeds;
    for (int i = 3; i < argc; ++i) seeds.push_back(read_file(argv[i]));
    for (const auto& s : seeds) {
        if (!decode(s)) {
            std::fprintf(stderr, "a seed frame does not decode\n");
            return 1;
        }
    }
    long decoded = 0;
    for (long it = 0; it < iterations; ++it) {
        // Alternate the widest and the portable kernels.
        kvcore::cpu::set_disabled_isa(it & 1 ? kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512 : 0);
        std::vector<uint8_t> f = seeds[rng() % seeds.size()];
        const int edits = 1 + int(rng() % 4);
        for (int e = 0; e < edits && !f.empty(); ++e) {
            const size_t pos = rng() % f.size();
            switch (rng() % 5) {
                case 0: f[pos] ^= uint8_t(1u << (rng() % 8)); break;
                case 1: f[pos] = uint8_t(rng()); break;
                case 2: f.resize(pos); break;
                case 3: f.insert(f.begin() + pos, uint8_t(rng())); break;
                default:
                    for (size_t k = pos; k < std::min(f.size(), pos + 16); ++k) f[k] = uint8_t(rng());
            }
        }
        decoded += decode(f);
    }
    std::printf("ok: %ld mutants, %ld decoded\n", iterations, decoded);
    return 0;
}
