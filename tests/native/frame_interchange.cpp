// Frames across CPU architectures (tests/test_aarch64.py): decodes frames that
// another build wrote (the x86-64 extension) and checks them against the
// tensor's bytes, then codes the tensor here with the same options and writes
// that frame out, for the test to compare with the other build's byte for byte
// and to decode on the other side.
// Usage: frame_interchange CASES_FILE
//   one case a line: NAME DTYPE_CODE MODE BLOCK_BYTES DIM... (MODE: dense, fast,
//   max, lanes or deflate); reads NAME.raw (the tensor) and NAME.frame (the
//   other build's frame) from CASES_FILE's folder and writes NAME.here there.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "frame/codec.h"

namespace fr = kvcore::frame;

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

bool options_for(const std::string& mode, uint32_t block_bytes, fr::EncodeOptions* o) {
    o->threads = 1;
    o->block_bytes = block_bytes;
    if (mode == "fast") o->mode = fr::Mode::kFast;
    else if (mode == "max") o->max_ratio = true;
    else if (mode == "lanes") o->lanes = true;
    else if (mode == "deflate") o->deflate = true, o->backend = fr::Backend::kSoftware;
    else if (mode != "dense") return false;
    return true;
}

// "" when the case passes, else what failed.
std::string run_case(const std::string& dir, const std::string& line) {
    std::istringstream in(line);
    std::string name, mode;
    unsigned dtype = 0;
    uint32_t block_bytes = 0;
    if (!(in >> name >> dtype >> mode >> block_bytes) || !fr::dtype_valid(uint8_t(dtype))) return "bad case line";
    fr::TensorDesc desc{fr::DType(dtype), {}};
    for (uint64_t d; in >> d;) desc.shape.push_back(d);
    fr::EncodeOptions o;
    if (!options_for(mode, block_bytes, &o)) return "unknown mode " + mode;
    const std::vector<uint8_t> src = read_file(dir + name + ".raw");
    const std::vector<uint8_t> theirs = read_file(dir + name + ".frame");

    std::vector<uint8_t> back(src.size(), 0xa5);
    kvcore::Status st = fr::decompress(theirs.data(), theirs.size(), back.data(), back.size(), 1);
    if (!st.is_ok()) return "their frame: " + st.message;
    if (back != src) return "their frame decodes to other bytes";

    std::vector<uint8_t> ours(fr::max_frame_size(desc, o.block_bytes));
    size_t written = 0;
    st = fr::compress(src.data(), src.size(), desc, o, ours.data(), ours.size(), &written);
    if (!st.is_ok()) return "compress: " + st.message;
    ours.resize(written);
    std::fill(back.begin(), back.end(), uint8_t(0x5a));
    st = fr::decompress(ours.data(), ours.size(), back.data(), back.size(), 1);
    if (!st.is_ok() || back != src) return "own frame does not round-trip";
    std::ofstream(dir + name + ".here", std::ios::binary).write(reinterpret_cast<const char*>(ours.data()),
                                                                 std::streamsize(ours.size()));
    return "";
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) return 64;
    const std::string cases = argv[1];
    const size_t slash = cases.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : cases.substr(0, slash + 1);
    std::ifstream in(cases);
    int failures = 0, frames = 0;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        const std::string error = run_case(dir, line);
        ++frames;
        if (!error.empty()) {
            ++failures;
            std::printf("%s: %s\n", line.c_str(), error.c_str());
        }
    }
    if (failures || frames == 0) return 1;
    std::printf("ok: %d frames\n", frames);
    return 0;
}
