// Run-time CPU feature detection for SIMD dispatch.
//
// Each kernel family (shuffle, entropy coding, copies) has a portable variant and
// variants for wider ISAs. `active_isa()` is what the CPU has minus what the
// caller masked with `set_disabled_isa()`; tests mask features to run every
// variant on one machine (KVCORE_DISABLE_ISA=avx512,avx2 in the Python layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvcore::cpu {

enum Isa : uint32_t {
    kIsaNone = 0,
    kIsaAvx2 = 1u << 0,     // AVX2 + BMI2
    kIsaAvx512 = 1u << 1,   // AVX-512 F/BW/VL + VBMI + VBMI2 (Ice Lake, Zen 4 and later)
};

// Features the CPU and OS support (ignores the mask).
uint32_t detected_isa();
// Features in use: detected minus disabled.
uint32_t active_isa();
// Mask features off (bit set = disabled). Not for use while kernels run on other threads.
void set_disabled_isa(uint32_t mask);
// Name of the widest active variant: "avx512", "avx2" or "scalar".
const char* variant_name(uint32_t isa);
// Parse "avx512,avx2" into a mask; unknown names return false.
bool parse_isa_list(const std::string& list, uint32_t* mask);

// Size of the last-level (data) cache in bytes: sysfs, else sysconf; 8 MiB if unknown.
size_t llc_bytes();

// Output bytes from which a pass writes with streaming (non-temporal) stores:
// 32 MiB, or half the last-level cache where that is less. Such an output does
// not stay cached anyway (measurements: frame/codec.cpp for decode, the
// shuffle_split_into binding for the standalone split).
size_t streaming_store_bytes();

}  // namespace kvcore::cpu
