// The AVX2 stripe feed of Xxh3Stripes (xxh3_stripes.h), the counterpart of
// xxh3_stripes_avx512.h for kernels with 32-byte vectors: a stripe is two of
// them, and the accumulators are a StripeAccAvx2 the kernel keeps as a local.
// Include in a file that defines KV_AVX2 (AVX2 target attribute) first.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include <immintrin.h>

#include "checksum/xxh3_stripes.h"

namespace kvcore {

// What a kernel keeps as locals while it feeds: XXH3's accumulators (lanes 0-3
// in sum_lo, 4-7 in sum_hi) and, apart, the plain sums of the stripes' halves fed
// since the last scramble, added lanes swapped once a block (as StripeAcc in
// xxh3_stripes_avx512.h: a shuffle a stripe less).
struct StripeAccAvx2 {
    __m256i sum_lo, sum_hi, data_lo, data_hi;
};

class StripeFeedAvx2 {
public:
    static constexpr unsigned kStripesPerBlock = Xxh3Stripes::kStripesPerBlock;

    // s->fed must be a whole number of blocks (kernels start at stripe 0).
    explicit StripeFeedAvx2(Xxh3Stripes* s) : s_(s), secret_(s->secret), fed_(s->fed), in_block_(0) {}
    KV_AVX2 void load(StripeAccAvx2& acc) const {
        acc.sum_lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(s_->acc));
        acc.sum_hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(s_->acc + 4));
        acc.data_lo = acc.data_hi = _mm256_setzero_si256();
    }
    // Writes the accumulators and the count of stripes fed back (for finish()).
    KV_AVX2 void store(const StripeAccAvx2& acc) const {
        _mm256_store_si256(reinterpret_cast<__m256i*>(s_->acc), folded(acc.sum_lo, acc.data_lo));
        _mm256_store_si256(reinterpret_cast<__m256i*>(s_->acc + 4), folded(acc.sum_hi, acc.data_hi));
        s_->fed = fed_;
    }
    // The next 64 bytes of the input (a: bytes 0..31, b: 32..63), which must be
    // one of its (len - 1) / 64 in-order stripes (the caller bounds its calls).
    // After each kStripesPerBlock of them, counted from stripe 0, the caller
    // calls end_block() (between its inner loops: shuffle_internal.h, inner_end).
    KV_AVX2 __attribute__((always_inline)) void add(StripeAccAvx2& acc, __m256i a, __m256i b) {
        const uint8_t* key = secret_ + 8 * in_block_;
        acc.sum_lo = _mm256_add_epi64(acc.sum_lo, product(a, key));
        acc.sum_hi = _mm256_add_epi64(acc.sum_hi, product(b, key + 32));
        acc.data_lo = _mm256_add_epi64(acc.data_lo, a);
        acc.data_hi = _mm256_add_epi64(acc.data_hi, b);
        ++fed_;
        ++in_block_;
    }

    // XXH3's scramble at the end of each block of stripes.
    KV_AVX2 __attribute__((always_inline)) void end_block(StripeAccAvx2& acc) {
        in_block_ = 0;
        const uint8_t* key = secret_ + Xxh3Stripes::kSecretBytes - 64;
        acc.sum_lo = scrambled(folded(acc.sum_lo, acc.data_lo), key);
        acc.sum_hi = scrambled(folded(acc.sum_hi, acc.data_hi), key + 32);
        acc.data_lo = acc.data_hi = _mm256_setzero_si256();
    }

private:
    KV_AVX2 __attribute__((always_inline)) static __m256i product(__m256i data, const uint8_t* key) {
        const __m256i k = _mm256_xor_si256(data, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
        return _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32));
    }
    // The accumulators with the data summed so far added in: lane j takes the data of lane j ^ 1.
    KV_AVX2 __attribute__((always_inline)) static __m256i folded(__m256i sum, __m256i data) {
        return _mm256_add_epi64(sum, _mm256_shuffle_epi32(data, 0x4E));
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
