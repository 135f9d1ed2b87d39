// Checks the AVX-512 join kernels (lz/row_join_avx512.cpp) against their
// specification (lz/row_join.h): unpacking indices of every width 1-32 (to
// 32-bit entries, and to bytes up to 8 bits) from fields that end at an
// inaccessible page (a read past them faults), counts around the 8-index steps; and the sources of
// a 64-row word for random repeat bitmaps, words cut short, and repeats that
// name a row not yet brought in (refused) or the last one brought in (taken).
// Runs natively where the CPU has AVX-512 (tests/test_row_repeats.py) or
// against emulated intrinsics (KVCORE_EMULATE_AVX512,
// test_shuffle_avx512_emulated.py). Prints "ok: N cases".
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "avx512_native_only.h"
#include "lz/row_join.h"

using namespace kvcore::lz::detail;

namespace {

// indices packed w bits each, LSB first, in exactly ceil(n w / 8) bytes.
std::vector<uint8_t> pack(const std::vector<uint32_t>& v, unsigned w) {
    std::vector<uint8_t> out((v.size() * w + 7) / 8);
    for (size_t k = 0; k < v.size(); ++k)
        for (unsigned b = 0; b < w; ++b)
            if ((v[k] >> b) & 1) out[(k * w + b) / 8] |= uint8_t(1u << ((k * w + b) % 8));
    return out;
}

// Two pages, the second one inaccessible: a field copied to the end of the first
// faults on any read past it (a masked-off byte of a vector load does not).
class GuardedField {
public:
    GuardedField() {
        page_ = size_t(sysconf(_SC_PAGESIZE));
        void* p = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) std::abort();
        base_ = static_cast<uint8_t*>(p);
        if (mprotect(base_ + page_, page_, PROT_NONE) != 0) std::abort();
    }
    ~GuardedField() { munmap(base_, 2 * page_); }
    GuardedField(const GuardedField&) = delete;
    GuardedField& operator=(const GuardedField&) = delete;
    // The bytes, ending at the guard page (at most a page of them).
    const uint8_t* place(const std::vector<uint8_t>& bytes) {
        uint8_t* at = base_ + page_ - bytes.size();
        if (!bytes.empty()) std::memcpy(at, bytes.data(), bytes.size());
        return at;
    }

private:
    size_t page_ = 0;
    uint8_t* base_ = nullptr;
};

template <typename T>
bool unpacks(const std::vector<uint32_t>& v, unsigned w) {
    static GuardedField guarded;
    const std::vector<uint8_t> field = pack(v, w);
    const uint8_t* at = guarded.place(field);
    std::vector<T> out(v.size() + kIndexPad, T(0xAB));
    const uint32_t top = unpack_indices_avx512(at, field.size(), v.size(), w, out.data());
    uint32_t want_top = 0;
    for (size_t k = 0; k < v.size(); ++k) {
        if (out[k] != T(v[k])) return false;
        want_top = std::max(want_top, v[k]);
    }
    for (size_t k = v.size(); k < out.size(); ++k)
        if (out[k] != T(0xAB)) return false;  // nothing written past the copies
    return top == want_top;
}

// The specification of word_sources: new rows take next, next + 1, ...; a repeat its
// index, which must be below the rows brought in so far.
bool expected_sources(uint64_t bits, size_t count, const std::vector<uint32_t>& idx, size_t next,
                      std::vector<uint32_t>* src) {
    size_t k = 0;
    for (size_t j = 0; j < count; ++j) {
        if ((bits >> j) & 1) {
            if (idx[k] >= next) return false;
            (*src)[j] = idx[k++];
        } else {
            (*src)[j] = uint32_t(next++);
        }
    }
    return true;
}

template <typename T>
bool sources_match(uint64_t bits, size_t count, const std::vector<uint32_t>& idx, size_t next) {
    std::vector<T> narrow(idx.size() + kIndexPad, T(0));
    for (size_t k = 0; k < idx.size(); ++k) narrow[k] = T(idx[k]);
    std::vector<uint32_t> want(64), got(64);
    const bool ok = expected_sources(bits, count, idx, next, &want);
    const bool got_ok = word_sources_avx512(bits, count, narrow.data(), next, got.data());
    if (ok != got_ok) return false;
    for (size_t j = 0; ok && j < count; ++j)
        if (got[j] != want[j]) return false;
    return true;
}

}  // namespace

int main() {
    if (skip_without_avx512()) return 0;
    std::mt19937_64 rng(7);
    size_t cases = 0;
    for (unsigned w = 1; w <= 32; ++w) {
        for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000}) {
            std::vector<uint32_t> v(n);
            for (auto& x : v) x = uint32_t(rng() & ((uint64_t(1) << w) - 1));
            if (n) v[rng() % n] = uint32_t((uint64_t(1) << w) - 1);  // the widest value
            bool ok = unpacks<uint32_t>(v, w);
            if (ok && w <= 8) ok = unpacks<uint8_t>(v, w);
            if (!ok) {
                std::printf("FAIL unpack: width %u, %zu indices\n", w, n);
                return 1;
            }
            ++cases;
        }
    }
    for (int trial = 0; trial < 20000; ++trial) {
        const size_t count = trial % 4 == 0 ? 1 + rng() % 64 : 64;
        const double share = double(rng() % 101) / 100;
        uint64_t bits = 0;
        for (size_t j = 0; j < count; ++j)
            if (std::uniform_real_distribution<double>(0, 1)(rng) < share) bits |= uint64_t(1) << j;
        const size_t next = trial % 3 == 0 ? rng() % 4 : rng() % 100000;
        // Indices mostly valid (below the rows brought in before them), some at or just past the limit.
        std::vector<uint32_t> idx;
        size_t brought = next;
        for (size_t j = 0; j < count; ++j) {
            if (!((bits >> j) & 1)) {
                ++brought;
                continue;
            }
            const int kind = int(rng() % 50);
            const size_t limit = brought;
            idx.push_back(uint32_t(kind == 0 ? limit : kind == 1 ? limit + rng() % 3 : kind == 2 && limit ? limit - 1
                                   : limit ? rng() % limit : 0));
        }
        bool ok = sources_match<uint32_t>(bits, count, idx, next);
        if (ok && next + count <= 256) {
            bool fits = true;
            for (uint32_t x : idx) fits &= x < 256;
            if (fits) ok = sources_match<uint8_t>(bits, count, idx, next);
        }
        if (!ok) {
            std::printf("FAIL sources: bits %016llx, count %zu, next %zu\n", (unsigned long long)bits, count, next);
            return 1;
        }
        ++cases;
    }
    std::printf("ok: %zu cases\n", cases);
    return 0;
}
