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
#include "entropy/huffman.h"
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
    // read_view/write_view accept 1-D strided views (a[::2], a[::-1]); the coder needs
    // the bytes contiguous, so its bindings check C-contiguity of every dimension.
    static const auto huff_contiguous = [](const py::buffer_info& info) {
        py::ssize_t expected = info.itemsize;
        for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
            if (info.shape[size_t(i)] != 1 && info.strides[size_t(i)] != expected)
                throw NativeError{Code::kInvalidArgument, "buffer must be C-contiguous"};
            expected *= info.shape[size_t(i)];
        }
    };
    m.def("huffman_bound", &kvcore::entropy::huffman_bound, py::arg("n"),
          "Largest stream huffman_encode produces for n symbols.");
    m.def(
        "huffman_encode",
        [](const py::buffer& src) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            huff_contiguous(keep);
            // Encode straight into a bytes object of the bound size, then shrink it in place.
            const size_t cap = kvcore::entropy::huffman_bound(in.size);
            PyObject* raw = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(cap));
            if (!raw) throw py::error_already_set();
            uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
            size_t written = 0;
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::huffman_encode(in.data, in.size, nullptr, dst, cap, &written);
            }
            if (!st.is_ok()) {
                Py_DECREF(raw);
                check(st);
            }
            if (_PyBytes_Resize(&raw, Py_ssize_t(written)) != 0) throw py::error_already_set();
            return py::reinterpret_steal<py::bytes>(raw);
        },
        py::arg("src"), "Huffman-codes a byte buffer (order-0, canonical, 4 streams); returns the stream.");
    m.def(
        "huffman_decode",
        [](const py::buffer& stream, long long n) {
            if (n < 0) throw NativeError{Code::kInvalidArgument, "n must be >= 0"};
            py::buffer_info keep;
            const ByteView in = read_view(stream, keep);
            huff_contiguous(keep);
            py::object out = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(nullptr, Py_ssize_t(n)));
            if (!out) throw py::error_already_set();
            uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out.ptr()));
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::huffman_decode(in.data, in.size, dst, size_t(n));
            }
            check(st);
            return out;
        },
        py::arg("stream"), py::arg("n"), "Decodes exactly n symbols from a huffman_encode stream.");
    m.def(
        "huffman_decode_into",
        [](const py::buffer& stream, const py::buffer& out) {
            py::buffer_info keep_in, keep_out;
            const ByteView in = read_view(stream, keep_in);
            huff_contiguous(keep_in);
            if (out.request(false).readonly)  // request(true) would raise a plain BufferError
                throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
            const MutableView o = write_view(out, keep_out);
            huff_contiguous(keep_out);
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::huffman_decode(in.data, in.size, o.data, o.size);
            }
            check(st);
        },
        py::arg("stream"), py::arg("out"), "Decodes len(out) symbols into a writable buffer.");
    m.def(
        "huffman_estimate",
        [](const py::buffer& src) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            huff_contiguous(keep);
            if (in.size > UINT32_MAX) throw NativeError{Code::kInvalidArgument, "buffer larger than 2^32-1 bytes"};
            size_t size = 0;
            {
                py::gil_scoped_release release;
                uint32_t hist[256];
                kvcore::entropy::histogram(in.data, in.size, hist);
                size = kvcore::entropy::huffman_estimate(hist, in.size);
            }
            return size;
        },
        py::arg("src"), "Upper bound (exact + <= 3 bytes) of len(huffman_encode(src)), without coding.");
    m.def(
        "byte_histogram",
        [](const py::buffer& src) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            huff_contiguous(keep);
            if (in.size > UINT32_MAX) throw NativeError{Code::kInvalidArgument, "buffer larger than 2^32-1 bytes"};
            uint32_t hist[256];
            {
                py::gil_scoped_release release;
                kvcore::entropy::histogram(in.data, in.size, hist);
            }
            std::vector<uint64_t> v(hist, hist + 256);
            return v;
        },
        py::arg("src"), "Counts of each byte value (256 ints).");

    // ---- section: entropy: fastcode ----

    // ---- section: codec ----

    // ---- section: data mover ----

    // ---- section: qat ----

    // ---- section: tiers ----
}
