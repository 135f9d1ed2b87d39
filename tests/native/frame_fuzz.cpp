// Sanitizer harness for the frame decoder: mutates real frames (bit flips,
// byte overwrites, truncations, extensions) and decodes each one into an
// exact-size heap buffer, so AddressSanitizer sees any read or write outside
// the frame or the output. Every mutant must decode or fail with a Status.
// Even iterations run the widest kernels the CPU has, odd ones the portable
// kernels and the AVX2 ones (AVX-512 masked) in turn.
// Every third mutant edits header fields only and recomputes the header
// checksum, so edited shapes, block sizes, channels and residuals get past it
// and reach the block decoders (whose checksums then fail, after decoding).
// Every other mutant decodes into runs with a 13-byte gap after each, filled with
// a canary that must survive any outcome: runs of one row (channels elements),
// or of the fewest rows that make a whole number of 1 KiB XXH3 blocks (where the
// merge checksums a block across its runs in one pass).
// A mutant that decodes must give its seed's bytes, and be its seed again
// (edits that cancel out), except in frames with LZ planes (zstd, DEFLATE):
// an LZ stream can change and still decode to the same bytes (a match that
// copies from another place holding the same bytes; seen with DEFLATE).
// Usage: frame_fuzz SEED ITERATIONS FRAME_FILE...
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "checksum/checksum.h"
#include "common/little_endian.h"
#include "cpu/cpu_features.h"
#include "frame/codec.h"
#include "frame/format.h"
#include "frame/plane_methods.h"

namespace {

std::vector<uint8_t> read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// How far a frame got: its header refused, its header accepted (the block
// decoders ran), or decoded whole.
enum Outcome { kHeaderRefused, kBlocksRefused, kDecoded };

constexpr size_t kGap = 13;
constexpr uint8_t kCanary = 0xA5;

// Decodes into exactly the size the header declares (when it is sane), into
// one buffer or (strided, when the size allows) into runs with canary gaps;
// *decoded receives the bytes decoded (the runs joined), when they were.
enum class Runs { kNone, kRows, kXxh3Blocks };

Outcome decode(const std::vector<uint8_t>& frame, Runs strided, std::vector<uint8_t>* decoded) {
    // A copy on the heap of exactly the frame's size: reads past it are caught.
    std::unique_ptr<uint8_t[]> data(new uint8_t[frame.size() ? frame.size() : 1]);
    std::copy(frame.begin(), frame.end(), data.get());
    kvcore::frame::FrameInfo info;
    const kvcore::Status st = kvcore::frame::read_info(data.get(), frame.size(), &info);
    if (!st.is_ok() || info.original_bytes > (64u << 20)) return kHeaderRefused;
    kvcore::frame::OutputRuns runs;
    runs.bytes = info.original_bytes;
    size_t row = size_t(info.channels) * kvcore::frame::dtype_size(info.desc.dtype);
    if (strided == Runs::kXxh3Blocks) row *= 1024 / std::gcd(row ? row : 1, size_t(1024));
    if (strided != Runs::kNone && row != 0 && runs.bytes % row == 0 && runs.bytes <= (4u << 20)) {
        runs.run_bytes = row;
        runs.stride = row + kGap;
    }
    const size_t span = runs.span();
    std::unique_ptr<uint8_t[]> out(new uint8_t[span ? span : 1]);
    std::fill(out.get(), out.get() + span, kCanary);
    runs.base = out.get();
    const kvcore::frame::FrameJob job{data.get(), frame.size(), runs};
    const bool ok = kvcore::frame::decompress_many(&job, 1, 1).is_ok();
    for (size_t r = 0; !runs.contiguous() && r + 1 < runs.runs(); ++r)
        for (size_t k = 0; k < kGap; ++k)
            if (out[r * runs.stride + runs.run_bytes + k] != kCanary) {
                std::fprintf(stderr, "a write landed between output runs\n");
                std::abort();
            }
    if (!ok) return kBlocksRefused;
    decoded->clear();
    const size_t run_bytes = runs.contiguous() ? runs.bytes : runs.run_bytes;
    for (size_t r = 0; r < runs.runs(); ++r) {
        const uint8_t* run = out.get() + r * runs.stride;
        decoded->insert(decoded->end(), run, run + run_bytes);
    }
    return kDecoded;
}

// Whether a valid frame has planes coded by an LZ method (zstd or DEFLATE).
bool has_lz_planes(const std::vector<uint8_t>& frame) {
    kvcore::frame::FrameInfo info;
    if (!kvcore::frame::read_info(frame.data(), frame.size(), &info).is_ok()) return false;
    for (auto m : {kvcore::frame::Method::kZstd, kvcore::frame::Method::kDeflate}) {
        const size_t i = static_cast<size_t>(m);
        if (i < info.method_counts.size() && info.method_counts[i] != 0) return true;
    }
    return false;
}

// Bytes of a valid frame's header (docs/FORMAT.md), its checksum included.
size_t header_bytes(const std::vector<uint8_t>& frame) {
    kvcore::frame::FrameInfo info;
    if (!kvcore::frame::read_info(frame.data(), frame.size(), &info).is_ok()) return 0;
    return kvcore::frame::header_size(info.desc.shape.size(), (info.flags & kvcore::frame::kFlagResidual) != 0,
                                      info.channels, info.n_blocks);
}

// Overwrites 1-3 header bytes before the checksum, then recomputes the checksum.
void edit_header(std::vector<uint8_t>& f, size_t header, std::mt19937_64& rng) {
    if (header < 5 || header > f.size()) return;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
        const size_t pos = rng() % (header - 4);
        if (rng() % 2) f[pos] ^= uint8_t(1u << (rng() % 8));
        else f[pos] = uint8_t(rng());
    }
    kvcore::put_u32(f.data() + header - 4, uint32_t(kvcore::checksum64(f.data(), header - 4, 0)));
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
    std::vector<size_t> headers;
    std::vector<std::vector<uint8_t>> originals(seeds.size());
    std::vector<bool> lz(seeds.size());
    for (size_t i = 0; i < seeds.size(); ++i) {
        if (decode(seeds[i], Runs::kNone, &originals[i]) != kDecoded) {
            std::fprintf(stderr, "a seed frame does not decode\n");
            return 1;
        }
        for (const Runs r : {Runs::kRows, Runs::kXxh3Blocks}) {
            std::vector<uint8_t> strided;
            if (decode(seeds[i], r, &strided) != kDecoded || strided != originals[i]) {
                std::fprintf(stderr, "a seed frame does not decode into runs\n");
                return 1;
            }
        }
        headers.push_back(header_bytes(seeds[i]));
        lz[i] = has_lz_planes(seeds[i]);
    }
    std::vector<uint8_t> decoded;
    long outcomes[3] = {};
    for (long it = 0; it < iterations; ++it) {
        // The widest kernels on even iterations, else the portable ones and AVX2's (AVX-512
        // masked) in turn.
        using kvcore::cpu::kIsaAvx2, kvcore::cpu::kIsaAvx512;
        static const uint32_t kMasks[4] = {0, kIsaAvx2 | kIsaAvx512, 0, kIsaAvx512};
        kvcore::cpu::set_disabled_isa(kMasks[it % 4]);
        const size_t pick = rng() % seeds.size();
        std::vector<uint8_t> f = seeds[pick];
        Outcome outcome;
        if (it % 3 == 2) {
            edit_header(f, headers[pick], rng);
            outcome = decode(f, it % 2 ? Runs::kNone : it % 4 ? Runs::kXxh3Blocks : Runs::kRows, &decoded);
        } else {
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
            outcome = decode(f, it % 4 >= 2 ? Runs::kNone : it % 8 < 2 ? Runs::kRows : Runs::kXxh3Blocks, &decoded);
        }
        if (outcome == kDecoded && decoded != originals[pick]) {
            std::fprintf(stderr, "an edited frame decoded to other bytes without an error (mutant %ld)\n", it);
            return 1;
        }
        if (outcome == kDecoded && f != seeds[pick] && !lz[pick]) {
            std::fprintf(stderr, "an edited frame without LZ planes decoded without an error (mutant %ld)\n", it);
            return 1;
        }
        ++outcomes[outcome];
    }
    std::printf("ok: %ld mutants, %ld past the header, %ld decoded\n", iterations,
                outcomes[kBlocksRefused] + outcomes[kDecoded], outcomes[kDecoded]);
    return 0;
}
