// Checks the AVX-512 Huffman chunk kernel (code_chunks_avx512, entropy/code_chunks.h)
// against its specification, computed here bit by bit: one and two tables (selected
// by bit 6 or 7), codes of 1 to 11 bits, 1 to 17 groups of 32 symbols, with short
// codes (chunks of eight symbols), long ones (chunks of four) and both in one call,
// and chunks of exactly kMaxChunkBits. Runs natively where the CPU has AVX-512
// (tests/test_huffman.py) or compiled against emulated intrinsics
// (KVCORE_EMULATE_AVX512, test_shuffle_avx512_emulated.py). Prints "ok: N cases".
#include <cstdio>
#include <random>
#include <vector>

#include "avx512_native_only.h"
#include "entropy/code_chunks.h"

using namespace kvcore::entropy::detail;

namespace {

struct Code {
    uint32_t bits;
    unsigned len;
};

// The chunks the specification gives for the 32 * groups symbols before end.
size_t reference(const uint8_t* end, size_t groups, const Code* code, std::vector<uint64_t>& chunks,
                 std::vector<uint8_t>& lens) {
    chunks.clear();
    lens.clear();
    for (size_t g = 0; g < groups; ++g) {
        uint64_t four[8];
        unsigned four_len[8];
        for (size_t c = 0; c < 8; ++c) {  // chunk c of the group codes its symbols 4c .. 4c + 3 in coding order
            uint64_t v = 0;
            unsigned len = 0;
            for (size_t k = 0; k < 4; ++k) {
                const Code& x = code[end[-1 - long(32 * g + 4 * c + k)]];
                v = v << x.len | x.bits;
                len += x.len;
            }
            four[c] = v << (64 - len);
            four_len[c] = len;
        }
        bool join = true;
        for (size_t c = 0; c < 8; c += 2) join &= four_len[c] + four_len[c + 1] <= kMaxChunkBits;
        for (size_t c = 0; c < 8; c += join ? 2 : 1) {
            chunks.push_back(join ? four[c] | four[c + 1] >> four_len[c] : four[c]);
            lens.push_back(uint8_t(join ? four_len[c] + four_len[c + 1] : four_len[c]));
        }
    }
    return chunks.size();
}

}  // namespace

int main() {
    if (skip_without_avx512()) return 0;
    std::mt19937 rng(21);
    size_t cases = 0;
    int bad = 0;
    for (unsigned layout = 0; layout < 3; ++layout)  // one table; two by bit 7; two by bit 6
        for (unsigned max_len : {1u, 2u, 3u, 5u, 7u, 11u})
            for (size_t groups : {size_t(1), size_t(2), size_t(5), size_t(17)})
                for (int trial = 0; trial < 6; ++trial) {
                    ChunkTable t{};
                    t.tables = layout ? 2 : 1;
                    t.select = layout == 1 ? 7 : layout == 2 ? 6 : 0;
                    // Present symbols: one per entry, at a random place in its table's range.
                    Code code[256] = {};
                    std::vector<uint8_t> syms;
                    const unsigned base = rng() % 256;
                    for (unsigned table = 0; table < t.tables; ++table)
                        for (unsigned e = 0; e < 64; ++e) {
                            if (rng() % 3 == 0) continue;
                            unsigned s = (base + e) % 64 | (base & ~63u & 0xff);
                            if (t.tables == 2) s = (s & ~(1u << t.select)) | table << t.select;
                            const unsigned len = 1 + rng() % max_len;
                            code[s] = {uint32_t(rng()) & ((1u << len) - 1), len};
                            t.entry[64 * table + (s & 63)] = uint16_t(code[s].bits | len << kChunkLenShift);
                            syms.push_back(uint8_t(s));
                        }
                    if (syms.empty()) continue;
                    std::vector<uint8_t> src(32 * groups + 3);
                    for (auto& s : src) s = syms[rng() % syms.size()];
                    // Some groups of short-coded symbols where codes run long: both chunk sizes in one call.
                    if (trial % 2)
                        for (size_t g = 0; g < groups; g += 2)
                            for (size_t i = 0; i < 32; ++i) src[3 + 32 * g + i] = syms[0];
                    const uint8_t* end = src.data() + src.size();  // 3 bytes in: unaligned loads
                    std::vector<uint64_t> want, got(8 * groups, ~0ull);
                    std::vector<uint8_t> want_lens, got_lens(8 * groups, 0xff);
                    const size_t nw = reference(end, groups, code, want, want_lens);
                    const size_t ng = code_chunks_avx512(end, groups, t, got.data(), got_lens.data());
                    ++cases;
                    bool same = nw == ng;
                    for (size_t j = 0; same && j < nw; ++j) same = want[j] == got[j] && want_lens[j] == got_lens[j];
                    if (!same && bad++ < 20)
                        std::printf("MISMATCH layout=%u max_len=%u groups=%zu trial=%d (%zu vs %zu chunks)\n", layout,
                                    max_len, groups, trial, nw, ng);
                }
    // Chunks of exactly kMaxChunkBits join; one bit more keeps them apart.
    for (unsigned len : {7u, 8u}) {
        ChunkTable t{};
        t.tables = 1;
        Code code[256] = {};
        code[5] = {1, len};
        t.entry[5] = uint16_t(1 | len << kChunkLenShift);
        std::vector<uint8_t> src(32, 5);
        std::vector<uint64_t> want, got(8);
        std::vector<uint8_t> want_lens, got_lens(8);
        const size_t nw = reference(src.data() + 32, 1, code, want, want_lens);
        const size_t ng = code_chunks_avx512(src.data() + 32, 1, t, got.data(), got_lens.data());
        ++cases;
        if (nw != (len * 8 <= kMaxChunkBits ? 4u : 8u) || nw != ng || want[0] != got[0] || want_lens[0] != got_lens[0])
            if (bad++ < 20) std::printf("MISMATCH at the join limit, len=%u (%zu vs %zu chunks)\n", len, nw, ng);
    }
    if (bad) {
        std::printf("%d of %zu cases mismatch\n", bad, cases);
        return 1;
    }
    std::printf("ok: %zu cases\n", cases);
    return 0;
}
