// The AVX2 stripe feed of Xxh3Stripes (xxh3_stripes.h), the counterpart of
// xxh3_stripes_avx512.h for kernels with 32-byte vectors: a stripe is two of
// them, and the accumulators are two __m256i the kernel keeps as locals.
// Include in a file that defines KV_AVX2 (AVX2 target attribute) first.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include <immintrin.h>

#include "checksum/xxh3_stripes.h"

namespace kvcore {

class StripeFeedAvx2 {
public:
    static constexpr unsigned kStripesPerBlock = Xxh3Stripes::kStripesPerBlock;

    // s->fed must be a whole number of blocks (kernels start at stripe 0).
    explicit StripeFeedAvx2(Xxh3Stripes* s) : s_(s), secret_(s->secret), fed_(s->fed), in_block_(0) {}
    KV_AVX2 void load(__m256i& lo, __m256i& hi) const {
        lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(s_->acc));
        hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(s_->acc + 4));
    }
    // Writes the accumulators and the count of stripes fed back (for finish()).
    KV_AVX2 void store(__m256i lo, __m256i hi) const {
        _mm256_store_si256(reinterpret_cast<__m256i*>(s_->acc), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(s_->acc + 4), hi);
        s_->fed = fed_;
    }
    // The next 64 bytes of the input (a: bytes 0..31, b: 32..63), which must be
    // one of its (len - 1) / 64 in-order stripes (the caller bounds its calls).
    // After each kStripesPerBlock of them, counted from stripe 0, the caller
    // calls end_block() (between its inner loops: shuffle_internal.h, inner_end).
    KV_AVX2 __attribute__((always_inline)) void add(__m256i& lo, __m256i& hi, __m256i a, __m256i b) {
        const uint8_t* key = secret_ + 8 * in_block_;
        lo = accumulate(lo, a, key);
        hi = accumulate(hi, b, key + 32);
        ++fed_;
        ++in_block_;
    }

    // XXH3's scramble at the end of each block of stripes.
    KV_AVX2 __attribute__((always_inline)) void end_block(__m256i& lo, __m256i& hi) {
        in_block_ = 0;
        const uint8_t* key = secret_ + Xxh3Stripes::kSecretBytes - 64;
        lo = scrambled(lo, key);
        hi = scrambled(hi, key + 32);
    }

private:
    KV_AVX2 __attribute__((always_inline)) static __m256i accumulate(__m256i acc, __m256i data, const uint8_t* key) {
        const __m256i k = _mm256_xor_si256(data, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
        const __m256i product = _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32));
        // Lane j also takes the data of lane j ^ 1.
        return _mm256_add_epi64(acc, _mm256_add_epi64(product, _mm256_shuffle_epi32(data, 0x4E)));
    }
    KV_AVX2 __attribute__((always_inline)) static __m256i scrambled(__m256i acc, const uint8_t* key) {
        const __m256i prime = _mm256_set1_epi32(int(0x9E3779B1u));
        const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key));
        const __m256i a = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)), k);
        const __m256i lo = _mm256_mul_epu32(a, prime), hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
        return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
    }

    Xxh3Stripes* s_;
    const uint8_t* secret_;
    uint64_t fed_;
    unsigned in_block_;
};

}  // namespace kvcore

#endif  // KVCORE_X86
