// Checks shuffle/low_bits.h against the packing written out bit by bit from its
// specification (docs/FORMAT.md, method 8), for every k, plane lengths around
// the 64-element groups, and unaligned buffers; then that join_low_bits refuses
// symbols wider than 8 - k and nonzero padding, and that expand_low_bits (the
// packed method's decoder, method 10) puts the same bits at any shift over any
// base and refuses nonzero padding too. Every variant: the portable
// one and the widest the CPU has (under ASan + UBSan, tests/test_low_bits.py), or
// the AVX-512 split, pack, join and expand compiled against emulated intrinsics (KVCORE_EMULATE_AVX512,
// test_shuffle_avx512_emulated.py). Usage: low_bits_check <seed>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "shuffle/low_bits.h"

namespace {

// The join under test: the dispatcher, or the AVX-512 groups called directly
// (the last partial group then through the portable join, as the dispatcher does).
bool (*join_low_bits)(uint8_t*, size_t, unsigned, const uint8_t*) = kvcore::shuffle::join_low_bits;

bool join_avx512_direct(uint8_t* plane, size_t n, unsigned k, const uint8_t* packed) {
    const size_t groups = n / 64;
    const bool ok = kvcore::shuffle::detail::join_low_bits_groups_avx512(plane, groups, k, packed);
    kvcore::cpu::set_disabled_isa(kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512);
    const bool tail = kvcore::shuffle::join_low_bits(plane + 64 * groups, n - 64 * groups, k, packed + 8 * k * groups);
    kvcore::cpu::set_disabled_isa(0);
    return ok && tail;
}
bool (*expand_low_bits)(const uint8_t*, size_t, unsigned, unsigned, uint8_t, uint8_t*) =
    kvcore::shuffle::expand_low_bits;

bool expand_avx512_direct(const uint8_t* packed, size_t n, unsigned k, unsigned shift, uint8_t base, uint8_t* plane) {
    const size_t groups = n / 64;
    kvcore::shuffle::detail::expand_low_bits_groups_avx512(plane, groups, k, packed, shift, base);
    kvcore::cpu::set_disabled_isa(kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512);
    const bool tail = kvcore::shuffle::expand_low_bits(packed + 8 * k * groups, n - 64 * groups, k, shift, base,
                                                      plane + 64 * groups);
    kvcore::cpu::set_disabled_isa(0);
    return tail;
}
// The split under test: the dispatcher, or the AVX-512 groups called directly (the last
// partial group through the portable split); pack_bits likewise.
void (*split_low_bits)(const uint8_t*, size_t, unsigned, uint8_t*, uint8_t*) = kvcore::shuffle::split_low_bits;
void (*pack_bits)(const uint8_t*, size_t, unsigned, unsigned, uint8_t*) = kvcore::shuffle::pack_bits;

void split_avx512_direct(const uint8_t* src, size_t n, unsigned k, uint8_t* high, uint8_t* packed) {
    const size_t groups = n / 64;
    kvcore::shuffle::detail::split_low_bits_groups_avx512(src, groups, k, 0, high, packed);
    kvcore::cpu::set_disabled_isa(kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512);
    kvcore::shuffle::split_low_bits(src + 64 * groups, n - 64 * groups, k, high + 64 * groups, packed + 8 * k * groups);
    kvcore::cpu::set_disabled_isa(0);
}
void pack_avx512_direct(const uint8_t* src, size_t n, unsigned k, unsigned from, uint8_t* packed) {
    const size_t groups = n / 64;
    kvcore::shuffle::detail::split_low_bits_groups_avx512(src, groups, k, from, nullptr, packed);
    kvcore::cpu::set_disabled_isa(kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512);
    kvcore::shuffle::pack_bits(src + 64 * groups, n - 64 * groups, k, from, packed + 8 * k * groups);
    kvcore::cpu::set_disabled_isa(0);
}
using kvcore::shuffle::low_bits_packed_size;

int failures = 0;

void check(bool ok, const char* what, unsigned k, size_t n) {
    if (!ok && failures++ < 20) std::printf("FAIL %s (k=%u n=%zu)\n", what, k, n);
}

// Bit t of element i's low bits, as the specification places it.
size_t spec_bit_position(size_t i, unsigned k, unsigned t) {
    const size_t g = i / 64, p = (i % 64) / 8, b = i % 8;
    const size_t column_bit = k * p + t;  // bit of C_b
    const size_t word = g * k + column_bit / 8;
    return 8 * (8 * word + b) + column_bit % 8;  // bit index in the packed stream
}

std::vector<uint8_t> spec_pack(const std::vector<uint8_t>& src, unsigned k) {
    std::vector<uint8_t> packed(low_bits_packed_size(src.size(), k), 0);
    for (size_t i = 0; i < src.size(); ++i)
        for (unsigned t = 0; t < k; ++t)
            if (src[i] >> t & 1) {
                const size_t bit = spec_bit_position(i, k, t);
                packed[bit / 8] = static_cast<uint8_t>(packed[bit / 8] | 1u << (bit % 8));
            }
    return packed;
}

}  // namespace

int main(int argc, char** argv) {
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
    const size_t lengths[] = {0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 200, 511, 1000, 4096, 4097, 70001};
    size_t cases = 0;
#ifdef KVCORE_EMULATE_AVX512
    join_low_bits = join_avx512_direct;
    expand_low_bits = expand_avx512_direct;
    split_low_bits = split_avx512_direct;
    pack_bits = pack_avx512_direct;
    const uint32_t masks[] = {0};
#else
    const uint32_t masks[] = {kvcore::cpu::kIsaAvx2 | kvcore::cpu::kIsaAvx512, 0};  // portable, widest
#endif
    for (const uint32_t mask : masks)
    for (unsigned k = 1; k <= 7; ++k) {
        kvcore::cpu::set_disabled_isa(mask);
        check(low_bits_packed_size(64, k) == 8 * k && low_bits_packed_size(65, k) == 16 * k, "packed size", k, 65);
        for (const size_t n : lengths) {
            for (const size_t shift : {0, 1, 3}) {  // unaligned starts
                std::vector<uint8_t> buf(n + shift + 1), high(n + shift), packed_buf(low_bits_packed_size(n, k) + 5);
                for (auto& b : buf) b = static_cast<uint8_t>(rng());
                const std::vector<uint8_t> src(buf.begin() + shift, buf.begin() + shift + n);
                uint8_t* packed = packed_buf.data() + shift;
                split_low_bits(buf.data() + shift, n, k, high.data() + shift, packed);
                const std::vector<uint8_t> want = spec_pack(src, k);
                bool same = true;
                for (size_t j = 0; j < want.size(); ++j) same = same && packed[j] == want[j];
                check(same, "packed bits differ from the specification", k, n);
                for (size_t i = 0; i < n; ++i) same = same && high[shift + i] == src[i] >> k;
                check(same, "high bits", k, n);

                check(join_low_bits(high.data() + shift, n, k, packed), "join refused a valid plane", k, n);
                for (size_t i = 0; i < n; ++i) same = same && high[shift + i] == src[i];
                check(same, "join does not restore the plane", k, n);

                // In place (high == src), as the decoder and encoder may use it.
                std::vector<uint8_t> again = src;
                split_low_bits(again.data(), n, k, again.data(), packed);
                check(join_low_bits(again.data(), n, k, packed) && again == src, "in-place round trip", k, n);

                if (n > 0) {
                    std::vector<uint8_t> wide(n);
                    for (size_t i = 0; i < n; ++i) wide[i] = static_cast<uint8_t>(src[i] >> k);
                    wide[rng() % n] |= static_cast<uint8_t>(0x80);
                    check(!join_low_bits(wide.data(), n, k, packed), "a symbol wider than 8 - k was accepted", k, n);
                }
                // Expand: the low bits alone, shifted over a base (anything: it is OR-ed in).
                const unsigned to = static_cast<unsigned>(rng() % (9 - k));
                // pack_bits: bits [to, to + k) of each byte, packed as the low bits are.
                {
                    std::vector<uint8_t> moved(n), alone(low_bits_packed_size(n, k) + 1, 0x5A);
                    for (size_t i = 0; i < n; ++i) moved[i] = static_cast<uint8_t>(src[i] >> to);
                    pack_bits(src.data(), n, k, to, alone.data());
                    const std::vector<uint8_t> spec = spec_pack(moved, k);
                    bool packed_same = alone.back() == 0x5A;
                    for (size_t j = 0; j < spec.size(); ++j) packed_same = packed_same && alone[j] == spec[j];
                    check(packed_same, "pack_bits differs from the specification", k, n);
                }
                const uint8_t base = static_cast<uint8_t>(rng());
                std::vector<uint8_t> expanded(n + shift + 1, 0xA5);
                check(expand_low_bits(packed, n, k, to, base, expanded.data() + shift), "expand refused a valid packing",
                      k, n);
                for (size_t i = 0; i < n; ++i)
                    same = same && expanded[shift + i] == static_cast<uint8_t>(base | (src[i] & ((1u << k) - 1)) << to);
                check(same, "expand does not give base | low bits << shift", k, n);
                check(expanded[shift + n] == 0xA5 && (shift == 0 || expanded[0] == 0xA5), "expand wrote outside the plane",
                      k, n);

                if (n % 64 != 0) {  // set one padding bit of the last group
                    const size_t pad = n + rng() % (64 - n % 64);
                    const size_t bit = spec_bit_position(pad, k, static_cast<unsigned>(rng() % k));
                    std::vector<uint8_t> bad(want);
                    bad[bit / 8] = static_cast<uint8_t>(bad[bit / 8] | 1u << (bit % 8));
                    std::vector<uint8_t> plane(n);
                    for (size_t i = 0; i < n; ++i) plane[i] = static_cast<uint8_t>(src[i] >> k);
                    check(!join_low_bits(plane.data(), n, k, bad.data()), "nonzero padding was accepted", k, n);
                    check(!expand_low_bits(bad.data(), n, k, to, base, plane.data()), "expand accepted nonzero padding",
                          k, n);
                }
                ++cases;
            }
        }
    }
    if (failures) {
        std::printf("%d failures\n", failures);
        return 1;
    }
    std::printf("ok: %zu cases\n", cases);
    return 0;
}
