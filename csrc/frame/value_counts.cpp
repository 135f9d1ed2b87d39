#include "frame/value_counts.h"
#include "frame/value_counts_internal.h"

#include <cstring>

#include "common/arch.h"
#include "cpu/cpu_features.h"

#if KVCORE_X86
#include <emmintrin.h>
#endif

namespace kvcore::frame {
namespace {

static_assert(kValueCountBytes == 64, "the bytes are four SSE2 registers");
static_assert(kValueCountBytes < 256, "a value's counts must add up within a byte");

// Counts the bytes in four tables (a common value makes four short chains of
// increments, not one long one), then reads [lo, hi] back eight counts at a time
// from each.
unsigned count_by_table(const uint8_t* v, unsigned lo, unsigned hi, uint8_t* value, uint8_t* count) {
    alignas(8) uint8_t tables[4][256 + 8] = {};  // 8 spare bytes: a word read at 255 stays inside
    for (unsigned k = 0; k < kValueCountBytes; ++k) ++tables[k & 3][v[k]];
    unsigned distinct = 0;
    for (unsigned t = lo; t <= hi; t += 8) {
        uint64_t w = 0;
        for (unsigned j = 0; j < 4; ++j) {
            uint64_t x;
            std::memcpy(&x, tables[j] + t, 8);
            w += x;  // bytewise: the sums stay below 256, so no carry crosses a byte
        }
        while (w) {
            const unsigned byte = unsigned(__builtin_ctzll(w)) / 8;
            value[distinct] = static_cast<uint8_t>(t + byte);
            count[distinct++] = static_cast<uint8_t>(w >> (8 * byte));
            w &= ~(uint64_t(0xff) << (8 * byte));
        }
    }
    return distinct;
}

// The index of the first of the largest counts: of lists in increasing order of
// value, the smallest value on ties.
unsigned first_mode(const uint8_t* count, unsigned distinct) {
    unsigned mode = 0;
    for (unsigned i = 1; i < distinct; ++i) mode = count[i] > count[mode] ? i : mode;
    return mode;
}

}  // namespace

namespace detail {

#if KVCORE_X86
void byte_range(const uint8_t* bytes, unsigned* lo, unsigned* hi) {
    __m128i l = _mm_set1_epi8(-1), h = _mm_setzero_si128();
    for (unsigned i = 0; i < 4; ++i) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16 * i));
        l = _mm_min_epu8(l, v);
        h = _mm_max_epu8(h, v);
    }
    l = _mm_min_epu8(l, _mm_srli_si128(l, 8));
    h = _mm_max_epu8(h, _mm_srli_si128(h, 8));
    l = _mm_min_epu8(l, _mm_srli_si128(l, 4));
    h = _mm_max_epu8(h, _mm_srli_si128(h, 4));
    l = _mm_min_epu8(l, _mm_srli_si128(l, 2));
    h = _mm_max_epu8(h, _mm_srli_si128(h, 2));
    l = _mm_min_epu8(l, _mm_srli_si128(l, 1));
    h = _mm_max_epu8(h, _mm_srli_si128(h, 1));
    *lo = unsigned(_mm_cvtsi128_si32(l)) & 0xff;
    *hi = unsigned(_mm_cvtsi128_si32(h)) & 0xff;
}

ValueCounts count_by_compare(const uint8_t* bytes, unsigned lo, unsigned hi, uint8_t* value, uint8_t* count) {
    __m128i v[4];
    for (unsigned i = 0; i < 4; ++i) v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16 * i));
    const __m128i zero = _mm_setzero_si128(), one = _mm_set1_epi8(1);
    __m128i x = _mm_set1_epi8(static_cast<char>(lo));
    unsigned distinct = 0;
    for (unsigned t = lo; t <= hi; ++t, x = _mm_add_epi8(x, one)) {
        // Each equal byte is -1 in one of four masks: their negated sum, summed by psadbw.
        const __m128i eq = _mm_add_epi8(_mm_add_epi8(_mm_cmpeq_epi8(v[0], x), _mm_cmpeq_epi8(v[1], x)),
                                        _mm_add_epi8(_mm_cmpeq_epi8(v[2], x), _mm_cmpeq_epi8(v[3], x)));
        const __m128i sums = _mm_sad_epu8(_mm_sub_epi8(zero, eq), zero);
        const unsigned n = static_cast<unsigned>(_mm_cvtsi128_si32(_mm_add_epi32(sums, _mm_srli_si128(sums, 8))));
        // Stored either way and kept by moving on (an absent value is overwritten):
        // a branch on n mispredicted often enough to be the analysis's top cost.
        value[distinct] = static_cast<uint8_t>(t);
        count[distinct] = static_cast<uint8_t>(n);
        distinct += n != 0;
    }
    return {distinct, first_mode(count, distinct)};
}
#else
// The range in plain C++, for CPUs without SSE2 (which count every range by tables).
void byte_range(const uint8_t* bytes, unsigned* lo, unsigned* hi) {
    unsigned l = 255, h = 0;
    for (unsigned k = 0; k < kValueCountBytes; ++k) {
        l = bytes[k] < l ? bytes[k] : l;
        h = bytes[k] > h ? bytes[k] : h;
    }
    *lo = l;
    *hi = h;
}
#endif

// SSE2 on x86-64 (its baseline); plain C++ elsewhere.
ValueCounts value_counts_sse2(const uint8_t* bytes, uint8_t* value, uint8_t* count) {
    unsigned lo, hi;
    byte_range(bytes, &lo, &hi);
#if KVCORE_X86
    if (hi - lo < kCompareRange) return count_by_compare(bytes, lo, hi, value, count);
#endif
    const unsigned distinct = count_by_table(bytes, lo, hi, value, count);
    return {distinct, first_mode(count, distinct)};
}

}  // namespace detail

ValueCountsKernel value_counts_kernel() {
#if KVCORE_X86
    const uint32_t isa = cpu::active_isa();
    if (isa & cpu::kIsaAvx512) return detail::value_counts_avx512;
    if (isa & cpu::kIsaAvx2) return detail::value_counts_avx2;
#endif
    return detail::value_counts_sse2;
}

}  // namespace kvcore::frame
