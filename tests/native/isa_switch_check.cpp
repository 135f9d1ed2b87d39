// kvcore.set_disabled_isa() while a frame is coded or decoded on another thread: the
// mask changes between any two reads of the active ISA. Linked with
// -Wl,--wrap=<kvcore::cpu::active_isa>, so that the k-th read of a call and every
// later one see the ISA changed (SIMD masked, or unmasked), for every k up to the
// reads the call makes: each frame coded so must decode bit-exact, and each decode
// so must succeed bit-exact (one thread: the reads come in a fixed order). Tensors of
// noise and of repeated rows (the rows method, and the decoder's shared-rows path).
// Usage: isa_switch_check <seed>; prints "ok: <n> switches" or the first failure.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/cpu_features.h"
#include "frame/codec.h"

namespace fr = kvcore::frame;
namespace cpu = kvcore::cpu;

extern "C" uint32_t __real__ZN6kvcore3cpu10active_isaEv();

namespace {

std::atomic<long> g_reads{0};
std::atomic<long> g_switch_at{-1};  // the read from which `after` applies; -1: none
std::atomic<uint32_t> g_before{0}, g_after{0};  // masks before and from the switch

}  // namespace

extern "C" uint32_t __wrap__ZN6kvcore3cpu10active_isaEv() {
    const long read = g_reads.fetch_add(1);
    const long at = g_switch_at.load();
    const uint32_t mask = at >= 0 && read >= at ? g_after.load() : g_before.load();
    return __real__ZN6kvcore3cpu10active_isaEv() & ~mask;
}

namespace {

struct Switch {
    uint32_t before, after;
};

// Runs f with the mask s.before until its read number `at` of the active ISA, s.after from
// there (at -1: s.before throughout); returns the reads it made.
template <typename F>
long run_switched(const Switch& s, long at, F f) {
    g_before = s.before;
    g_after = s.after;
    g_switch_at = at;
    g_reads = 0;
    f();
    g_switch_at = -1;
    return g_reads.load();
}

void fail(const char* what, const char* config, int dtype, const Switch& s, long at, const kvcore::Status& st) {
    std::printf("FAIL %s: %s, dtype %d, mask %u -> %u at read %ld: %s\n", what, config, dtype, s.before, s.after, at,
                st.message.c_str());
    std::exit(1);
}

// Normal values in rows of `row` elements; with `repeated`, each row a copy of one of the first 8
// (whole token rows repeated: the rows plane method, and the decoder's shared-rows path).
std::vector<uint8_t> tensor(fr::DType dtype, size_t elems, size_t row, bool repeated, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const unsigned esize = fr::dtype_size(dtype);
    std::vector<uint8_t> out(elems * esize);
    for (size_t i = 0; i < elems; ++i) {
        if (repeated && i >= 8 * row) {
            const size_t from = (rng() % 8) * row + i % row;
            std::memcpy(&out[i * esize], &out[from * esize], esize);
            continue;
        }
        const float v = normal(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        if (esize == 4) std::memcpy(&out[4 * i], &bits, 4);
        if (esize == 2) {  // bfloat16 or float16 alike: the top half of a float (values, not equal floats)
            const uint16_t top = uint16_t(bits >> 16);
            std::memcpy(&out[2 * i], &top, 2);
        }
        if (esize == 1) out[i] = uint8_t(int8_t(v * 8));
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::mt19937 rng(argc > 1 ? unsigned(std::atoi(argv[1])) : 1u);
    const uint32_t simd = cpu::detected_isa();
    if (simd == cpu::kIsaNone) {
        std::printf("ok: 0 switches (no SIMD variant to mask)\n");
        return 0;
    }
    std::vector<Switch> switches = {{0, simd}, {simd, 0}};  // SIMD masked mid-call, and unmasked
    if (simd & cpu::kIsaAvx512) switches.push_back({0, cpu::kIsaAvx512}), switches.push_back({cpu::kIsaAvx512, 0});

    struct Config {
        const char* name;
        fr::Mode mode;
        bool max_ratio, lanes, deflate;
    };
    const Config configs[] = {{"dense", fr::Mode::kDense, false, false, false},
                              {"dense lanes", fr::Mode::kDense, false, true, false},
                              {"fast", fr::Mode::kFast, false, false, false},
                              {"max", fr::Mode::kDense, true, false, false},
                              {"deflate", fr::Mode::kDense, false, false, true}};
    const fr::DType dtypes[] = {fr::DType::kBFloat16, fr::DType::kFloat32, fr::DType::kUInt8};
    long count = 0;
    for (const Config& c : configs) {
        for (const fr::DType dtype : dtypes) {
          for (const bool repeated : {false, true}) {
            const size_t elems = 8 * 1024, row = 64;
            const std::vector<uint8_t> src = tensor(dtype, elems, row, repeated, rng);
            const fr::TensorDesc desc{dtype, {elems / row, row}};
            fr::EncodeOptions o;
            o.mode = c.mode;
            o.max_ratio = c.max_ratio;
            o.lanes = c.lanes;
            o.deflate = c.deflate;
            o.backend = c.deflate ? fr::Backend::kSoftware : fr::Backend::kAuto;
            o.block_bytes = 4096;
            o.threads = 1;
            std::vector<uint8_t> frame(fr::max_frame_size(desc, o.block_bytes)), out(src.size());
            size_t size = 0;
            kvcore::Status st;
            auto encode = [&] { st = fr::compress(src.data(), src.size(), desc, o, frame.data(), frame.size(), &size); };
            auto decode = [&] {
                std::fill(out.begin(), out.end(), uint8_t(0x5a));  // nothing left from an earlier decode
                st = fr::decompress(frame.data(), size, out.data(), out.size(), 1);
            };
            for (const Switch& s : switches) {
                const long encode_reads = run_switched(s, -1, encode);
                for (long at = 0; at <= encode_reads; ++at, ++count) {
                    run_switched(s, at, encode);
                    if (!st.is_ok()) fail("compress", c.name, int(dtype), s, at, st);
                    decode();
                    if (!st.is_ok()) fail("decompress of the frame so coded", c.name, int(dtype), s, at, st);
                    if (out != src) fail("frame so coded decodes to other values", c.name, int(dtype), s, at, st);
                }
                encode();  // (with the mask s.before: the frame decoded from here on)
                const long decode_reads = run_switched(s, -1, decode);
                for (long at = 0; at <= decode_reads; ++at, ++count) {
                    run_switched(s, at, decode);
                    if (!st.is_ok()) fail("decompress", c.name, int(dtype), s, at, st);
                    if (out != src) fail("decompress gave other values", c.name, int(dtype), s, at, st);
                }
            }
          }
        }
    }
    std::printf("ok: %ld switches\n", count);
    return 0;
}
