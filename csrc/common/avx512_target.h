// What every AVX-512 kernel file includes first: the intrinsics and KV_AVX512,
// the target attribute of the AVX-512 level (cpu::kIsaAvx512: F, BW, VL, VBMI,
// VBMI2; AVX2 and BMI2 come with it).
//
// Tests compile these files with -DKVCORE_EMULATE_AVX512 against SIMDe's
// portable AVX-512 (tests/native/avx512_emulation.h), so that machines without
// AVX-512 check the kernels too (tests/test_shuffle_avx512_emulated.py).
#pragma once

#ifdef KVCORE_EMULATE_AVX512
#include "avx512_emulation.h"
#define KV_AVX512
#else
#include <immintrin.h>
#define KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,avx2,bmi,bmi2,popcnt")))
#endif

// GCC 12 reports its own _mm512_undefined_*() placeholders inside several
// intrinsics (insert, extract, masked loads, permutes; shifts and multiplies in
// an out-of-line function) as maybe-uninitialized or uninitialized: a false
// positive, silenced for the files that include this header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
