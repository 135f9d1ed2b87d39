// The many-repeats join's two steps in AVX-512.
//
// Unpacking the indices: the portable loop extracts one at a time, a shift and
// a mask behind each 8-byte read (3-4 cycles an index, most of a join's time
// where nearly every row repeats). Here 8 at a time: the bytes each one spans
// are gathered into its 64-bit lane by one byte permute of a 64-byte load, then
// shifted by the lane's own bit offset.
//
// word_sources: the portable join picks each row's source with a
// data-dependent branch (runs of new rows copied whole) or a branch-free select
// a row at a time, a chain of counters through every row. Here 16 rows at a time:
// vpexpandd places the copies' indices at the repeat lanes and the next new rows'
// numbers at the others, and one compare checks every repeat names a row already
// brought in. The caller copies the rows from the sources.
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
// (after avx512_target.h, which defines KV_AVX512)
#include "lz/row_join.h"

namespace kvcore::lz::detail {
namespace {

KV_AVX512 inline __m512i load_indices(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
KV_AVX512 inline __m512i load_indices(const uint32_t* p) { return _mm512_loadu_si512(p); }

template <typename T>
KV_AVX512 bool sources(uint64_t bits, size_t count, const T* idx, size_t next, uint32_t* src) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    uint16_t ahead = 0;
    for (size_t j = 0; j < count; j += 16) {
        const unsigned lanes = count - j < 16 ? unsigned(count - j) : 16u;
        const uint16_t valid = static_cast<uint16_t>(lanes == 16 ? 0xFFFFu : (1u << lanes) - 1);
        const uint16_t rep = static_cast<uint16_t>(bits >> j) & valid;
        const uint16_t fresh = static_cast<uint16_t>(~rep) & valid;
        const __m512i base = _mm512_set1_epi32(static_cast<int>(next));
        // Repeat lanes: their indices, and their rank among the repeats; new lanes: the next rows.
        const __m512i copied = _mm512_maskz_expand_epi32(rep, load_indices(idx));
        const __m512i rank = _mm512_maskz_expand_epi32(rep, lane);
        const __m512i brought = _mm512_maskz_expand_epi32(fresh, _mm512_add_epi32(base, lane));
        // A repeat at lane l follows l - rank new rows of this chunk: its index must be below next + that.
        ahead |= rep & _mm512_cmpge_epu32_mask(copied, _mm512_add_epi32(base, _mm512_sub_epi32(lane, rank)));
        _mm512_storeu_si512(src + j, _mm512_or_si512(copied, brought));
        const unsigned repeats = static_cast<unsigned>(__builtin_popcount(rep));
        idx += repeats;
        next += lanes - repeats;
    }
    return ahead == 0;
}

KV_AVX512 inline void store_lanes(uint8_t* out, uint8_t m, __m512i v) { _mm512_mask_cvtepi64_storeu_epi8(out, m, v); }
KV_AVX512 inline void store_lanes(uint32_t* out, uint8_t m, __m512i v) {
    _mm512_mask_cvtepi64_storeu_epi32(out, m, v);
}

template <typename T>
KV_AVX512 uint32_t unpack(const uint8_t* indices, size_t bytes, size_t copies, unsigned width, T* out) {
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    // Byte j of lane i reads byte j of the lane's first byte: (first byte of each lane) + j.
    const __m512i spread = _mm512_set_epi8(56, 56, 56, 56, 56, 56, 56, 56, 48, 48, 48, 48, 48, 48, 48, 48, 40, 40,
                                           40, 40, 40, 40, 40, 40, 32, 32, 32, 32, 32, 32, 32, 32, 24, 24, 24, 24, 24,
                                           24, 24, 24, 16, 16, 16, 16, 16, 16, 16, 16, 8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0,
                                           0, 0, 0, 0, 0);
    const __m512i within = _mm512_set1_epi64(0x0706050403020100ll);
    const __m512i mask = _mm512_set1_epi64(static_cast<long long>((uint64_t(1) << width) - 1));
    const __m512i step = _mm512_mullo_epi32(lane, _mm512_set1_epi64(width));  // (lanes below 2^32: the low halves)
    __m512i top = _mm512_setzero_si512();
    for (size_t k = 0; k < copies; k += 8) {
        const uint64_t bit = uint64_t(k) * width;
        const size_t first = bit >> 3;
        const size_t left = bytes - first;  // >= 1: index k starts inside the field
        const __m512i window = _mm512_maskz_loadu_epi8(left >= 64 ? ~uint64_t(0) : (uint64_t(1) << left) - 1,
                                                       indices + first);
        const __m512i offset = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(bit & 7)), step);
        const __m512i start = _mm512_permutexvar_epi8(spread, _mm512_srli_epi64(offset, 3));
        const __m512i gathered = _mm512_permutexvar_epi8(_mm512_add_epi8(start, within), window);
        const __m512i shift = _mm512_and_si512(offset, _mm512_set1_epi64(7));
        const __m512i v = _mm512_and_si512(_mm512_srlv_epi64(gathered, shift), mask);
        const uint8_t valid = copies - k >= 8 ? uint8_t(0xFF) : static_cast<uint8_t>((1u << (copies - k)) - 1);
        top = _mm512_mask_max_epu64(top, valid, top, v);
        store_lanes(out + k, valid, v);
    }
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(lanes, top);
    uint64_t most = 0;
    for (uint64_t x : lanes) most = x > most ? x : most;
    return static_cast<uint32_t>(most);
}

}  // namespace

KV_AVX512 uint32_t unpack_indices_avx512(const uint8_t* indices, size_t bytes, size_t copies, unsigned width,
                                         uint8_t* out) {
    return unpack(indices, bytes, copies, width, out);
}
KV_AVX512 uint32_t unpack_indices_avx512(const uint8_t* indices, size_t bytes, size_t copies, unsigned width,
                                         uint32_t* out) {
    return unpack(indices, bytes, copies, width, out);
}

KV_AVX512 bool word_sources_avx512(uint64_t bits, size_t count, const uint8_t* idx, size_t next, uint32_t* src) {
    return sources(bits, count, idx, next, src);
}
KV_AVX512 bool word_sources_avx512(uint64_t bits, size_t count, const uint32_t* idx, size_t next, uint32_t* src) {
    return sources(bits, count, idx, next, src);
}

}  // namespace kvcore::lz::detail
#endif  // KVCORE_X86
