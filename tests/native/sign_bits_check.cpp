// Checks shuffle/sign_bits.h against its three parts written out bit by bit from
// the specification (docs/FORMAT.md, method 9), for row counts around multiples
// of 8, channel counts around multiples of 8 and plane lengths around multiples
// of 8 bytes, on planes whose bit 0 leans by channel and on uniform bytes; then
// that join_sign_bits refuses every unused bit set. Every mantissa packing:
// AVX-512 and BMI2 where the CPU has them and the portable one (the ISA masked),
// each joined with every other; and the AVX-512 groups called directly where the
// CPU has AVX-512 or when compiled against emulated intrinsics
// (KVCORE_EMULATE_AVX512, test_shuffle_avx512_emulated.py). Run under ASan +
// UBSan by tests/test_sign_bits.py. Usage: sign_bits_check <seed>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "shuffle/sign_bits.h"

namespace {

using namespace kvcore::shuffle;
using Bytes = std::vector<uint8_t>;

int failures = 0;

void check(bool ok, const char* what, size_t rows, uint32_t channels) {
    if (!ok && failures++ < 20) std::printf("FAIL %s (rows=%zu channels=%u)\n", what, rows, channels);
}

void set_bit(Bytes& b, size_t bit) { b[bit / 8] = static_cast<uint8_t>(b[bit / 8] | 1u << (bit % 8)); }

struct Parts {
    Bytes mantissa, flips, signs;
};

Parts spec_split(const Bytes& plane, size_t rows, uint32_t channels) {
    Parts p{Bytes(sign_bits_mantissa_size(plane.size()), 0), Bytes(sign_bits_flips_size(channels), 0),
            Bytes(sign_bits_signs_size(rows, channels), 0)};
    for (size_t i = 0; i < plane.size(); ++i)
        for (unsigned j = 0; j < 7; ++j)
            if (plane[i] >> (j + 1) & 1) set_bit(p.mantissa, 7 * i + j);
    for (uint32_t c = 0; c < channels; ++c) {
        size_t ones = 0;
        for (size_t r = 0; r < rows; ++r) ones += plane[r * channels + c] & 1u;
        const unsigned flip = 2 * ones > rows ? 1 : 0;
        if (flip) set_bit(p.flips, c);
        for (size_t r = 0; r < rows; ++r)
            if (((plane[r * channels + c] & 1u) ^ flip) != 0) set_bit(p.signs, 8 * ((r / 8) * channels + c) + r % 8);
    }
    return p;
}

Bytes make_plane(std::mt19937_64& rng, size_t rows, uint32_t channels, bool leaning) {
    Bytes plane(rows * channels);
    std::vector<double> p_one(channels);
    for (auto& p : p_one) p = leaning ? std::uniform_real_distribution<double>(0.0, 1.0)(rng) : 0.5;
    for (size_t r = 0; r < rows; ++r)
        for (uint32_t c = 0; c < channels; ++c) {
            const uint8_t mant = static_cast<uint8_t>(rng() & 0xFE);
            const bool one = std::bernoulli_distribution(p_one[c])(rng);
            plane[r * channels + c] = static_cast<uint8_t>(mant | (one ? 1 : 0));
        }
    return plane;
}

Parts split_with(const Bytes& plane, size_t rows, uint32_t channels, unsigned disabled) {
    kvcore::cpu::set_disabled_isa(disabled);
    Parts p{Bytes(sign_bits_mantissa_size(plane.size())), Bytes(sign_bits_flips_size(channels)),
            Bytes(sign_bits_signs_size(rows, channels))};
    split_sign_bits(plane.data(), rows, channels, p.mantissa.data(), p.flips.data(), p.signs.data());
    kvcore::cpu::set_disabled_isa(0);
    return p;
}

bool join_with(const Parts& p, size_t rows, uint32_t channels, unsigned disabled, Bytes* out) {
    kvcore::cpu::set_disabled_isa(disabled);
    out->assign(rows * channels, 0xA5);
    const bool ok = join_sign_bits(p.mantissa.data(), p.flips.data(), p.signs.data(), rows, channels, out->data());
    kvcore::cpu::set_disabled_isa(0);
    return ok;
}

// Every bit a valid stream leaves 0, set one at a time, must make the join refuse.
void check_unused_bits(const Parts& valid, size_t rows, uint32_t channels) {
    const size_t n = rows * channels;
    Bytes out;
    for (size_t bit = 7 * n; bit < 8 * valid.mantissa.size(); ++bit) {
        Parts p = valid;
        set_bit(p.mantissa, bit);
        check(!join_with(p, rows, channels, 0, &out), "a mantissa padding bit was accepted", rows, channels);
    }
    for (size_t bit = channels; bit < 8 * valid.flips.size(); ++bit) {
        Parts p = valid;
        set_bit(p.flips, bit);
        check(!join_with(p, rows, channels, 0, &out), "a flips padding bit was accepted", rows, channels);
    }
    if (rows % 8) {
        const size_t g = rows / 8;
        for (uint32_t c = 0; c < channels; c += 1 + channels / 4)
            for (unsigned k = unsigned(rows % 8); k < 8; ++k) {
                Parts p = valid;
                set_bit(p.signs, 8 * (g * channels + c) + k);
                check(!join_with(p, rows, channels, 0, &out), "a signs padding bit was accepted", rows, channels);
            }
    }
}

// The AVX-512 groups alone against the specification's stream, both ways.
void check_avx512_groups(const Bytes& plane, const Parts& spec, size_t rows, uint32_t channels) {
    const size_t groups = plane.size() / 64;
    if (groups == 0) return;
    Bytes packed(56 * groups), back(64 * groups);
    detail::pack_mantissa_groups_avx512(plane.data(), groups, packed.data());
    check(Bytes(spec.mantissa.begin(), spec.mantissa.begin() + 56 * groups) == packed,
          "the AVX-512 packing differs from the specification", rows, channels);
    detail::unpack_mantissa_groups_avx512(packed.data(), groups, back.data());
    bool same = true;
    for (size_t i = 0; i < back.size(); ++i) same &= back[i] == (plane[i] & 0xFE);
    check(same, "the AVX-512 unpacking did not give the mantissa bits back", rows, channels);
}

}  // namespace

int main(int argc, char** argv) {
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
    const unsigned all = kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512;
#ifdef KVCORE_EMULATE_AVX512
    const bool avx512_groups = true;
#else
    const bool avx512_groups = (kvcore::cpu::detected_isa() & kvcore::cpu::kIsaAvx512) != 0;
#endif
    const unsigned variants[] = {0u, kvcore::cpu::kIsaAvx512, all};  // widest, AVX2 + BMI2, portable
    size_t cases = 0;
    for (size_t rows : {1, 2, 7, 8, 9, 15, 16, 63, 64, 65, 200, 1001})
        for (uint32_t channels : {1u, 2u, 3u, 7u, 8u, 9u, 21u, 32u, 33u, 384u})
            for (bool leaning : {true, false}) {
                const Bytes plane = make_plane(rng, rows, channels, leaning);
                const Parts spec = spec_split(plane, rows, channels);
                if (avx512_groups) check_avx512_groups(plane, spec, rows, channels);
                for (unsigned disabled : variants) {
                    const Parts got = split_with(plane, rows, channels, disabled);
                    check(got.mantissa == spec.mantissa, "mantissa differs from the specification", rows, channels);
                    check(got.flips == spec.flips, "flips differ from the specification", rows, channels);
                    check(got.signs == spec.signs, "signs differ from the specification", rows, channels);
                    for (unsigned join_disabled : variants) {
                        Bytes back;
                        check(join_with(got, rows, channels, join_disabled, &back), "a valid stream was refused", rows,
                              channels);
                        check(back == plane, "the join did not give the plane back", rows, channels);
                    }
                }
                check_unused_bits(spec, rows, channels);
                ++cases;
            }
    if (failures) {
        std::printf("%d failures\n", failures);
        return 1;
    }
    std::printf("ok: %zu planes\n", cases);
    return 0;
}
