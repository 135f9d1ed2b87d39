// The deflate plane's output must not depend on what the stack held before the
// call. ISA-L's isal_deflate_stateless_init leaves the stream's hist_bits unset,
// and stateless deflate sizes its match window from it (1..14: a window of
// 2..16 KiB; 0 or above 15: the full 32 KiB), so an encoder that does not set it
// codes the same plane differently depending on stack garbage. Here the stack
// is filled with each candidate value of hist_bits before encoding a plane whose
// main redundancy is 16 KiB back: every encoding must be the same, and small.
// Usage: deflate_window_check
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "deflate/deflate_plane.h"

namespace {

// Leaves `value` in every 16-bit word of the next 512 KiB of stack, where the
// encoder's frames (and ISA-L's stream struct, about 100 KiB) will lie.
__attribute__((noinline)) void fill_stack(uint16_t value) {
    volatile uint16_t words[256 * 1024];
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); ++i) words[i] = value;
}

__attribute__((noinline)) std::vector<uint8_t> encode(const std::vector<uint8_t>& plane) {
    std::vector<uint8_t> out(kvcore::deflate::deflate_plane_bound(plane.size()));
    size_t written = 0;
    const kvcore::Status st = kvcore::deflate::deflate_plane_encode(
        plane.data(), plane.size(), kvcore::frame::Backend::kSoftware, 1, out.data(), out.size(), &written);
    if (!st.is_ok()) {
        std::printf("encode failed: %s\n", st.message.c_str());
        std::exit(1);
    }
    out.resize(written);
    return out;
}

}  // namespace

int main() {
    // One 64 KiB piece: 16 KiB of random 4-bit values, repeated 4 times (ISA-L's
    // level 1 finds these repeats; with a window of 16 KiB or less it codes the
    // plane to about half its size, with the full window to about a seventh).
    std::mt19937 rng(7);
    std::vector<uint8_t> plane(kvcore::deflate::kPieceBytes);
    constexpr size_t kPeriod = 16384;
    for (size_t i = 0; i < kPeriod; ++i) plane[i] = uint8_t(rng() % 16);
    for (size_t i = kPeriod; i < plane.size(); ++i) plane[i] = plane[i - kPeriod];

    fill_stack(0);
    const std::vector<uint8_t> reference = encode(plane);
    if (reference.size() > plane.size() / 4) {
        std::printf("the 16 KiB repeats were not found: %zu bytes\n", reference.size());
        return 1;
    }
    for (uint16_t hist_bits = 1; hist_bits <= 16; ++hist_bits) {
        fill_stack(hist_bits);
        const std::vector<uint8_t> coded = encode(plane);
        if (coded != reference) {
            std::printf("stack filled with %u: %zu bytes, against %zu\n", unsigned(hist_bits), coded.size(),
                        reference.size());
            return 1;
        }
    }
    std::printf("ok: %zu bytes\n", reference.size());
    return 0;
}
