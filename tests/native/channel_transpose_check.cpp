// Checks the channel transposes (csrc/shuffle/channel_transpose) against the
// scalar reference: every ISA variant the CPU has (dispatch with features
// masked), and the AVX-512 tall tiles called directly where the CPU has
// AVX-512 or where they are compiled against emulated intrinsics
// (KVCORE_EMULATE_AVX512), and the portable tiles that CPUs other than x86-64
// dispatch to, called directly. Shapes cover channel counts around the tile widths
// and the tall-tile limits, row counts around 16 / 32 / 64, streams in a
// shuffled order at unaligned offsets, and bytes either side of every output
// (left untouched). Prints "ok: N cases" and exits 0 when all match.
// Built and run by tests/test_channel_transpose.py and test_shuffle_avx512_emulated.py.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/arch.h"
#include "cpu/cpu_features.h"
#include "shuffle/channel_transpose.h"

using namespace kvcore;

namespace {

constexpr uint8_t kGuard = 0xA5;  // bytes around every output
constexpr size_t kPad = 3;        // guard bytes before and after each output, and the misalignment

struct Streams {
    std::vector<uint8_t> buf;  // kPad guard, then each stream followed by kPad guard bytes
    std::vector<uint8_t*> column;
};

// Streams of `rows` bytes per channel, laid out in a random channel order.
Streams make_streams(size_t rows, uint32_t channels, std::mt19937& rng) {
    Streams s;
    std::vector<uint32_t> order(channels);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    s.buf.assign(kPad + size_t(channels) * (rows + kPad), kGuard);
    s.column.resize(channels);
    for (uint32_t i = 0; i < channels; ++i) s.column[order[i]] = s.buf.data() + kPad + size_t(i) * (rows + kPad);
    return s;
}

bool guards_intact(const std::vector<uint8_t>& buf, size_t rows, uint32_t channels) {
    for (size_t i = 0; i < kPad; ++i)
        if (buf[i] != kGuard) return false;
    for (uint32_t c = 0; c < channels; ++c)
        for (size_t i = 0; i < kPad; ++i)
            if (buf[kPad + size_t(c) * (rows + kPad) + rows + i] != kGuard) return false;
    return true;
}

using ToColumns = size_t (*)(const uint8_t*, size_t, uint32_t, uint8_t* const*);
using ToRows = size_t (*)(const uint8_t* const*, size_t, uint32_t, uint8_t*);

// One shape through one variant. tiles_cm / tiles_rm: call those tiles directly
// (the AVX-512 tall tiles, or the portable ones wrapped to report whole planes),
// which must do rows [0, rows_done) of channels [0, channels_done) (the rest is
// filled from the reference), else the dispatcher.
bool check(size_t rows, uint32_t channels, std::mt19937& rng, ToColumns tiles_cm, ToRows tiles_rm,
           size_t rows_done = 0, uint32_t channels_done = 0) {
    const size_t n = rows * channels;
    std::vector<uint8_t> plane(kPad + n + kPad);
    for (auto& b : plane) b = static_cast<uint8_t>(rng());
    const uint8_t* src = plane.data() + kPad;

    Streams want = make_streams(rows, channels, rng), got = want;
    for (uint32_t c = 0; c < channels; ++c) got.column[c] = got.buf.data() + (want.column[c] - want.buf.data());
    shuffle::detail::to_channel_major_scalar(src, rows, channels, want.column.data());
    if (tiles_cm) {
        if (tiles_cm(src, rows, channels, got.column.data()) != rows_done) return false;
        for (size_t r = 0; r < rows; ++r)  // what the tiles leave
            for (uint32_t c = 0; c < channels; ++c)
                if (r >= rows_done || c >= channels_done) got.column[c][r] = src[r * channels + c];
    } else {
        shuffle::to_channel_major(src, rows, channels, got.column.data());
    }
    if (got.buf != want.buf || !guards_intact(got.buf, rows, channels)) return false;

    std::vector<const uint8_t*> from(want.column.begin(), want.column.end());
    std::vector<uint8_t> back(kPad + n + kPad, kGuard);
    uint8_t* dst = back.data() + kPad;
    if (tiles_rm) {
        if (tiles_rm(from.data(), rows, channels, dst) != rows_done) return false;
        for (size_t r = 0; r < rows; ++r)
            for (uint32_t c = 0; c < channels; ++c)
                if (r >= rows_done || c >= channels_done) dst[r * channels + c] = from[c][r];
    } else {
        shuffle::to_row_major(from.data(), rows, channels, dst);
    }
    if (std::memcmp(dst, src, n) != 0) return false;
    for (size_t i = 0; i < kPad; ++i)
        if (back[i] != kGuard || back[kPad + n + i] != kGuard) return false;
    return true;
}

// The portable tiles, as whole-plane variants of the tiles' signature.
size_t tiled_to_columns(const uint8_t* plane, size_t rows, uint32_t channels, uint8_t* const* column) {
    shuffle::detail::to_channel_major_tiled(plane, rows, channels, column);
    return rows;
}
size_t tiled_to_rows(const uint8_t* const* column, size_t rows, uint32_t channels, uint8_t* plane) {
    shuffle::detail::to_row_major_tiled(column, rows, channels, plane);
    return rows;
}

}  // namespace

int main() {
    std::mt19937 rng(7);
    const uint32_t channel_counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 128,
                                       255, 384, 385, 400, 512, 513, 1024};
    const size_t row_counts[] = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 1000};
    struct Variant {
        const char* name;
        uint32_t disabled;  // ISA mask for the dispatcher
        bool direct_tall;   // call the AVX-512 tall tiles directly instead
    };
    std::vector<Variant> variants;
#ifndef KVCORE_EMULATE_AVX512
    variants.push_back({"scalar", cpu::kIsaAvx2 | cpu::kIsaAvx512, false});
    if (cpu::detected_isa() & cpu::kIsaAvx2) variants.push_back({"avx2", cpu::kIsaAvx512, false});
    if (cpu::detected_isa() & cpu::kIsaAvx512) variants.push_back({"avx512", 0, false});
    if (cpu::detected_isa() & cpu::kIsaAvx512) variants.push_back({"avx512 tall tiles", 0, true});
#else
    variants.push_back({"avx512 tall tiles (emulated)", 0, true});
#endif
    size_t cases = 0;
    int bad = 0;
    for (const Variant& v : variants) {
        cpu::set_disabled_isa(v.disabled);
        for (uint32_t channels : channel_counts)
            for (size_t rows : row_counts) {
#if KVCORE_X86
                const bool ok = v.direct_tall
                                    ? check(rows, channels, rng, shuffle::detail::to_channel_major_tall_avx512,
                                            shuffle::detail::to_row_major_tall_avx512, rows & ~size_t(63),
                                            channels & ~15u)
                                    : check(rows, channels, rng, nullptr, nullptr);
#else  // no AVX-512 tiles in this build: the dispatcher alone
                const bool ok = check(rows, channels, rng, nullptr, nullptr);
#endif
                ++cases;
                if (!ok && bad++ < 20) std::printf("MISMATCH %s: rows=%zu channels=%u\n", v.name, rows, channels);
            }
    }
    cpu::set_disabled_isa(0);
    for (uint32_t channels : channel_counts)
        for (size_t rows : row_counts) {
            ++cases;
            if (!check(rows, channels, rng, tiled_to_columns, tiled_to_rows, rows, channels) && bad++ < 20)
                std::printf("MISMATCH portable tiles: rows=%zu channels=%u\n", rows, channels);
        }
    if (bad) {
        std::printf("%d of %zu cases mismatch\n", bad, cases);
        return 1;
    }
    std::printf("ok: %zu cases (%zu variants)\n", cases, variants.size() + 1);
    return 0;
}
