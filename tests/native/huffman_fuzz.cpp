// Sanitizer-built mutation fuzzer of the Huffman coder (run by tests/test_huffman_native_fuzz.py).
//
// Valid streams of varied planes are mutated (bit flips, truncation, appended
// bytes, random bytes, edited header fields, pure garbage) and decoded from
// exact-size heap copies into exact-size heap buffers, so AddressSanitizer sees
// any read or write outside them; UBSan sees undefined behaviour. Each decode
// must return kOk or kCorruptFrame. Encoding into every too-small capacity must
// fail cleanly. Every SIMD variant runs (AVX-512, AVX2, portable in turn).
//
// The encoder writes tag 3 streams, and tag 4 (lane-interleaved) ones when given
// an allowance for them, as half the iterations are; streams of the older layout
// (tag 2) come from files, each a u32 symbol count (little endian) and the
// stream, and are mutated in a third of the iterations.
//
// usage: huffman_fuzz SEED ITERATIONS [LEGACY_STREAM_FILE...]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "entropy/huffman.h"

using kvcore::entropy::huffman_bound;
using kvcore::entropy::huffman_decode;
using kvcore::entropy::huffman_encode;

namespace {

std::unique_ptr<uint8_t[]> exact_copy(const std::vector<uint8_t>& v) {
    std::unique_ptr<uint8_t[]> p(new uint8_t[v.size()]);
    if (!v.empty()) std::memcpy(p.get(), v.data(), v.size());
    return p;
}

int fail(const char* what, size_t n, const kvcore::Status& st) {
    std::fprintf(stderr, "FAIL: %s (n=%zu): %s\n", what, n, st.message.c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
    const long iters = argc > 2 ? std::atol(argv[2]) : 10000;
    struct Legacy {
        std::vector<uint8_t> stream;
        size_t n;
    };
    std::vector<Legacy> legacy;
    for (int a = 3; a < argc; ++a) {
        std::ifstream f(argv[a], std::ios::binary);
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
        if (bytes.size() < 5) {
            std::fprintf(stderr, "FAIL: legacy stream file %s is too short\n", argv[a]);
            return 1;
        }
        const size_t n = size_t(bytes[0]) | size_t(bytes[1]) << 8 | size_t(bytes[2]) << 16 | size_t(bytes[3]) << 24;
        legacy.push_back({std::vector<uint8_t>(bytes.begin() + 4, bytes.end()), n});
    }
    long decoded = 0, corrupt = 0;
    for (long it = 0; it < iters; ++it) {
        const uint32_t masks[3] = {0, kvcore::cpu::kIsaAvx512, kvcore::cpu::kIsaAvx512 | kvcore::cpu::kIsaAvx2};
        kvcore::cpu::set_disabled_isa(masks[it % 3]);
        const double lanes = rng() % 2 ? -1.0 : rng() % 2 ? 0.05 : 100.0;
        size_t n = rng() % 5 == 0 ? rng() % 20 : rng() % 6000;
        std::vector<uint8_t> src(n);
        const int kind = int(rng() % 6);
        std::geometric_distribution<int> geo(0.1 + double(rng() % 80) / 100.0);
        const unsigned base = unsigned(rng() % 256);
        const unsigned shift = unsigned(rng() % 4);  // symbols sharing low zero bits: shifted windows
        for (auto& c : src) {
            c = kind == 0   ? uint8_t(rng())
                : kind == 1 ? uint8_t(std::min(geo(rng), 255))
                : kind == 2 ? uint8_t((rng() % 3) * 50)
                : kind == 3 ? uint8_t(std::min(geo(rng), 30) * 8)
                : kind == 4 ? uint8_t((base + unsigned(std::min(geo(rng), 40))) << shift)  // some wrapping through 0
                            : uint8_t(base + 37 * unsigned(std::min(geo(rng), 20)));  // spread: paired by rank
        }
        std::vector<uint8_t> enc(huffman_bound(n));
        size_t w = 0;
        kvcore::Status st = huffman_encode(src.data(), n, nullptr, enc.data(), enc.size(), &w, true, lanes);
        if (!st.is_ok()) return fail("encode", n, st);
        enc.resize(w);
        {
            auto in = exact_copy(enc);
            std::unique_ptr<uint8_t[]> out(new uint8_t[n ? n : 1]);
            st = huffman_decode(in.get(), w, out.get(), n);
            if (!st.is_ok()) return fail("round trip decode", n, st);
            if (n && std::memcmp(out.get(), src.data(), n) != 0) return fail("round trip mismatch", n, st);
            if (w > 0) {
                const size_t cap = rng() % w;
                std::unique_ptr<uint8_t[]> small(new uint8_t[cap ? cap : 1]);
                size_t w2 = 0;
                st = huffman_encode(src.data(), n, nullptr, cap ? small.get() : nullptr, cap, &w2, true, lanes);
                if (st.code != kvcore::Code::kBufferTooSmall) return fail("encode into a small capacity", n, st);
            }
        }
        std::vector<uint8_t> m = enc;
        if (!legacy.empty() && rng() % 3 == 0) {
            const Legacy& l = legacy[rng() % legacy.size()];
            auto in = exact_copy(l.stream);
            std::unique_ptr<uint8_t[]> out(new uint8_t[l.n ? l.n : 1]);
            st = huffman_decode(in.get(), l.stream.size(), out.get(), l.n);
            if (!st.is_ok()) return fail("legacy stream decode", l.n, st);
            m = l.stream;
            n = l.n;
        }
        switch (rng() % 6) {
            case 0:
                for (int f = 1 + int(rng() % 4); f > 0 && !m.empty(); --f) m[rng() % m.size()] ^= uint8_t(1u << (rng() % 8));
                break;
            case 1: m.resize(m.empty() ? 0 : rng() % m.size()); break;
            case 2:
                for (size_t k = rng() % 64; k > 0; --k) m.push_back(uint8_t(rng()));
                break;
            case 3:
                for (auto& c : m)
                    if (rng() % 16 == 0) c = uint8_t(rng());
                break;
            case 4:
                m.resize(rng() % 400);
                for (auto& c : m) c = uint8_t(rng());
                if (!m.empty()) m[0] = uint8_t(2 + rng() % 3);
                break;
            default:
                if (m.size() > 80) m[33 + rng() % 40] = uint8_t(rng());  // lengths and stream sizes
                break;
        }
        const size_t n2 = rng() % 4 == 0 ? rng() % 10000 : n;
        auto in = exact_copy(m);
        std::unique_ptr<uint8_t[]> out(new uint8_t[n2 ? n2 : 1]);
        st = huffman_decode(m.empty() ? nullptr : in.get(), m.size(), n2 ? out.get() : nullptr, n2);
        if (st.is_ok())
            ++decoded;
        else if (st.code == kvcore::Code::kCorruptFrame)
            ++corrupt;
        else
            return fail("mutated decode: unexpected status", n2, st);
    }
    std::printf("ok: %ld decoded, %ld corrupt\n", decoded, corrupt);
    return 0;
}
