// Checks shuffle::split_hashed, the split that feeds the block checksum the
// input's stripes as it reads them (what compress does to every block), against
// the scalar split and libxxhash's XXH3_64bits_withSeed: element sizes 1, 2 and
// 4; lengths from XXH3's first long input (241 bytes) through the sizes where
// the split starts peeling elements to align its stores (4096 elements) to
// whole blocks; every transform (rotate, residuals of several periods and
// phases); planes at one offset in their cache lines (peeled, the stripes then
// not in step with the kernel's vectors) or at different ones (not peeled); a
// source at any alignment, in a buffer of its exact size (ASan sees a read past
// it). The digest is xxh3_stripes_finish where stripes were fed, else the
// library's, as in encode_block. A third of the rounds mask AVX-512 off and a
// third AVX2 too: without AVX-512 split_hashed must decline (return false; the
// AVX2 and portable splits leave the checksum to its own pass).
// Usage: split_hashed_check SEED ROUNDS
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <xxhash.h>

#include "checksum/xxh3_stripes.h"
#include "common/aligned_buffer.h"
#include "cpu/cpu_features.h"
#include "shuffle/shuffle.h"
#include "shuffle/shuffle_internal.h"

namespace sh = kvcore::shuffle;

int main(int argc, char** argv) {
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
    const long rounds = argc > 2 ? std::strtol(argv[2], nullptr, 10) : 200;
    namespace cpu = kvcore::cpu;
    const uint32_t masks[] = {0, cpu::kIsaAvx512, cpu::kIsaAvx2 | cpu::kIsaAvx512};
    const size_t lengths[] = {241, 255, 256, 257, 1000, 4095, 4096, 4097, 4160, 8191, 65535, 65536, 65537, 262144};
    long checks = 0, fed = 0, bad = 0;
    for (long round = 0; round < rounds; ++round) {
        const unsigned es = 1u << (rng() % 3);
        const size_t bytes = rng() % 3 == 0 ? 241 + rng() % 300000 : lengths[rng() % (sizeof lengths / sizeof *lengths)];
        const size_t n = (bytes + es - 1) / es;
        const size_t src_off = rng() % 64;
        std::vector<uint8_t> src_buf(src_off + n * es);
        for (auto& b : src_buf) b = uint8_t(rng());
        const uint8_t* src = src_buf.data() + src_off;
        std::vector<uint8_t> residual(1 + rng() % 1024);
        for (auto& b : residual) b = uint8_t(rng());
        sh::PlaneTransform t;
        t.rotate = rng() % 2 == 0;
        if (rng() % 2 == 0) {
            t.residual = residual.data();
            t.period = static_cast<uint32_t>(residual.size());
            t.phase = static_cast<uint32_t>(rng() % t.period);
        }
        // Planes in one aligned buffer each; one offset for all (peeled) or one each.
        const bool same_offset = rng() % 2 == 0;
        const size_t common = rng() % 64;
        std::vector<kvcore::AlignedBuffer> want_buf(es), got_buf(es);
        uint8_t* want[4];
        uint8_t* got[4];
        for (unsigned p = 0; p < es; ++p) {
            const size_t off = same_offset ? common : rng() % 64;
            want_buf[p].ensure(n + 64);
            got_buf[p].ensure(n + 64);
            want[p] = want_buf[p].data() + off;
            got[p] = got_buf[p].data() + off;
        }
        sh::detail::split_scalar(src, n, es, t, want);
        kvcore::Xxh3Stripes hash;
        const uint64_t seed = rng() % 4 == 0 ? 0 : rng();
        kvcore::xxh3_stripes_begin(&hash, seed, n * es);
        cpu::set_disabled_isa(masks[round % 3]);
        const bool avx512 = (cpu::active_isa() & cpu::kIsaAvx512) != 0;
        const bool split = sh::split_hashed(src, n, es, t, got, &hash);
        cpu::set_disabled_isa(0);
        ++checks;
        if (split != avx512) {
            if (bad++ < 5) std::printf("split_hashed returned %d %s AVX-512\n", split, avx512 ? "with" : "without");
            continue;
        }
        if (!split) continue;
        bool planes_ok = true;
        for (unsigned p = 0; p < es; ++p) planes_ok &= std::memcmp(want[p], got[p], n) == 0;
        const uint64_t library = XXH3_64bits_withSeed(src, n * es, seed);
        if (hash.fed > 0) ++fed;
        const uint64_t digest = hash.fed > 0 ? kvcore::xxh3_stripes_finish(&hash, src) : library;
        if ((!planes_ok || digest != library) && bad++ < 5)
            std::printf("elem_size %u, n %zu, rotate %d, period %u, phase %u, offsets %s: planes %s, digest %016llx, "
                        "library %016llx (%llu stripes fed)\n",
                        es, n, t.rotate, t.period, t.phase, same_offset ? "one" : "several",
                        planes_ok ? "ok" : "DIFFER", (unsigned long long)digest, (unsigned long long)library,
                        (unsigned long long)hash.fed);
    }
    std::printf("%s: %ld splits (%ld fed the checksum), %ld mismatches\n", bad ? "FAIL" : "ok", checks, fed, bad);
    return bad ? 1 : 0;
}
