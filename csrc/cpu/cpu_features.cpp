#include "cpu/cpu_features.h"

#include "common/arch.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#if KVCORE_X86
#include <cpuid.h>
#endif

namespace kvcore::cpu {
namespace {

// A sysfs cache size ("32768K", "8M"), or 0.
size_t parse_cache_size(const std::string& s) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || n >= (1ull << 40)) return 0;
    if (*end == 'K') return size_t(n) << 10;
    if (*end == 'M') return size_t(n) << 20;
    return *end == '\0' ? size_t(n) : 0;
}

// The kernel's description of cpu0's highest data cache level first: glibc's
// sysconf derives it from cpuid, which some hypervisors fill with the host's
// figures (an AMD EPYC VM with a 32 MiB L3 reported 320 MiB).
size_t read_llc() {
    unsigned best_level = 0;
    size_t best = 0;
    for (unsigned i = 0;; ++i) {
        const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
        std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
        unsigned level = 0;
        std::string type, size;
        if (!(level_file >> level)) break;
        if (!(type_file >> type) || type == "Instruction" || !(size_file >> size)) continue;
        const size_t n = parse_cache_size(size);
        if (n && level > best_level) best_level = level, best = n;
    }
    if (best) return best;
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? size_t(v) : size_t(8) << 20;
}

#if KVCORE_X86
uint64_t xgetbv0() {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (uint64_t(edx) << 32) | eax;
}

uint32_t detect() {
    uint32_t eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return kIsaNone;
    const bool osxsave = ecx & (1u << 27);
    const bool avx = ecx & (1u << 28);
    if (!osxsave || !avx) return kIsaNone;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_state = (xcr0 & 0x6) == 0x6;
    const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
    if (__get_cpuid_max(0, nullptr) < 7) return kIsaNone;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    uint32_t isa = kIsaNone;
    const bool avx2 = ebx & (1u << 5), bmi1 = ebx & (1u << 3), bmi2 = ebx & (1u << 8);
    if (ymm_state && avx2 && bmi1 && bmi2) isa |= kIsaAvx2;
    const bool f = ebx & (1u << 16), bw = ebx & (1u << 30), vl = ebx & (1u << 31), vbmi = ecx & (1u << 1),
               vbmi2 = ecx & (1u << 6);
    if ((isa & kIsaAvx2) && zmm_state && f && bw && vl && vbmi && vbmi2) isa |= kIsaAvx512;
    return isa;
}
#else
uint32_t detect() { return kIsaNone; }  // no x86 SIMD kernels in this build
#endif

std::atomic<uint32_t> g_disabled{0};

}  // namespace

uint32_t detected_isa() {
    static const uint32_t isa = detect();
    return isa;
}

uint32_t active_isa() { return detected_isa() & ~g_disabled.load(std::memory_order_relaxed); }

void set_disabled_isa(uint32_t mask) { g_disabled.store(mask, std::memory_order_relaxed); }

const char* variant_name(uint32_t isa) {
    if (isa & kIsaAvx512) return "avx512";
    if (isa & kIsaAvx2) return "avx2";
    return "scalar";
}

bool parse_isa_list(const std::string& list, uint32_t* mask) {
    uint32_t m = 0;
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const auto b = item.find_first_not_of(" \t");
        if (b == std::string::npos) continue;
        item = item.substr(b, item.find_last_not_of(" \t") - b + 1);
        if (item == "avx2") m |= kIsaAvx2 | kIsaAvx512;  // masking AVX2 masks everything above it
        else if (item == "avx512") m |= kIsaAvx512;
        else return false;
    }
    *mask = m;
    return true;
}

size_t llc_bytes() {
    static const size_t n = read_llc();
    return n;
}

size_t streaming_store_bytes() {
    constexpr size_t kMaxBytes = 32u << 20;
    return std::min(kMaxBytes, llc_bytes() / 2);
}

}  // namespace kvcore::cpu
