// Checks the AVX2 search of split_rows (lz/row_search_avx2.cpp) against the
// portable one: the same copies, row table and distinct rows, and join_rows
// rebuilding the plane from them, portable and with AVX-512 (lz/row_join_avx512.cpp);
// tables with a bit flipped are refused by both joins alike, or joined alike. Planes: row lengths 16 to 200 (the unrolled
// 16, 32 and 64 among them), 0 to 3000 rows, repeat shares from none to all,
// near-copies that differ from a row in one byte, and planes built from rows
// the AVX2 hash sends to one bucket, so that buckets overflow into the next
// and repeats are found by the slow path. Prints "ok: N planes". Exits 0
// without checking where the CPU has no AVX2 (prints "skip").
// Usage: row_search_check [seed]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_features.h"
#include "lz/row_repeats.h"
#include "lz/row_search.h"

using namespace kvcore;

namespace {

struct Split {
    size_t copies = 0, table_size = 0;
    std::vector<uint8_t> table, distinct;
};

Split split(const std::vector<uint8_t>& plane, size_t row_bytes, uint32_t disabled) {
    cpu::set_disabled_isa(disabled);
    const size_t rows = plane.size() / row_bytes;
    Split s;
    s.table.resize(lz::row_table_bound(rows));
    s.distinct.resize(plane.size());
    s.copies = lz::split_rows(plane.data(), plane.size(), row_bytes, s.distinct.data(), s.table.data(), &s.table_size);
    s.table.resize(s.table_size);
    s.distinct.resize(plane.size() - s.copies * row_bytes);
    return s;
}

// The joins compared: portable, then with AVX2 only, then every ISA level the CPU has (AVX-512).
constexpr uint32_t kJoins[] = {cpu::kIsaAvx2 | cpu::kIsaAvx512, cpu::kIsaAvx512, 0};

bool joins_back(const lz::RowTable& t, const std::vector<uint8_t>& distinct, const std::vector<uint8_t>& plane,
                uint32_t disabled) {
    cpu::set_disabled_isa(disabled);
    std::vector<uint8_t> back(plane.size());
    return lz::join_rows(t, distinct.data(), back.data()).is_ok() && back == plane;
}

bool check(const std::vector<uint8_t>& plane, size_t row_bytes, const char* what) {
    const Split portable = split(plane, row_bytes, cpu::kIsaAvx2 | cpu::kIsaAvx512);
    const Split avx2 = split(plane, row_bytes, 0);
    if (avx2.copies != portable.copies || avx2.table != portable.table || avx2.distinct != portable.distinct) {
        std::printf("FAIL %s: rows %zu x %zu: copies %zu vs %zu\n", what, plane.size() / row_bytes, row_bytes,
                    avx2.copies, portable.copies);
        return false;
    }
    lz::RowTable t;
    if (!lz::parse_row_table(avx2.table.data(), avx2.table.size(), plane.size(), &t).is_ok()) {
        std::printf("FAIL %s: rows %zu x %zu: table does not parse\n", what, plane.size() / row_bytes, row_bytes);
        return false;
    }
    for (const uint32_t disabled : kJoins) {
        if (!joins_back(t, avx2.distinct, plane, disabled)) {
            std::printf("FAIL %s: rows %zu x %zu do not join back (disabled ISA %u)\n", what, plane.size() / row_bytes,
                        row_bytes, disabled);
            return false;
        }
    }
    return true;
}

// An edited table: every join either refuses it (with the same message) or gives the same bytes.
bool joins_agree(std::vector<uint8_t> table, const std::vector<uint8_t>& distinct, size_t n, std::mt19937_64& rng) {
    table[8 + rng() % (table.size() - 8)] ^= uint8_t(1u << (rng() % 8));
    lz::RowTable t;
    if (!lz::parse_row_table(table.data(), table.size(), n, &t).is_ok()) return true;
    std::vector<uint8_t> first(n), out(n);
    std::string first_error;
    for (const uint32_t disabled : kJoins) {
        cpu::set_disabled_isa(disabled);
        const Status st = lz::join_rows(t, distinct.data(), out.data());
        const std::string error = st.is_ok() ? "" : st.message;
        if (disabled == kJoins[0]) {
            first_error = error;
            first = out;
        } else if (error != first_error || (error.empty() && out != first)) {
            std::printf("FAIL edited table: the join with disabled ISA %u says \"%s\", the portable one \"%s\"\n",
                        disabled, error.c_str(), first_error.c_str());
            return false;
        }
    }
    return true;
}

// rows rows: each new with probability 1 - share (drawn from `pool` new rows),
// else a repeat of an earlier one; near: a new row is an earlier one with one
// byte changed.
std::vector<uint8_t> random_plane(std::mt19937_64& rng, size_t rows, size_t rb, double share, bool near) {
    std::vector<uint8_t> plane(rows * rb);
    std::uniform_real_distribution<double> u(0, 1);
    const unsigned spread = 1 + unsigned(rng() % 255);  // narrow byte ranges make rows alike
    for (size_t r = 0; r < rows; ++r) {
        uint8_t* row = &plane[r * rb];
        if (r > 0 && u(rng) < share) {
            std::memcpy(row, &plane[(rng() % r) * rb], rb);
        } else if (r > 0 && near) {
            std::memcpy(row, &plane[(rng() % r) * rb], rb);
            row[rng() % rb] ^= uint8_t(1 + rng() % 255);
        } else {
            for (size_t i = 0; i < rb; ++i) row[i] = uint8_t(rng() % spread);
        }
    }
    return plane;
}

// A plane of `rows` rows whose distinct rows all go to one bucket of the AVX2
// table (more of them than a bucket holds), repeated in random order.
std::vector<uint8_t> one_bucket_plane(std::mt19937_64& rng, size_t rows, size_t rb, size_t distinct) {
    const size_t buckets = lz::detail::avx2_search_buckets(rows);
    std::vector<uint8_t> chosen, candidate(rb);
    uint64_t want = 0;
    for (bool first = true; chosen.size() < distinct * rb;) {
        for (auto& b : candidate) b = uint8_t(rng());
        uint64_t h = 0;
        lz::detail::hash_rows_avx2(candidate.data(), 1, rb, &h);
        if (first) want = h % buckets;
        if (h % buckets != want) continue;
        first = false;
        chosen.insert(chosen.end(), candidate.begin(), candidate.end());
    }
    std::vector<uint8_t> plane(rows * rb);
    for (size_t r = 0; r < rows; ++r) {
        const size_t pick = r < distinct ? r : rng() % distinct;
        std::memcpy(&plane[r * rb], &chosen[pick * rb], rb);
    }
    return plane;
}

}  // namespace

int main(int argc, char** argv) {
    if (!(cpu::detected_isa() & cpu::kIsaAvx2)) {
        std::puts("skip: no AVX2");
        return 0;
    }
    std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20261206);
    size_t planes = 0, edited = 0;
    const double shares[] = {0.0, 0.05, 0.3, 0.5, 0.9, 1.0};
    for (int it = 0; it < 600; ++it) {
        const size_t fixed[] = {16, 32, 64};
        const size_t rb = it % 4 == 0 ? fixed[rng() % 3] : 16 + rng() % 185;
        const size_t rows = it % 10 == 0 ? rng() % 70 : rng() % 3001;
        const std::vector<uint8_t> plane = random_plane(rng, rows, rb, shares[rng() % 6], rng() % 4 == 0);
        if (!check(plane, rb, "random")) return 1;
        ++planes;
        const Split s = split(plane, rb, 0);
        if (s.copies > 0) {
            for (int e = 0; e < 8; ++e)
                if (!joins_agree(s.table, s.distinct, plane.size(), rng)) return 1;
            edited += 8;
        }
    }
    for (const size_t rb : {16, 24, 32, 48, 64, 100}) {
        for (const size_t rows : {12, 40, 64, 300}) {
            // A bucket holds 8 rows: 9 to 30 distinct rows overflow it into the next buckets.
            for (const size_t distinct : {9, 17, 30}) {
                if (!check(one_bucket_plane(rng, rows, rb, std::min(distinct, rows)), rb, "one bucket")) return 1;
                ++planes;
            }
        }
    }
    std::printf("ok: %zu planes, %zu edited tables\n", planes, edited);
    return 0;
}
