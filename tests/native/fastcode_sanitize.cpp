// Sanitizer check of the fastcode plane coder (tests/test_fastcode.py builds and
// runs it with -fsanitize=address,undefined): random round trips over every
// width and variant, then bit flips, truncations, edited headers and wrong
// symbol counts on exact-size heap copies, so any read or write out of bounds
// stops the run.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "entropy/fastcode.h"
#include "cpu/cpu_features.h"
using namespace kvcore;
// The variants run: portable, AVX2, and the widest the CPU has.
constexpr uint32_t kMasks[3] = {cpu::kIsaAvx2 | cpu::kIsaAvx512, cpu::kIsaAvx512, 0};
int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 4000;
    std::mt19937_64 rng(1);
    long ok = 0, bad = 0;
    for (int iter = 0; iter < iters; ++iter) {
        size_t n = rng() % 3000;
        if (iter % 50 == 0) n = 1 << 16;
        std::vector<uint8_t> x(n);
        std::geometric_distribution<int> g(0.2 + (rng() % 7) * 0.1);
        for (auto& v : x) v = uint8_t(100 + g(rng));
        unsigned w = rng() % 8;
        cpu::set_disabled_isa(kMasks[rng() % 3]);
        std::vector<uint8_t> s(entropy::fastcode_bound(n));
        size_t len = 0;
        Status st = entropy::fastcode_encode_width(x.data(), n, nullptr, w, s.data(), s.size(), &len);
        if (!st.is_ok()) { printf("encode failed %s\n", st.message.c_str()); return 1; }
        if (w == 0) {
            uint32_t hist[256] = {};
            for (uint8_t b : x) ++hist[b];
            unsigned ew = 0;
            size_t est = entropy::fastcode_estimate(hist, n, &ew);
            size_t len2 = 0;
            std::vector<uint8_t> s2(entropy::fastcode_bound(n));
            st = entropy::fastcode_encode(x.data(), n, hist, s2.data(), s2.size(), &len2);
            if (!st.is_ok() || est != len || len2 != len || (n && ew != s[0]) ||
                memcmp(s.data(), s2.data(), len)) { printf("estimate/hist mismatch\n"); return 1; }
            if (n) {
                // a wrong histogram (same total): refused, or a stream that still decodes to x
                ++hist[x[0]];
                --hist[uint8_t(x[0] + 1 + rng() % 255)];
                st = entropy::fastcode_encode(x.data(), n, hist, s2.data(), s2.size(), &len2);
                if (st.is_ok()) {
                    std::vector<uint8_t> in2(s2.begin(), s2.begin() + len2), out2(n);
                    st = entropy::fastcode_decode(in2.data(), len2, out2.data(), n);
                    if (!st.is_ok() || out2 != x) { printf("wrong histogram gave a bad stream\n"); return 1; }
                } else if (st.code != Code::kInvalidArgument && st.code != Code::kBufferTooSmall) {
                    printf("wrong histogram: unexpected status\n");
                    return 1;
                }
            }
        }
        {
            // estimated weights (a sample, scaled; sometimes nonsense): the stream must
            // still decode to x, or be refused as too large for an exact-size buffer
            uint32_t weights[256] = {};
            const int kind = int(rng() % 3);
            for (size_t i = 0; i < n; i += 8) weights[x[i]] += 8;
            if (kind == 1) for (auto& v : weights) v = uint32_t(rng() % 1000);
            if (kind == 2) { std::memset(weights, 0, sizeof weights); weights[uint8_t(rng())] = 1; }
            if (n == 0) weights[0] = 1;
            const size_t cap = (rng() & 1) ? entropy::fastcode_bound(n) : n;
            std::vector<uint8_t> s3(cap ? cap : 1);
            size_t len3 = 0;
            cpu::set_disabled_isa(kMasks[rng() % 3]);
            st = entropy::fastcode_encode_estimated(x.data(), n, weights, s3.data(), cap, &len3);
            if (st.is_ok()) {
                std::vector<uint8_t> in3(s3.begin(), s3.begin() + len3), out3(n);
                st = entropy::fastcode_decode(in3.data(), len3, out3.data(), n);
                if (!st.is_ok() || out3 != x) { printf("estimated weights gave a bad stream\n"); return 1; }
            } else if (st.code != Code::kBufferTooSmall) {
                printf("estimated weights: unexpected status %s\n", st.message.c_str());
                return 1;
            }
        }
        // exact-size heap copies so ASan sees any overread
        std::vector<uint8_t> in(s.begin(), s.begin() + len), out(n);
        cpu::set_disabled_isa(kMasks[rng() % 3]);
        st = entropy::fastcode_decode(in.data(), in.size(), out.data(), n);
        if (!st.is_ok() || out != x) { printf("round trip failed n=%zu w=%u\n", n, w); return 1; }
        for (int m = 0; m < 30; ++m) {
            std::vector<uint8_t> c(in);
            int kind = rng() % 4;
            if (kind == 0 && !c.empty()) c[rng() % c.size()] ^= uint8_t(1u << (rng() % 8));
            else if (kind == 1 && !c.empty()) c.resize(rng() % c.size());
            else if (kind == 2) for (int q = 0; q < 8 && !c.empty(); ++q) c[rng() % c.size()] = uint8_t(rng());
            else if (kind == 3 && c.size() > 2) { c[1] = uint8_t(rng() % 128); }
            std::vector<uint8_t> o(n);
            size_t nn = (rng() % 5 == 0) ? rng() % 3000 : n;
            o.resize(nn);
            std::vector<uint8_t> cc(c);  // exact size
            st = entropy::fastcode_decode(cc.empty() ? nullptr : cc.data(), cc.size(), o.empty() ? nullptr : o.data(), nn);
            (st.is_ok() ? ok : bad)++;
        }
    }
    // Well-formed headers over crafted bodies: all-escape codes and random codes,
    // with escape counts that make the decoder patch in its decoding pass.
    for (int iter = 0; iter < iters; ++iter) {
        const unsigned w = 1 + rng() % 7;
        const size_t n = 256 * (1 + rng() % 12) + rng() % 256;
        const size_t nexc = n / 64 + rng() % (n / 8);
        std::vector<uint8_t> s{uint8_t(w)};
        for (uint64_t v = nexc; ; v >>= 7) {
            s.push_back(uint8_t((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
            if (v < 0x80) break;
        }
        for (unsigned c = 0; c + 1 < (1u << w); ++c) s.push_back(uint8_t(rng()));
        const size_t body = nexc + (n / 256) * 32 * w + ((n % 256) * w + 7) / 8;
        const bool all_escapes = iter % 2;
        for (size_t i = 0; i < body; ++i) s.push_back(all_escapes ? 0xff : uint8_t(rng()));
        if (all_escapes && (n % 256) * w % 8) s.back() &= uint8_t(0xff >> (8 - (n % 256) * w % 8));
        std::vector<uint8_t> o(n);
        cpu::set_disabled_isa(kMasks[iter % 3]);
        const Status st = entropy::fastcode_decode(s.data(), s.size(), o.data(), n);
        if (all_escapes && st.is_ok()) { printf("all-escape stream accepted\n"); return 1; }
        (st.is_ok() ? ok : bad)++;
    }
    printf("ok %ld corrupt %ld\n", ok, bad);
}
