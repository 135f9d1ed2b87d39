// Checks the AVX-512 fastcode group decoder and encoder (csrc/entropy/
// fastcode_avx512.cpp) against the group layout of fastcode_format.h, packed here
// from its text: every width, arbitrary and row-progressive tables, escape rates
// from none to all, and too few literals (both must return false). The merging
// decoder (a high byte plane decoded straight into 2-byte elements, rotated or
// not, cached or streaming stores) against elements put together here, and its
// XXH3 stripes against libxxhash's digest of the output. Runs on the real instructions
// where the CPU has AVX-512 (tests/test_fastcode.py), or compiled against
// emulated intrinsics (KVCORE_EMULATE_AVX512, test_shuffle_avx512_emulated.py).
// Prints "ok: N cases" and exits 0 when all match.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <xmmintrin.h>
#include <xxhash.h>

#include "avx512_native_only.h"
#include "checksum/xxh3_stripes.h"
#include "entropy/fastcode_format.h"

using namespace kvcore::entropy::fastcode_detail;

namespace {

// Packs the codes of one group (256 codes < 2^w) as the format describes: w = sum of
// components of c in {4, 2, 1} bits, largest first, at code offset o; symbol 32i + b
// puts its component bits in vector o + i / (8 / c), byte b, bits [c f, c f + c), f = i % (8 / c).
void pack_group(unsigned w, const uint8_t* codes, uint8_t* g) {
    std::memset(g, 0, 32 * w);
    unsigned o = 0;
    for (unsigned c = 4; c >= 1; c >>= 1) {
        if (!(w & c)) continue;
        const unsigned per = 8 / c;
        for (unsigned s = 0; s < kGroup; ++s) {
            const unsigned i = s / 32, b = s % 32, f = i % per;
            const unsigned field = (codes[s] >> o) & ((1u << c) - 1);
            g[32 * (o + i / per) + b] |= static_cast<uint8_t>(field << (c * f));
        }
        o += c;
    }
}

}  // namespace

int main() {
    if (skip_without_avx512()) return 0;
    std::mt19937 rng(5);
    size_t cases = 0;
    int bad = 0;
    const double escape_rates[] = {0.0, 0.01, 0.2, 1.0};
    for (unsigned w = 1; w <= kMaxWidth; ++w)
        for (bool rows : {false, true}) {
            if (rows && w < 5) continue;
            for (double rate : escape_rates)
                for (size_t groups : {size_t(0), size_t(1), size_t(7)}) {
                    const unsigned esc = (1u << w) - 1;
                    uint8_t table[128];
                    for (auto& t : table) t = static_cast<uint8_t>(rng());
                    if (rows)
                        for (unsigned c = 0; c < 128; ++c) table[c] = static_cast<uint8_t>(table[c & ~15u] + (c & 15));
                    std::vector<uint8_t> codes(groups * kGroup), packed(groups * 32 * w + 1), lit, want;
                    std::uniform_real_distribution<double> u(0, 1);
                    for (auto& c : codes) {
                        c = u(rng) < rate ? esc : static_cast<uint8_t>(rng() % esc);
                        if (c == esc) {
                            lit.push_back(static_cast<uint8_t>(rng()));
                            want.push_back(lit.back());
                        } else {
                            want.push_back(table[c]);
                        }
                    }
                    for (size_t g = 0; g < groups; ++g) pack_group(w, codes.data() + g * kGroup, packed.data() + g * 32 * w);
                    // Exactly sized literals (a heap copy), then the same with one too few.
                    for (int short_by : {0, 1}) {
                        if (short_by && lit.empty()) continue;
                        const size_t nexc = lit.size() - short_by;
                        std::vector<uint8_t> lits(lit.begin(), lit.begin() + nexc);
                        std::vector<uint8_t> got(groups * kGroup + 1, 0xEE);
                        uint64_t k = 0;
                        const bool ok = decode_groups_avx512(w, packed.data(), groups, table, lits.data(), nexc, &k,
                                                             got.data());
                        const bool right = short_by ? !ok
                                                    : ok && k == nexc && got.back() == 0xEE &&
                                                          (want.empty() || std::memcmp(got.data(), want.data(), want.size()) == 0);
                        ++cases;
                        if (!right && bad++ < 20)
                            std::printf("MISMATCH w=%u rows=%d rate=%g groups=%zu short_by=%d\n", w, rows, rate,
                                        groups, short_by);
                    }
                }
        }
    // The encoder: random bytes, a random code for each byte value (escaped at the given rate).
    for (unsigned w = 1; w <= kMaxWidth; ++w)
        for (double rate : escape_rates)
            for (size_t groups : {size_t(0), size_t(1), size_t(7)}) {
                const unsigned esc = (1u << w) - 1;
                std::uniform_real_distribution<double> u(0, 1);
                uint8_t code_of[256];
                for (auto& c : code_of) c = u(rng) < rate ? esc : static_cast<uint8_t>(rng() % esc);
                std::vector<uint8_t> src(groups * kGroup), codes(groups * kGroup), lit;
                for (size_t i = 0; i < src.size(); ++i) {
                    src[i] = static_cast<uint8_t>(rng());
                    codes[i] = code_of[src[i]];
                    if (codes[i] == esc) lit.push_back(src[i]);
                }
                std::vector<uint8_t> want(groups * 32 * w + 1);
                for (size_t g = 0; g < groups; ++g) pack_group(w, codes.data() + g * kGroup, want.data() + g * 32 * w);
                for (int short_by : {0, 1}) {
                    if (short_by && lit.empty()) continue;
                    const size_t nexc = lit.size() - short_by;
                    std::vector<uint8_t> got_lit(nexc + 1, 0xEE), got(groups * 32 * w + 1, 0);
                    uint64_t k = 0;
                    const bool ok = encode_groups_avx512(w, src.data(), groups, code_of, got_lit.data(), nexc, &k,
                                                         got.data());
                    const bool right = short_by ? !ok
                                                : ok && k == nexc && got == want && got_lit.back() == 0xEE &&
                                                      std::equal(lit.begin(), lit.end(), got_lit.begin());
                    ++cases;
                    if (!right && bad++ < 20)
                        std::printf("MISMATCH encoder w=%u rate=%g groups=%zu short_by=%d\n", w, rate, groups, short_by);
                }
            }
    // The merging decoder: random low bytes, 256 bytes more output after the groups (the
    // hash's last stripe is never fed by a kernel; XXH3's long path needs 241 bytes or
    // more), written from a 64-byte aligned buffer.
    for (unsigned w = 1; w <= kMaxWidth; ++w)
        for (double rate : escape_rates)
            for (size_t groups : {size_t(0), size_t(2), size_t(5)})
                for (bool rotate : {false, true})
                    for (bool streaming : {false, true}) {
                        const unsigned esc = (1u << w) - 1;
                        uint8_t table[128];
                        for (auto& t : table) t = static_cast<uint8_t>(rng());
                        std::uniform_real_distribution<double> u(0, 1);
                        const size_t n = groups * kGroup + 128;  // elements: the groups', then 128 more
                        std::vector<uint8_t> codes(groups * kGroup), packed(groups * 32 * w + 1), lit, low(n), want(2 * n);
                        for (auto& b : low) b = static_cast<uint8_t>(rng());
                        for (size_t i = 0; i < n; ++i) {
                            uint8_t high = static_cast<uint8_t>(rng());
                            if (i < codes.size()) {
                                codes[i] = u(rng) < rate ? esc : static_cast<uint8_t>(rng() % esc);
                                if (codes[i] == esc) lit.push_back(high);
                                else high = table[codes[i]];
                            }
                            uint16_t e = static_cast<uint16_t>(low[i] | high << 8);
                            if (rotate) e = static_cast<uint16_t>(e >> 1 | e << 15);
                            want[2 * i] = static_cast<uint8_t>(e);
                            want[2 * i + 1] = static_cast<uint8_t>(e >> 8);
                        }
                        for (size_t g = 0; g < groups; ++g)
                            pack_group(w, codes.data() + g * kGroup, packed.data() + g * 32 * w);
                        for (int short_by : {0, 1}) {
                            if (short_by && lit.empty()) continue;
                            const size_t nexc = lit.size() - short_by;
                            std::vector<uint8_t> lits(lit.begin(), lit.begin() + nexc);
                            // The output: the kernel's part, then the rest as the caller would write it.
                            std::vector<uint8_t> buf(2 * n + 64 + 1, 0xEE);
                            uint8_t* out = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
                            kvcore::Xxh3Stripes hash;
                            kvcore::xxh3_stripes_begin(&hash, 77, 2 * n);
                            uint64_t k = 0;
                            const bool ok = decode_groups_merged_avx512(w, rotate, streaming, packed.data(), groups,
                                                                        table, lits.data(), nexc, &k, low.data(), out,
                                                                        &hash);
                            if (streaming) _mm_sfence();
                            bool right = short_by ? !ok : ok && k == nexc && hash.fed == 8 * groups;
                            if (right && !short_by) {
                                std::memcpy(out + 2 * groups * kGroup, want.data() + 2 * groups * kGroup, 2 * n - 2 * groups * kGroup);
                                right = std::memcmp(out, want.data(), 2 * n) == 0 && out[2 * n] == 0xEE &&
                                        kvcore::xxh3_stripes_finish(&hash, out) == XXH3_64bits_withSeed(want.data(), 2 * n, 77);
                            }
                            ++cases;
                            if (!right && bad++ < 20)
                                std::printf("MISMATCH merged w=%u rate=%g groups=%zu rotate=%d streaming=%d short_by=%d\n",
                                            w, rate, groups, rotate, streaming, short_by);
                        }
                    }
    if (bad) {
        std::printf("%d of %zu cases mismatch\n", bad, cases);
        return 1;
    }
    std::printf("ok: %zu cases\n", cases);
    return 0;
}
