// For the AVX-512 kernel harnesses: a native build runs only where the CPU has
// the AVX-512 level; an emulated one (KVCORE_EMULATE_AVX512) runs anywhere.
#pragma once

#include <cstdio>

#include "cpu/cpu_features.h"

// Whether this build's AVX-512 kernels can run here: always when emulated.
inline bool avx512_runs_here() {
#ifdef KVCORE_EMULATE_AVX512
    return true;
#else
    return (kvcore::cpu::detected_isa() & kvcore::cpu::kIsaAvx512) != 0;
#endif
}

// True (after printing the harness's "ok: 0 cases" line) when this build cannot run here.
inline bool skip_without_avx512() {
    if (avx512_runs_here()) return false;
    std::printf("ok: 0 cases (no AVX-512 on this CPU)\n");
    return true;
}
