// The AVX-512 stripe feed of Xxh3Stripes (xxh3_stripes.h), inlined into the
// kernels that produce the hashed bytes. The accumulators are a StripeAcc the
// kernel keeps as a local (GCC spills a vector held in an object to the stack
// on every stripe); the counters are members of a local copy of the feed.
// Include after common/avx512_target.h.
#pragma once

#include "common/arch.h"
#if KVCORE_X86

#include "checksum/xxh3_stripes.h"

namespace kvcore {

// What a kernel keeps as a local while it feeds: XXH3's accumulators (sum) and,
// apart, the plain sum of the stripes fed since the last scramble (data). XXH3
// adds each stripe's 64-bit lane i to accumulator i ^ 1; those adds commute, so
// the stripes are summed as they come and the sum is added, lanes swapped, once a
// block (end_block) or when the feed stops (store). That saves a shuffle a stripe:
// the merge kernels that feed are short of shuffle ports, and merge_hashed's
// rotated 2-byte kernel ran 1.10x faster for it (Zen 4, 1 MiB blocks in cache;
// split_hashed's 1.01x: its loads bound it).
struct StripeAcc {
    __m512i sum;
    __m512i data;
};

// A kernel hands each 64-byte output vector, in order, to a Feed: a StripeFeed,
// or NoStripeFeed where no checksum is wanted (the same kernel, nothing fed).
struct NoStripeFeed {
    static constexpr unsigned kStripesPerBlock = 1u << 30;
    KV_AVX512 StripeAcc load() const { return {_mm512_setzero_si512(), _mm512_setzero_si512()}; }
    KV_AVX512 void store(StripeAcc) const {}
    KV_AVX512 StripeAcc add(StripeAcc acc, __m512i) { return acc; }
    KV_AVX512 StripeAcc end_block(StripeAcc acc) { return acc; }
};

class StripeFeed {
public:
    static constexpr unsigned kStripesPerBlock = Xxh3Stripes::kStripesPerBlock;

    // s->fed must be a whole number of blocks (kernels start at stripe 0).
    explicit StripeFeed(Xxh3Stripes* s) : s_(s), secret_(s->secret), fed_(s->fed), in_block_(0) {}
    KV_AVX512 StripeAcc load() const { return {_mm512_load_si512(s_->acc), _mm512_setzero_si512()}; }
    // Writes the accumulators and the count of stripes fed back (for finish()).
    KV_AVX512 void store(StripeAcc acc) const {
        _mm512_store_si512(s_->acc, folded(acc));
        s_->fed = fed_;
    }
    // The next 64 bytes of the input, which must be one of its (len - 1) / 64
    // in-order stripes (the caller bounds its calls; no check here keeps the
    // accumulators in registers). After each kStripesPerBlock of them, counted
    // from stripe 0, the caller calls end_block().
    KV_AVX512 __attribute__((always_inline)) StripeAcc add(StripeAcc acc, __m512i data) {
        const __m512i key = _mm512_xor_si512(data, _mm512_loadu_si512(secret_ + 8 * in_block_));
        const __m512i product = _mm512_mul_epu32(key, _mm512_srli_epi64(key, 32));
        ++fed_;
        ++in_block_;
        return {_mm512_add_epi64(acc.sum, product), _mm512_add_epi64(acc.data, data)};
    }

    // XXH3's scramble at the end of each block of stripes. A kernel calls it
    // between its inner loops: a branch inside the loop (inline or a call) made
    // GCC keep the accumulators on the stack, a store and a load per stripe.
    KV_AVX512 __attribute__((always_inline)) StripeAcc end_block(StripeAcc acc) {
        in_block_ = 0;
        const __m512i sum = folded(acc);
        const __m512i prime = _mm512_set1_epi32(int(0x9E3779B1u));
        const __m512i key = _mm512_loadu_si512(secret_ + Xxh3Stripes::kSecretBytes - 64);
        const __m512i a = _mm512_xor_si512(_mm512_xor_si512(sum, _mm512_srli_epi64(sum, 47)), key);
        const __m512i lo = _mm512_mul_epu32(a, prime), hi = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), prime);
        return {_mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32)), _mm512_setzero_si512()};
    }

private:
    // XXH3's accumulators with the stripes summed so far added in: lane i takes
    // the data of lane i ^ 1.
    KV_AVX512 static __m512i folded(StripeAcc acc) {
        return _mm512_add_epi64(acc.sum, _mm512_shuffle_epi32(acc.data, _MM_PERM_BADC));
    }

    Xxh3Stripes* s_;
    const uint8_t* secret_;
    uint64_t fed_;
    unsigned in_block_;
};

}  // namespace kvcore

#endif  // KVCORE_X86
