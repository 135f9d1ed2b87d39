// Length-limited Huffman code lengths (see code_lengths.h).
#include "entropy/code_lengths.h"

#include <algorithm>
#include <cstring>

namespace kvcore::entropy {

void limited_lengths(const uint64_t* counts, unsigned max_len, uint8_t* lens) {
    struct Leaf {
        uint64_t w;
        unsigned sym;
    };
    constexpr uint64_t kNone = UINT64_MAX;  // weight past the end of a list: never taken first
    Leaf leaves[256];
    unsigned m = 0;
    for (unsigned s = 0; s < 256; ++s) {
        lens[s] = 0;
        if (counts[s]) leaves[m++] = {counts[s], s};
    }
    std::sort(leaves, leaves + m, [](const Leaf& a, const Leaf& b) { return a.w != b.w ? a.w < b.w : a.sym < b.sym; });

    // Lists A_j, j = max_len (leaves only) down to 1; A_j = merge(leaves, pairs of A_{j+1}).
    // is_pkg[j][i] says whether item i of A_j is a package.
    uint64_t leaf_w[256 + 2], pkg_w[256 + 2], items[512];
    uint8_t is_pkg[kMaxCodeLen + 1][512];
    for (unsigned i = 0; i < m; ++i) {
        leaf_w[i] = items[i] = leaves[i].w;
        is_pkg[max_len][i] = 0;
    }
    leaf_w[m] = leaf_w[m + 1] = kNone;
    unsigned n_items = m;
    const unsigned need = 2 * m - 2;  // items taken from A_1
    for (unsigned j = max_len - 1; j >= 1; --j) {
        const unsigned npkg = n_items / 2;
        for (unsigned b = 0; b < npkg; ++b) pkg_w[b] = items[2 * b] + items[2 * b + 1];
        pkg_w[npkg] = pkg_w[npkg + 1] = kNone;
        // Each list's head and next item are kept in registers, so the loads run ahead
        // of the merge instead of after each choice (about 1.4x faster than indexing
        // both lists; a fully branch-free version measured slower still).
        // Only the first `need` items of any list can be selected.
        const unsigned out = std::min(need, m + npkg);
        uint64_t leaf = leaf_w[0], leaf_next = leaf_w[1], pkg = pkg_w[0], pkg_next = pkg_w[1];
        unsigned a = 0, b = 0;
        uint8_t* from_pkg = is_pkg[j];
        for (unsigned o = 0; o < out; ++o) {
            const bool take_leaf = leaf <= pkg;
            items[o] = take_leaf ? leaf : pkg;
            from_pkg[o] = !take_leaf;
            a += take_leaf;
            b += !take_leaf;
            const uint64_t leaf_after = leaf_w[a + 1], pkg_after = pkg_w[b + 1];
            leaf = take_leaf ? leaf_next : leaf;
            leaf_next = take_leaf ? leaf_after : leaf_next;
            pkg = take_leaf ? pkg : pkg_next;
            pkg_next = take_leaf ? pkg_next : pkg_after;
        }
        n_items = out;
    }
    // Walk down: the first t items of A_j give each of their leaves one more bit.
    unsigned t = need;
    for (unsigned j = 1; j <= max_len && t; ++j) {
        unsigned pkgs = 0;
        for (unsigned i = 0; i < t; ++i) pkgs += is_pkg[j][i];
        const unsigned nleaves = t - pkgs;
        for (unsigned i = 0; i < nleaves; ++i) ++lens[leaves[i].sym];
        t = 2 * pkgs;
    }
}

unsigned write_symbol_map(const uint8_t* lens, unsigned extra, uint8_t* out) {
    unsigned m = 0;
    for (unsigned s = 0; s < 256; ++s) m += lens[s] != 0;
    uint8_t* nibbles = out + kSymbolBitmapBytes;
    std::memset(out, 0, kSymbolBitmapBytes + (m + extra + 1) / 2);
    for (unsigned s = 0, j = 0; s < 256; ++s) {
        if (!lens[s]) continue;
        out[s >> 3] |= uint8_t(1u << (s & 7));
        nibbles[j >> 1] |= uint8_t(lens[s] << (4 * (j & 1)));
        ++j;
    }
    return m;
}

unsigned read_symbol_bitmap(const uint8_t* bitmap, uint8_t* syms) {
    unsigned m = 0;
    for (unsigned w = 0; w < kSymbolBitmapBytes / 8; ++w) {
        uint64_t bits;
        std::memcpy(&bits, bitmap + 8 * w, 8);  // little endian: bit s of the map is bit s % 64 of word s / 64
        for (; bits; bits &= bits - 1) syms[m++] = uint8_t(64 * w + unsigned(__builtin_ctzll(bits)));
    }
    return m;
}

SymbolRange symbol_range(const uint8_t* lens) {
    // The range starts after the longest run of uncoded values (circular).
    unsigned first_coded = 256, last = 0, gap = 0, start = 0;
    for (unsigned s = 0; s < 256; ++s) {
        if (!lens[s]) continue;
        if (first_coded == 256) {
            first_coded = s;
        } else if (s - last - 1 > gap) {
            gap = s - last - 1;
            start = s;
        }
        last = s;
    }
    const unsigned wrap_gap = 255 - last + first_coded;  // values after the last and before the first
    if (wrap_gap >= gap) return {uint8_t(first_coded), 256 - wrap_gap};  // ties: the smaller first
    return {uint8_t(start), 256 - gap};
}

void write_range_map(const uint8_t* lens, SymbolRange r, uint8_t* out) {
    out[0] = r.first;
    out[1] = uint8_t(r.span - 1);
    uint8_t* nibbles = out + 2;
    std::memset(nibbles, 0, (r.span + 1) / 2);
    for (unsigned i = 0; i < r.span; ++i) nibbles[i >> 1] |= uint8_t(lens[(r.first + i) & 255] << (4 * (i & 1)));
}

unsigned read_range_map(const uint8_t* map, size_t size, unsigned max_len, uint8_t* lens, uint8_t* syms,
                        size_t* map_size) {
    if (size < 2) return 0;
    const unsigned first = map[0], span = unsigned(map[1]) + 1;
    *map_size = range_map_bytes(span);
    if (size < *map_size) return 0;
    const uint8_t* nibbles = map + 2;
    if ((span & 1) && (nibbles[span >> 1] >> 4) != 0) return 0;
    std::memset(lens, 0, 256);
    // symbol_range's choice, checked as the map is read: the range's ends are coded,
    // and no run of uncoded values inside it is longer than the one outside it, or
    // as long and followed by a value below first (which would start the range).
    const unsigned outside = 256 - span;
    unsigned m = 0, wrapped = 0;  // wrapped: coded values past 255, which come first in increasing order
    int prev = -1;
    for (unsigned i = 0; i < span; ++i) {
        const unsigned len = length_nibble(nibbles, i), s = (first + i) & 255;
        if (len > max_len) return 0;
        if (!len) continue;
        if (prev < 0 ? i != 0 : (i - unsigned(prev) - 1 > outside || (i - unsigned(prev) - 1 == outside && s < first)))
            return 0;
        prev = int(i);
        lens[s] = uint8_t(len);
        syms[m++] = uint8_t(s);
        wrapped += s < first;
    }
    if (m == 0 || unsigned(prev) != span - 1) return 0;
    std::rotate(syms, syms + (m - wrapped), syms + m);
    return m;
}

}  // namespace kvcore::entropy
