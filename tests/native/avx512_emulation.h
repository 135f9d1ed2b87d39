// AVX-512 intrinsics in portable C++ (SIMDe, Debian package libsimde-dev), for
// checking AVX-512 kernels on machines without AVX-512. Tests only: included by
// csrc files compiled with -DKVCORE_EMULATE_AVX512 from tests/, never by the package.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>
#include <cstring>

#ifndef _mm512_shuffle_i64x2
// Older SIMDe lacks it. Result 128-bit lanes 0 and 1 come from a, lanes 2 and 3
// from b; imm bits [2l+1:2l] pick the source lane of result lane l.
static inline __m512i _mm512_shuffle_i64x2(__m512i a, __m512i b, int imm) {
    uint8_t sa[64], sb[64], r[64];
    std::memcpy(sa, &a, 64);
    std::memcpy(sb, &b, 64);
    for (int l = 0; l < 4; ++l) std::memcpy(r + 16 * l, (l < 2 ? sa : sb) + 16 * ((imm >> (2 * l)) & 3), 16);
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}
#endif

#ifndef _mm512_stream_si512
// SIMDe lacks it. A non-temporal store is a store with a cache hint: emulated as a
// plain store, keeping the instruction's 64-byte alignment requirement as a check.
static inline void _mm512_stream_si512(__m512i* p, __m512i v) {
    if (reinterpret_cast<uintptr_t>(p) % 64 != 0) __builtin_trap();
    std::memcpy(p, &v, 64);
}
#endif

#ifndef _mm512_mask_expandloadu_epi8
// Older SIMDe lacks VBMI2's expand-load. Bytes of src where mask bit j is set are
// replaced, in order, by consecutive bytes read from p (popcount(mask) of them).
static inline __m512i _mm512_mask_expandloadu_epi8(__m512i src, uint64_t mask, const void* p) {
    uint8_t r[64];
    std::memcpy(r, &src, 64);
    const uint8_t* in = static_cast<const uint8_t*>(p);
    for (int j = 0; j < 64; ++j)
        if ((mask >> j) & 1) r[j] = *in++;
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}
#endif

// Compress (Expand false): the lanes of a whose mask bit is set, in order, at the
// start of the result. Expand: consecutive lanes of a, in order, to the lanes whose
// mask bit is set. Zeros elsewhere.
template <typename Lane, bool Expand>
static inline __m512i moved_by_mask(uint64_t mask, __m512i a) {
    constexpr int n = 64 / sizeof(Lane);
    Lane in[n], r[n] = {};
    std::memcpy(in, &a, 64);
    int k = 0;
    for (int j = 0; j < n; ++j)
        if ((mask >> j) & 1) {
            if (Expand) r[j] = in[k++];
            else r[k++] = in[j];
        }
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}

#ifndef _mm512_maskz_compress_epi8
// Older SIMDe lacks VBMI2's compress.
static inline __m512i _mm512_maskz_compress_epi8(uint64_t mask, __m512i a) {
    return moved_by_mask<uint8_t, false>(mask, a);
}
#endif

// A masked load: lane j (of type Lane) read from p where mask bit j is set, and
// only those read (the others may lie past a buffer); zero elsewhere.
template <typename Lane>
static inline __m512i masked_load(uint64_t mask, const void* p) {
    constexpr int n = 64 / sizeof(Lane);
    Lane r[n] = {};
    for (int j = 0; j < n; ++j)
        if ((mask >> j) & 1) std::memcpy(&r[j], static_cast<const uint8_t*>(p) + sizeof(Lane) * j, sizeof(Lane));
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}

#ifndef _mm512_maskz_loadu_epi64
// Older SIMDe lacks the masked loads.
static inline __m512i _mm512_maskz_loadu_epi64(uint8_t mask, const void* p) { return masked_load<uint64_t>(mask, p); }
#endif

#ifndef _mm512_shuffle_epi32
// Older SIMDe lacks it: within each 128-bit lane, dword l of the result is dword
// (imm >> 2l) & 3 of a's lane.
static inline __m512i kv_emulated_shuffle_epi32(__m512i a, int imm) {
    uint32_t in[16], r[16];
    std::memcpy(in, &a, 64);
    for (int l = 0; l < 16; ++l) r[l] = in[(l & ~3) + ((imm >> (2 * (l & 3))) & 3)];
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}
#define _mm512_shuffle_epi32(a, imm) kv_emulated_shuffle_epi32((a), int(imm))
#endif

#ifndef _MM_PERM_BADC
#define _MM_PERM_BADC 0x4E
#endif

#ifndef _mm512_shldv_epi16
// Older SIMDe lacks VBMI2's funnel shift: per 16-bit lane, the upper half of
// (a:b) << (c mod 16), a being the high word.
static inline __m512i _mm512_shldv_epi16(__m512i a, __m512i b, __m512i c) {
    uint16_t x[32], y[32], n[32], r[32];
    std::memcpy(x, &a, 64);
    std::memcpy(y, &b, 64);
    std::memcpy(n, &c, 64);
    for (int l = 0; l < 32; ++l) r[l] = static_cast<uint16_t>(((uint32_t(x[l]) << 16 | y[l]) << (n[l] & 15)) >> 16);
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}
#endif

#ifndef _mm512_shldi_epi16
// VBMI2's funnel shifts by an immediate, per 16-bit lane: the upper half of
// (a:b) << imm, and the lower half of (b:a) >> imm.
static inline __m512i _mm512_shldi_epi16(__m512i a, __m512i b, int imm) {
    return _mm512_shldv_epi16(a, b, _mm512_set1_epi16(static_cast<short>(imm)));
}
static inline __m512i _mm512_shrdi_epi16(__m512i a, __m512i b, int imm) {
    uint16_t x[32], y[32], r[32];
    std::memcpy(x, &a, 64);
    std::memcpy(y, &b, 64);
    for (int l = 0; l < 32; ++l) r[l] = static_cast<uint16_t>((uint32_t(y[l]) << 16 | x[l]) >> (imm & 15));
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}
#endif

#ifndef _mm512_testn_epi8_mask
// Older SIMDe lacks it: bit j set where byte j of a & b is zero.
static inline uint64_t _mm512_testn_epi8_mask(__m512i a, __m512i b) {
    uint8_t x[64], y[64];
    std::memcpy(x, &a, 64);
    std::memcpy(y, &b, 64);
    uint64_t m = 0;
    for (int j = 0; j < 64; ++j) m |= uint64_t((x[j] & y[j]) == 0) << j;
    return m;
}
#endif

// The bytes of a zero-extended to lanes of type Lane, as many as fill 64 bytes.
template <typename Lane, typename In>
static inline __m512i zero_extended(In a) {
    constexpr int n = 64 / sizeof(Lane);
    static_assert(sizeof(In) == n, "one byte a lane");
    uint8_t x[n];
    Lane r[n];
    std::memcpy(x, &a, n);
    for (int l = 0; l < n; ++l) r[l] = x[l];
    __m512i out;
    std::memcpy(&out, r, 64);
    return out;
}

#ifndef _mm512_cvtepu8_epi16
// Older SIMDe lacks it: 32 bytes zero-extended to 16-bit lanes.
static inline __m512i _mm512_cvtepu8_epi16(__m256i a) { return zero_extended<uint16_t>(a); }
#endif

// Older SIMDe aliases it as a macro of four arguments (its masked form's).
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16((a), (b))

// The same for the unsigned 32-bit compare.
#undef _mm512_cmpge_epu32_mask
#define _mm512_cmpge_epu32_mask(a, b) simde_mm512_cmpge_epu32_mask((a), (b))

#ifndef _mm512_cvtepu8_epi32
// Older SIMDe lacks it: 16 bytes zero-extended to 32-bit lanes.
static inline __m512i _mm512_cvtepu8_epi32(__m128i a) { return zero_extended<uint32_t>(a); }
#endif

#ifndef _mm512_maskz_expand_epi32
// Older SIMDe lacks it.
static inline __m512i _mm512_maskz_expand_epi32(uint16_t mask, __m512i a) {
    return moved_by_mask<uint32_t, true>(mask, a);
}
#endif

#ifndef _mm512_maskz_loadu_epi8
static inline __m512i _mm512_maskz_loadu_epi8(uint64_t mask, const void* p) { return masked_load<uint8_t>(mask, p); }
#endif

// A narrowing masked store: the low sizeof(Lane) bytes of each 64-bit lane of a
// whose mask bit is set, to p + sizeof(Lane) * lane.
template <typename Lane>
static inline void narrowed_store(void* p, uint8_t mask, __m512i a) {
    uint64_t x[8];
    std::memcpy(x, &a, 64);
    for (int l = 0; l < 8; ++l)
        if ((mask >> l) & 1) {
            const Lane v = static_cast<Lane>(x[l]);
            std::memcpy(static_cast<uint8_t*>(p) + sizeof(Lane) * l, &v, sizeof(Lane));
        }
}

#ifndef _mm512_mask_cvtepi64_storeu_epi8
// Older SIMDe lacks the narrowing masked stores.
static inline void _mm512_mask_cvtepi64_storeu_epi8(void* p, uint8_t mask, __m512i a) {
    narrowed_store<uint8_t>(p, mask, a);
}
#endif

#ifndef _mm512_mask_cvtepi64_storeu_epi32
static inline void _mm512_mask_cvtepi64_storeu_epi32(void* p, uint8_t mask, __m512i a) {
    narrowed_store<uint32_t>(p, mask, a);
}
#endif

#ifndef _mm512_mask_storeu_epi64
// (SIMDe lacks this masked store too.)
static inline void _mm512_mask_storeu_epi64(void* p, uint8_t mask, __m512i a) {
    narrowed_store<uint64_t>(p, mask, a);
}
#endif
