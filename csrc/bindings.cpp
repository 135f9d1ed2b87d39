// The one binding layer between Python and the native core.
//
// Native functions return kvcore::Status; `check()` turns a failed Status into
// the matching Python exception from kvcore.errors. The GIL is released around
// all native work. Buffers cross as Python buffer objects (no libtorch here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "common/status.h"
#include "cpu/cpu_features.h"
#include "entropy/fastcode.h"
#include "parallel/thread_pool.h"

namespace py = pybind11;

namespace {

using kvcore::Code;
using kvcore::Status;

// Raised by check(), translated to kvcore.errors.<class> by the translator below.
struct NativeError {
    Code code;
    std::string message;
};

const char* error_class_name(Code code) {
    switch (code) {
        case Code::kInvalidArgument: return "InvalidArgumentError";
        case Code::kCorruptFrame: return "CorruptFrameError";
        case Code::kBufferTooSmall: return "BufferTooSmallError";
        case Code::kUnsupported: return "UnsupportedError";
        case Code::kOutOfMemory: return "OutOfMemoryError";
        case Code::kPoolExhausted: return "PoolExhausted";
        case Code::kTimeout: return "TimeoutError";
        case Code::kIoError: return "IOError";
        case Code::kBackendError: return "BackendError";
        case Code::kOk: break;
    }
    return "KVCoreError";
}

void check(const Status& st) {
    if (!st.is_ok()) throw NativeError{st.code, st.message};
}

// A contiguous byte view of any buffer-protocol object.
struct ByteView {
    const uint8_t* data;
    size_t size;
};

ByteView read_view(const py::buffer& b, py::buffer_info& keep) {
    keep = b.request(false);
    if (keep.ndim > 1 && keep.strides.back() != keep.itemsize)
        throw NativeError{Code::kInvalidArgument, "buffer must be C-contiguous"};
    return {static_cast<const uint8_t*>(keep.ptr), static_cast<size_t>(keep.size * keep.itemsize)};
}

struct MutableView {
    uint8_t* data;
    size_t size;
};

MutableView write_view(const py::buffer& b, py::buffer_info& keep) {
    keep = b.request(true);
    if (keep.readonly) throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
    return {static_cast<uint8_t*>(keep.ptr), static_cast<size_t>(keep.size * keep.itemsize)};
}

unsigned thread_count(const py::object& threads) {
    if (threads.is_none()) return 0;  // all cores
    const long n = threads.cast<long>();
    if (n < 1) throw NativeError{Code::kInvalidArgument, "threads must be >= 1"};
    return static_cast<unsigned>(n);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "kvcore native core";

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const NativeError& e) {
            py::object errors = py::module_::import("kvcore.errors");
            py::object cls = errors.attr(error_class_name(e.code));
            PyErr_SetString(cls.ptr(), e.message.c_str());
        }
    });

    // ---- section: cpu features and threads ----
    m.def("detected_isa", &kvcore::cpu::detected_isa);
    m.def("active_isa", &kvcore::cpu::active_isa);
    m.def("isa_variant", [] { return std::string(kvcore::cpu::variant_name(kvcore::cpu::active_isa())); });
    m.def("set_disabled_isa", [](const std::string& list) {
        uint32_t mask = 0;
        if (!kvcore::cpu::parse_isa_list(list, &mask))
            throw NativeError{Code::kInvalidArgument, "unknown ISA name in '" + list + "' (known: avx2, avx512)"};
        kvcore::cpu::set_disabled_isa(mask);
    });
    m.def("hardware_threads", &kvcore::hardware_threads);

    // ---- section: shuffle ----

    // ---- section: entropy: huffman ----

    // ---- section: entropy: fastcode ----
    // Byte views that refuse strided buffers of any rank (read_view checks only
    // rank > 1) and read-only outputs, with clear errors.
    static const auto fastcode_check_contiguous = [](const py::buffer_info& info) {
        py::ssize_t expect = info.itemsize;
        for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
            if (info.shape[d] > 1 && info.strides[d] != expect)
                throw NativeError{Code::kInvalidArgument, "buffer must be C-contiguous"};
            expect *= info.shape[d];
        }
    };
    static const auto fastcode_in_view = [](const py::buffer& in, py::buffer_info& keep) {
        const ByteView view = read_view(in, keep);
        fastcode_check_contiguous(keep);
        return view;
    };
    static const auto fastcode_out_view = [](const py::buffer& out, py::buffer_info& keep) {
        const py::buffer_info probe = out.request(false);
        if (probe.readonly) throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
        fastcode_check_contiguous(probe);
        return write_view(out, keep);
    };
    m.def("fastcode_bound", &kvcore::entropy::fastcode_bound, py::arg("n"));
    m.def(
        "fastcode_encode",
        [](const py::buffer& src, unsigned width, const py::object& cap) {
            py::buffer_info keep;
            const ByteView in = fastcode_in_view(src, keep);
            const size_t bound = kvcore::entropy::fastcode_bound(in.size);
            // Default capacity: the stream must be smaller than the input.
            size_t limit = in.size ? in.size - 1 : 0;
            if (!cap.is_none()) {
                const long long c = cap.cast<long long>();
                if (c < 0) throw NativeError{Code::kInvalidArgument, "cap must be >= 0"};
                limit = static_cast<size_t>(c);
            }
            std::string out(std::min(limit, bound), '\0');
            size_t written = 0;
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::fastcode_encode_width(in.data, in.size, nullptr, width,
                                                            reinterpret_cast<uint8_t*>(out.data()), out.size(),
                                                            &written);
            }
            check(st);
            return py::bytes(out.data(), written);
        },
        py::arg("src"), py::arg("width") = 0, py::arg("cap") = py::none(),
        "Encodes a byte plane; BufferTooSmallError unless the stream is smaller than the input\n"
        "(or fits `cap`). width: 0 = smallest stream, 1..7 forces the code width.");
    m.def(
        "fastcode_decode",
        [](const py::buffer& stream, long long n) {
            if (n < 0) throw NativeError{Code::kInvalidArgument, "n must be >= 0"};
            py::buffer_info keep;
            const ByteView in = fastcode_in_view(stream, keep);
            // every symbol takes >= 1 bit of the stream: refuse impossible sizes before allocating
            if (static_cast<unsigned long long>(n) / 8 > in.size + 64)
                throw NativeError{Code::kCorruptFrame, "fastcode: stream too short for " + std::to_string(n) + " symbols"};
            py::bytes out(nullptr, static_cast<size_t>(n));
            uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out.ptr()));
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::fastcode_decode(in.data, in.size, dst, static_cast<size_t>(n));
            }
            check(st);
            return out;
        },
        py::arg("stream"), py::arg("n"));
    m.def(
        "fastcode_decode_into",
        [](const py::buffer& stream, const py::buffer& out) {
            py::buffer_info keep_in, keep_out;
            const ByteView in = fastcode_in_view(stream, keep_in);
            const MutableView dst = fastcode_out_view(out, keep_out);
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::fastcode_decode(in.data, in.size, dst.data, dst.size);
            }
            check(st);
        },
        py::arg("stream"), py::arg("out"));
    m.def(
        "fastcode_decode_merge16",
        [](const py::buffer& stream, const py::buffer& other, const py::buffer& out, int how) {
            if (how != 0 && how != 1) throw NativeError{Code::kInvalidArgument, "how must be 0 (high byte) or 1 (bf16 exponent)"};
            py::buffer_info keep_in, keep_other, keep_out;
            const ByteView in = fastcode_in_view(stream, keep_in);
            const ByteView plane = fastcode_in_view(other, keep_other);
            const MutableView dst = fastcode_out_view(out, keep_out);
            if (dst.size != 2 * plane.size)
                throw NativeError{Code::kInvalidArgument, "out must hold 2 bytes per symbol of `other`"};
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::fastcode_decode_merge16(in.data, in.size, plane.data, dst.data, plane.size,
                                                              static_cast<kvcore::entropy::Merge16>(how));
            }
            check(st);
        },
        py::arg("stream"), py::arg("other"), py::arg("out"), py::arg("how") = 0,
        "Decodes a fastcode plane and merges it with the raw plane `other` into 16-bit elements in `out`\n"
        "(how 0: plane = high byte; 1: bf16 exponent field, other = sign << 7 | mantissa).");

    // ---- section: codec ----

    // ---- section: data mover ----

    // ---- section: qat ----

    // ---- section: tiers ----
}
