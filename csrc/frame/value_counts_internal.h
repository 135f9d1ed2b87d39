// Internals of frame/value_counts: the ISA variants, for value_counts.cpp's
// dispatch and the test that compares them (tests/native/value_counts_check.cpp),
// and the SSE2 pieces the wider variants share.
#pragma once

#include <cstdint>

#include "frame/value_counts.h"

namespace kvcore::frame::detail {

ValueCounts value_counts_sse2(const uint8_t* bytes, uint8_t* value, uint8_t* count);
ValueCounts value_counts_avx2(const uint8_t* bytes, uint8_t* value, uint8_t* count);
ValueCounts value_counts_avx512(const uint8_t* bytes, uint8_t* value, uint8_t* count);

// Up to this many values (hi - lo < kCompareRange), a range is counted by one
// compare per value: no memory writes, so the fast way while it is narrow. Wider
// ones, by count tables (SSE2) or a sort (AVX2, AVX-512); the AVX-512 compare
// covers a narrower range of its own.
constexpr unsigned kCompareRange = 24;

// The smallest and largest of the bytes.
void byte_range(const uint8_t* bytes, unsigned* lo, unsigned* hi);

// The counts of a range [lo, hi] that holds every byte, one compare per value.
ValueCounts count_by_compare(const uint8_t* bytes, unsigned lo, unsigned hi, uint8_t* value, uint8_t* count);

}  // namespace kvcore::frame::detail
