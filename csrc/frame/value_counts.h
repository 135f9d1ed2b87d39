// The distinct values of a channel's sampled top bytes and how often each
// occurs, for the layout analysis (frame/analysis.cpp): kValueCountBytes bytes
// in, their distinct values in increasing order out, with each one's count and
// which of them is the mode (the most common, the smallest on ties). Every
// variant gives the same lists, so a frame does not depend on the CPU.
#pragma once

#include <cstdint>

namespace kvcore::frame {

constexpr unsigned kValueCountBytes = 64;

struct ValueCounts {
    unsigned distinct;  // entries of value[] and count[] in use
    unsigned mode;      // index of the mode in value[]
};

// value[] and count[] hold kValueCountBytes entries each (a kernel may write all of them).
using ValueCountsKernel = ValueCounts (*)(const uint8_t* bytes, uint8_t* value, uint8_t* count);

// The widest variant the active ISA allows (cpu::active_isa()): look it up once per analysis.
ValueCountsKernel value_counts_kernel();

}  // namespace kvcore::frame
