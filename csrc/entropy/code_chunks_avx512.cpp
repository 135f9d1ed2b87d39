// Huffman code chunks, AVX-512 (see code_chunks.h). Per 32 symbols: each
// symbol's code and length from one or two 64-entry word tables (a two-register
// word permute each, blended by one of the symbol's bits), then
// two joining steps, each shifting the code of the symbol coded first left by
// its neighbour's length: words into 32-bit pairs, pairs into 64-bit chunks of
// four symbols; then, where the 32 symbols' codes are short enough, neighbouring
// chunks into chunks of eight.
#include "common/arch.h"
#if KVCORE_X86
#include "common/avx512_target.h"
#include "entropy/code_chunks.h"

namespace kvcore::entropy::detail {
namespace {

// The entries of the 32 word lanes s (each < 256) in kTables tables (see ChunkTable).
template <unsigned kTables>
KV_AVX512 inline __m512i lookup(const __m512i* t, __m512i s, __m512i select) {
    const __m512i q0 = _mm512_permutex2var_epi16(t[0], s, t[1]);
    if (kTables == 1) return q0;
    const __m512i q1 = _mm512_permutex2var_epi16(t[2], s, t[3]);
    return _mm512_mask_blend_epi16(_mm512_test_epi16_mask(s, select), q0, q1);
}

template <unsigned kTables>
KV_AVX512 inline size_t chunks(const uint8_t* end, size_t groups, const ChunkTable& table, uint64_t* out,
                               uint8_t* lens) {
    __m512i t[2 * kTables];
    for (unsigned i = 0; i < 2 * kTables; ++i) t[i] = _mm512_load_si512(table.entry + 32 * i);
    const __m512i select = _mm512_set1_epi16(int16_t(1u << table.select));
    const __m512i code_mask = _mm512_set1_epi16((1 << kChunkLenShift) - 1);
    const __m512i low16 = _mm512_set1_epi32(0xffff);
    const __m512i low32 = _mm512_set1_epi64(0xffffffff);
    const __m512i ones = _mm512_set1_epi16(1);
    const __m512i bits64 = _mm512_set1_epi64(64);
    const __m512i reverse = _mm512_set_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i odd_down = _mm512_set_epi64(0, 0, 0, 0, 1, 3, 5, 7);
    // The low bytes of 64-bit lanes 7, 6, .. 0 (and of 7, 5, 3, 1) in bytes 0, 1, ..
    const __m512i len_bytes = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x0008101820283038);
    const __m512i odd_len_bytes = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x08182838);
    const __m512i max_bits = _mm512_set1_epi64(kMaxChunkBits);
    size_t n = 0;
    for (size_t g = 0; g < groups; ++g) {
        // Word lane i = end[-32 (g + 1) + i]; of two neighbouring lanes the upper one is coded first.
        const __m512i s = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(end - 32 * (g + 1))));
        const __m512i entry = lookup<kTables>(t, s, select);
        const __m512i code = _mm512_and_si512(entry, code_mask);
        const __m512i len = _mm512_srli_epi16(entry, kChunkLenShift);
        // 32-bit lanes: upper code << lower length | lower code.
        const __m512i low_len = _mm512_and_si512(len, low16);
        __m512i pair = _mm512_sllv_epi32(_mm512_srli_epi32(code, 16), low_len);
        pair = _mm512_ternarylogic_epi32(pair, code, low16, 0xF8);  // pair | (code & low16)
        const __m512i pair_len = _mm512_madd_epi16(len, ones);
        // 64-bit lanes, the same one level up, then left-aligned.
        const __m512i low_pair_len = _mm512_and_si512(pair_len, low32);
        __m512i quad = _mm512_sllv_epi64(_mm512_srli_epi64(pair, 32), low_pair_len);
        quad = _mm512_ternarylogic_epi64(quad, pair, low32, 0xF8);
        const __m512i quad_len = _mm512_add_epi64(_mm512_srli_epi64(pair_len, 32), low_pair_len);
        quad = _mm512_sllv_epi64(quad, _mm512_sub_epi64(bits64, quad_len));
        // Lane 7 holds the symbols coded first: odd lane 2i + 1 and lane 2i joined in
        // lane 2i + 1, kept where every such join has at most kMaxChunkBits (then four
        // chunks of eight symbols, else eight of four), are stored in coding order.
        const __m512i joined_len = _mm512_add_epi64(quad_len, _mm512_shuffle_epi32(quad_len, _MM_PERM_BADC));
        if ((_mm512_cmple_epu64_mask(joined_len, max_bits) & 0xAA) == 0xAA) {
            const __m512i joined = _mm512_or_si512(quad, _mm512_srlv_epi64(_mm512_shuffle_epi32(quad, _MM_PERM_BADC), quad_len));
            _mm512_storeu_si512(out + n, _mm512_permutexvar_epi64(odd_down, joined));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(lens + n), _mm512_castsi512_si128(_mm512_permutexvar_epi8(odd_len_bytes, joined_len)));
            n += 4;
        } else {
            _mm512_storeu_si512(out + n, _mm512_permutexvar_epi64(reverse, quad));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(lens + n), _mm512_castsi512_si128(_mm512_permutexvar_epi8(len_bytes, quad_len)));
            n += 8;
        }
    }
    return n;
}

}  // namespace

KV_AVX512 size_t code_chunks_avx512(const uint8_t* end, size_t groups, const ChunkTable& t, uint64_t* out,
                                    uint8_t* lens) {
    return t.tables == 1 ? chunks<1>(end, groups, t, out, lens) : chunks<2>(end, groups, t, out, lens);
}

}  // namespace kvcore::entropy::detail
#endif  // KVCORE_X86
