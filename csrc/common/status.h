// Status codes of the native core. Native functions never throw across module
// boundaries: they return a Status, and the binding turns it into the matching
// Python exception (kvcore.errors).
#pragma once

#include <string>

namespace kvcore {

enum class Code : int {
    kOk = 0,
    kInvalidArgument,   // caller error: bad size, dtype, shape, option
    kCorruptFrame,      // frame bytes fail a structural or checksum check
    kBufferTooSmall,    // destination capacity below what is needed
    kUnsupported,       // feature or backend not available on this machine
    kOutOfMemory,
    kPoolExhausted,     // bounded pool has no block of that size
    kTimeout,
    kIoError,
    kBackendError,      // an optional backend (QAT, DSA, CUDA) reported a failure
    kDeviceTimeout,     // a device did not finish in time: it may still read and write the buffers
};

struct Status {
    Code code = Code::kOk;
    std::string message;

    static Status ok() { return {}; }
    bool is_ok() const { return code == Code::kOk; }
};

inline Status make_status(Code code, std::string message) { return Status{code, std::move(message)}; }
inline Status corrupt(std::string message) { return Status{Code::kCorruptFrame, std::move(message)}; }
inline Status invalid(std::string message) { return Status{Code::kInvalidArgument, std::move(message)}; }

// Propagate a non-ok Status to the caller.
#define KVCORE_RETURN_IF_ERROR(expr)                 \
    do {                                             \
        ::kvcore::Status _kvcore_st = (expr);        \
        if (!_kvcore_st.is_ok()) return _kvcore_st;  \
    } while (0)

}  // namespace kvcore
