// Compares the AVX-512 shuffle variant, compiled against emulated intrinsics
// (KVCORE_EMULATE_AVX512), with the scalar reference: every element size,
// rotate on/off, residual periods and phases, sizes around the block edges,
// unaligned buffers, and merge(split(x)) == x; the split with streaming stores
// into planes at every offset in a cache line (the emulated streaming store
// traps on an unaligned address); the hashing merge with cached and with
// streaming stores; the hashing split after heads of several lengths (its
// stripes then out of step with its vectors), against the scalar split and a
// plain feed of the input's stripes. Exit status 0 when all match.
// Built and run by tests/test_shuffle_avx512_emulated.py.
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "checksum/xxh3_stripes.h"
#include "shuffle/shuffle_internal.h"
#include "stripe_feed_loop.h"

using namespace kvcore::shuffle;

int main() {
    std::mt19937 rng(1);
    int bad = 0, cases = 0;
    const size_t sizes[] = {0, 1, 31, 63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 1000, 4099, 100003};
    const std::pair<uint32_t, uint32_t> residuals[] = {{0, 0},   {1, 0},     {3, 2},         {32, 31},
                                                       {64, 1},  {384, 100}, {65536, 40000}, {200000, 199999}};
    for (unsigned es : {1u, 2u, 4u})
        for (size_t n : sizes)
            for (bool rot : {false, true})
                for (const auto& spec : residuals) {
                    const size_t off = 1 + cases % 3;  // unaligned source, planes and destination
                    std::vector<uint8_t> src(n * es + off), residual(spec.first ? spec.first : 1);
                    for (auto& b : src) b = static_cast<uint8_t>(rng());
                    for (auto& b : residual) b = static_cast<uint8_t>(rng());
                    PlaneTransform t;
                    t.rotate = rot;
                    if (spec.first) {
                        t.residual = residual.data();
                        t.period = spec.first;
                        t.phase = spec.second;
                    }
                    std::vector<std::vector<uint8_t>> want(es, std::vector<uint8_t>(n + off));
                    std::vector<std::vector<uint8_t>> got(es, std::vector<uint8_t>(n + off));
                    uint8_t* pw[4];
                    uint8_t* pg[4];
                    const uint8_t* pin[4];
                    for (unsigned p = 0; p < es; ++p) {
                        pw[p] = want[p].data() + off;
                        pg[p] = got[p].data() + off;
                        pin[p] = pg[p];
                    }
                    detail::split_scalar(src.data() + off, n, es, t, pw);
                    detail::split_avx512(src.data() + off, n, es, t, pg);
                    // Streamed: each plane at its own offset in a cache line, 0 (aligned) included.
                    std::vector<std::vector<uint8_t>> streamed(es, std::vector<uint8_t>(n + 128, 0));
                    uint8_t* ps[4];
                    for (unsigned p = 0; p < es; ++p) {
                        uint8_t* base = streamed[p].data();
                        base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
                        ps[p] = base + (cases * 11 + p * 23) % 64;
                    }
                    detail::split_streamed_avx512(src.data() + off, n, es, t, ps);
                    bool streamed_ok = true;
                    for (unsigned p = 0; p < es; ++p) streamed_ok &= std::memcmp(ps[p], pw[p], n) == 0;
                    std::vector<uint8_t> back(n * es + off, 0);
                    detail::merge_avx512(pin, n, es, t, back.data() + off);
                    ++cases;
                    const bool split_ok = want == got && streamed_ok;
                    const bool merge_ok = std::memcmp(back.data() + off, src.data() + off, n * es) == 0;
                    if ((!split_ok || !merge_ok) && bad++ < 20)
                        std::printf("MISMATCH elem_size=%u n=%zu rotate=%d period=%u phase=%u split=%s merge=%s\n", es,
                                    n, rot, spec.first, spec.second, split_ok ? "ok" : "BAD", merge_ok ? "ok" : "BAD");
                }
    // The hashing merge, with cached and with streaming stores into a 64-byte aligned
    // output: both must restore the input and feed the checksum the same stripes.
    for (unsigned es : {1u, 2u, 4u})
        for (size_t n : {size_t(4096), size_t(65536)})
            for (bool rot : {false, true}) {
                std::vector<uint8_t> src(n * es);
                for (auto& b : src) b = static_cast<uint8_t>(rng());
                PlaneTransform t;
                t.rotate = rot;
                std::vector<std::vector<uint8_t>> plane(es, std::vector<uint8_t>(n));
                uint8_t* pp[4];
                const uint8_t* pin[4];
                for (unsigned p = 0; p < es; ++p) pin[p] = pp[p] = plane[p].data();
                detail::split_scalar(src.data(), n, es, t, pp);
                std::vector<uint8_t> out[2];
                kvcore::Xxh3Stripes hash[2] = {};
                for (int streaming = 0; streaming < 2; ++streaming) {
                    out[streaming].assign(n * es + 64, 0);
                    uint8_t* dst = out[streaming].data() + (64 - reinterpret_cast<uintptr_t>(out[streaming].data()) % 64) % 64;
                    hash[streaming].len = n * es;
                    detail::merge_hashed_avx512(pin, n, es, t, dst, &hash[streaming], streaming == 1);
                    ++cases;
                    if (std::memcmp(dst, src.data(), n * es) != 0 && bad++ < 20)
                        std::printf("MISMATCH hashed merge elem_size=%u n=%zu rotate=%d streaming=%d\n", es, n, rot,
                                    streaming);
                }
                if ((hash[0].fed != hash[1].fed || std::memcmp(hash[0].acc, hash[1].acc, sizeof hash[0].acc) != 0) &&
                    bad++ < 20)
                    std::printf("MISMATCH hashed merge elem_size=%u n=%zu: streaming fed other stripes\n", es, n);
            }
    // The hashing split, as shuffle::split_hashed runs it: `head` elements split
    // first, the kernel from there feeding the stripes of the whole input.
    for (unsigned es : {1u, 2u, 4u})
        for (size_t n : {size_t(4096), size_t(65553), size_t(100003)})
            for (bool rot : {false, true})
                for (size_t head : {size_t(0), size_t(5), size_t(63)}) {
                    std::vector<uint8_t> src(n * es), residual(384);
                    for (auto& b : src) b = static_cast<uint8_t>(rng());
                    for (auto& b : residual) b = static_cast<uint8_t>(rng());
                    PlaneTransform t;
                    t.rotate = rot;
                    if (head == 5) t.residual = residual.data(), t.period = 384, t.phase = 100;
                    std::vector<std::vector<uint8_t>> want(es, std::vector<uint8_t>(n)), got(es, std::vector<uint8_t>(n));
                    uint8_t* pw[4];
                    uint8_t* pg[4];
                    uint8_t* rest[4];
                    for (unsigned p = 0; p < es; ++p) pw[p] = want[p].data(), pg[p] = got[p].data(), rest[p] = pg[p] + head;
                    detail::split_scalar(src.data(), n, es, t, pw);
                    kvcore::Xxh3Stripes hash = {}, reference = {};
                    hash.len = reference.len = n * es;
                    detail::split_scalar(src.data(), head, es, t, pg);
                    const PlaneTransform rt = detail::tail_transform(t, head);
                    const uint8_t* from = src.data() + head * es;
                    const size_t done = detail::split_hashed_avx512(from, n - head, es, rt, rest, src.data(), &hash);
                    detail::split_rest(from, n - head, done, es, rt, rest);
                    feed_stripes_avx512(&reference, src.data(), hash.fed);
                    ++cases;
                    const bool fed_ok = hash.fed > 0 && hash.fed <= hash.regular() &&
                                        hash.fed == uint64_t(done) * es / 64 &&
                                        std::memcmp(hash.acc, reference.acc, sizeof hash.acc) == 0;
                    if ((want != got || !fed_ok) && bad++ < 20)
                        std::printf("MISMATCH hashed split elem_size=%u n=%zu rotate=%d head=%zu: planes %s, stripes %s\n",
                                    es, n, rot, head, want == got ? "ok" : "BAD", fed_ok ? "ok" : "BAD");
                }
    std::printf("avx512 (emulated) vs scalar: %d cases, %d mismatches\n", cases, bad);
    return bad == 0 ? 0 : 1;
}
