// Which instruction set family this build targets.
//
// The SIMD kernels (SSE2, AVX2, AVX-512, BMI2) exist only where KVCORE_X86 is
// 1. Elsewhere (aarch64, ppc64le, ...) their files compile to nothing, the
// dispatchers keep only the portable path, and cpu::isa() reports no SIMD
// level, so every other CPU reads and writes the same frames with portable C++.
// Kernel files wrap their bodies in `#if KVCORE_X86`; a dispatcher guards
// each call of an x86 kernel the same way.
#pragma once

// Tests may set it to 0 on x86-64 (-DKVCORE_X86=0) to build what other CPUs run.
#ifndef KVCORE_X86
#if defined(__x86_64__) || defined(_M_X64)
#define KVCORE_X86 1
#else
#define KVCORE_X86 0
#endif
#endif
