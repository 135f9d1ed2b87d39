// The AVX-512 stripe feed of Xxh3Stripes (xxh3_stripes.h), inlined into the
// kernels that produce the hashed bytes. The accumulators are a __m512i the
// kernel keeps as a local (GCC spills a vector held in an object to the stack
// on every stripe); the counters are members of a local copy of the feed.
// Include after common/avx512_target.h.
#pragma once

#include "checksum/xxh3_stripes.h"

namespace kvcore {

class StripeFeed {
public:
    explicit StripeFeed(Xxh3Stripes* s)
        : s_(s), secret_(s->secret), fed_(s->fed),
          in_block_(unsigned(s->fed % Xxh3Stripes::kStripesPerBlock)) {}
    KV_AVX512 __m512i load() const { return _mm512_load_si512(s_->acc); }
    // Writes the accumulators and the count of stripes fed back (for finish()).
    KV_AVX512 void store(__m512i acc) const {
        _mm512_store_si512(s_->acc, acc);
        s_->fed = fed_;
    }
    // The next 64 bytes of the input, which must be one of its (len - 1) / 64
    // in-order stripes (the caller bounds its calls; no check here keeps the
    // accumulators in a register).
    KV_AVX512 __attribute__((always_inline)) void add(__m512i& acc, __m512i data) {
        const __m512i key = _mm512_xor_si512(data, _mm512_loadu_si512(secret_ + 8 * in_block_));
        const __m512i product = _mm512_mul_epu32(key, _mm512_srli_epi64(key, 32));
        // Lane j also takes the data of lane j ^ 1.
        acc = _mm512_add_epi64(acc, _mm512_add_epi64(product, _mm512_shuffle_epi32(data, _MM_PERM_BADC)));
        ++fed_;
        // Once in 16 stripes, and out of line: inline, GCC keeps acc on the stack
        // across the branch (a store and a load on every stripe).
        if (__builtin_expect(++in_block_ == Xxh3Stripes::kStripesPerBlock, 0)) {
            in_block_ = 0;
            acc = scrambled(acc, secret_);
        }
    }

private:
    KV_AVX512 __attribute__((noinline)) static __m512i scrambled(__m512i acc, const uint8_t* secret) {
        const __m512i prime = _mm512_set1_epi32(int(0x9E3779B1u));
        const __m512i key = _mm512_loadu_si512(secret + Xxh3Stripes::kSecretBytes - 64);
        const __m512i a = _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47)), key);
        const __m512i lo = _mm512_mul_epu32(a, prime), hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
        return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
    }

    Xxh3Stripes* s_;
    const uint8_t* secret_;
    uint64_t fed_;
    unsigned in_block_;
};

}  // namespace kvcore
