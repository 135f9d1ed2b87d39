// Intel QAT compression through QATzip, loaded at run time.
//
// kvcore never links QATzip: `load()` opens libqatzip.so.3 (or a library the
// caller names, such as the test double in tests/native/) with dlopen, looks up
// the few entry points kvcore needs and probes for hardware with QATzip's
// software backup switched off, so that "no hardware" is certain
// (QZ_NOSW_NO_HW) rather than hidden behind QATzip's zlib fallback. Without
// hardware, callers use kvcore's own software DEFLATE (ISA-L, deflate/), which
// is faster than that fallback.
//
// Sessions: one QATzip session per thread (thread_local), set up on first use
// for raw DEFLATE (QZ_DEFLATE_RAW), software backup off, and torn down when the
// thread exits or when another library is loaded. Each call's return code and
// extended return code are checked and counted, so status() tells whether QAT
// really ran (kvcore.features(), metrics).
//
// Pinned buffers: when the device needs physically contiguous memory (no SVM),
// QATzip copies every input that did not come from its own allocator (qzMalloc)
// into its pinned hardware buffers before submission, and copies the output back
// the same way: one extra memcpy of the input and of the output per request, at
// memory bandwidth (about 0.2 ms per MiB at 5 GB/s) and one pinned staging
// buffer per hardware buffer. pinned_alloc() below lets the data mover's pool
// take its slabs from qzMalloc instead, which removes both copies.
//
// A loaded library is never unloaded (dlclose): thread-exit teardown of
// sessions may still call into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace kvcore::qat {

// Largest piece handed to QATzip in one call: QATzip's default hardware buffer
// (QZ_HW_BUFF_SZ, 64 KiB). Larger inputs are split by the caller (deflate/).
constexpr uint32_t kHwBufferBytes = 64 * 1024;

struct LoadOptions {
    std::string library_path;   // empty: "libqatzip.so.3" from the loader's search path
    uint32_t min_bytes = 4096;  // backend auto: pieces smaller than this stay in software
};

// Opens the library, resolves the entry points and probes for hardware. A
// library that cannot be opened or lacks an entry point gives kUnsupported and
// leaves no library loaded. A library without hardware loads fine: status()
// says hardware=false and why (probe_code).
Status load(const LoadOptions& options);
// Forgets the loaded library (sessions of it are torn down lazily; no dlclose).
void unload();
// Loads "libqatzip.so.3" once if neither load() nor unload() was called before.
void ensure_default_loaded();

struct Counters {
    uint64_t hw_compress_calls = 0;    // successful QATzip compress calls run by hardware
    uint64_t hw_decompress_calls = 0;  // same, decompress
    uint64_t hw_bytes_in = 0;          // original bytes compressed by hardware
    uint64_t hw_bytes_out = 0;         // compressed bytes it produced
    uint64_t sw_execution_calls = 0;   // calls QATzip reports as run in software (ext_rc)
    uint64_t fallback_pieces = 0;      // pieces kvcore coded in software instead (auto)
    uint64_t buf_errors = 0;           // QZ_BUF_ERROR
    uint64_t data_errors = 0;          // QZ_DATA_ERROR
    uint64_t other_errors = 0;         // any other failing return code
    uint64_t sessions_opened = 0;
    uint64_t sessions_closed = 0;
};

struct StatusReport {
    bool loaded = false;
    bool hardware = false;  // the probe attached to a QAT instance
    std::string library;    // path given to dlopen
    std::string message;    // why not loaded / no hardware
    int probe_code = 0;     // QATzip's return code of the probe (qzInit, software backup off)
    uint32_t hw_buffer_bytes = kHwBufferBytes;
    uint32_t min_bytes = 0;
    bool has_ext_api = false;  // qzCompressExt/qzDecompressExt present
    Counters counters;
    int last_error_code = 0;   // QATzip code of the last failing call (0: none)
};

StatusReport status();
void reset_counters();
// True when a library is loaded and the probe found hardware.
bool hardware_available();
uint32_t min_bytes();

// Compresses n <= kHwBufferBytes bytes into one raw DEFLATE stream (final block
// set) with this thread's session. kUnsupported: no hardware (nothing counted as
// an error); kBufferTooSmall: QZ_BUF_ERROR; kBackendError: any other failure
// (message names the QATzip code).
Status compress_piece(const uint8_t* src, uint32_t n, uint8_t* dst, uint32_t cap, int level, uint32_t* written);

// Decompresses one raw DEFLATE stream of src_size bytes into exactly n bytes.
// kCorruptFrame: QZ_DATA_ERROR, or the stream did not consume src_size bytes or
// produce n bytes; kUnsupported / kBackendError as above.
Status decompress_piece(const uint8_t* src, uint32_t src_size, uint8_t* dst, uint32_t n);

// Counts a piece that kvcore coded in software although QAT was asked for (auto).
void count_fallback();

// ---- Allocator hook for the data mover's pinned pool ----
// Allocates `bytes` of pinned, physically contiguous memory from QATzip
// (qzMalloc(bytes, numa_node, PINNED_MEM)) when QAT hardware is present, so that
// QATzip submits buffers from it without copying. Returns nullptr when QAT is
// absent or the allocation fails: the pool then uses its own allocator.
// numa_node < 0 lets QATzip pick. Free with pinned_free().
void* pinned_alloc(size_t bytes, int numa_node);
// Frees memory from pinned_alloc() (qzFree). nullptr is ignored.
void pinned_free(void* p);
// True when p lies in memory QATzip allocated pinned (qzMemFindAddr).
bool is_pinned(const void* p);

}  // namespace kvcore::qat
