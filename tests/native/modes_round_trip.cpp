// Round trips of real KV tensors through every encoder configuration (dense,
// fast, max, DEFLATE planes, small blocks, two threads), each frame coded twice
// and required to be identical. Built without sanitizers and run under valgrind
// by tests/test_valgrind.py: memcheck reports a branch on memory never written,
// also inside the system libraries (it sees ISA-L's stateless deflate reading the
// match-window size kvcore had left unset).
// Usage: modes_round_trip (<raw tensor file> <dtype code> <columns>)...
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "frame/codec.h"

namespace fr = kvcore::frame;

namespace {

struct Config {
    const char* name;
    fr::EncodeOptions options;
};

std::vector<Config> configs() {
    std::vector<Config> out;
    fr::EncodeOptions o;
    o.threads = 1;
    out.push_back({"dense", o});
    o.lanes = true;
    out.push_back({"dense, lanes", o});
    o.lanes = false;
    o.mode = fr::Mode::kFast;
    out.push_back({"fast", o});
    o.mode = fr::Mode::kDense;
    o.max_ratio = true;
    out.push_back({"max", o});
    o.max_ratio = false;
    o.deflate = true;
    o.backend = fr::Backend::kSoftware;
    out.push_back({"deflate", o});
    o.deflate = false;
    o.backend = fr::Backend::kAuto;
    o.block_bytes = 4096;
    out.push_back({"dense 4 KiB blocks", o});
    o.mode = fr::Mode::kFast;
    o.threads = 2;
    out.push_back({"fast 4 KiB blocks, 2 threads", o});
    return out;
}

std::vector<uint8_t> encode(const std::vector<uint8_t>& src, const fr::TensorDesc& desc, const fr::EncodeOptions& o) {
    std::vector<uint8_t> frame(fr::max_frame_size(desc, o.block_bytes));
    size_t written = 0;
    const kvcore::Status st = fr::compress(src.data(), src.size(), desc, o, frame.data(), frame.size(), &written);
    if (!st.is_ok()) {
        std::printf("compress failed: %s\n", st.message.c_str());
        std::exit(1);
    }
    frame.resize(written);
    return frame;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4 || (argc - 1) % 3 != 0) return 64;
    int failures = 0, frames = 0;
    for (int a = 1; a + 2 < argc; a += 3) {
        std::ifstream file(argv[a], std::ios::binary);
        std::vector<uint8_t> src((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
        const auto dtype = fr::DType(std::atoi(argv[a + 1]));
        const uint64_t cols = std::strtoull(argv[a + 2], nullptr, 10);
        const size_t rows = src.size() / fr::dtype_size(dtype) / cols;
        src.resize(rows * cols * fr::dtype_size(dtype));
        const fr::TensorDesc desc{dtype, {rows, cols}};
        for (const Config& c : configs()) {
            const std::vector<uint8_t> frame = encode(src, desc, c.options);
            std::vector<uint8_t> back(src.size());
            const kvcore::Status st = fr::decompress(frame.data(), frame.size(), back.data(), back.size(), 1);
            const bool ok = st.is_ok() && back == src && encode(src, desc, c.options) == frame;
            failures += !ok;
            ++frames;
            if (!ok) std::printf("%s, %s: %s\n", argv[a], c.name, st.is_ok() ? "differs" : st.message.c_str());
        }
    }
    if (failures) return 1;
    std::printf("ok: %d frames\n", frames);
    return 0;
}
