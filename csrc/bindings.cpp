// The one binding layer between Python and the native core.
//
// Native functions return kvcore::Status; `check()` turns a failed Status into
// the matching Python exception from kvcore.errors. The GIL is released around
// all native work. Buffers cross as Python buffer objects (no libtorch here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "cpu/cpu_features.h"
#include "parallel/thread_pool.h"
#include "shuffle/shuffle.h"

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
    // Argument checks shared by the shuffle functions.
    struct ShuffleArgs {
        // A C-contiguous byte view of `obj` (any buffer-protocol object), held by `keep`.
        static MutableView view(const py::object& obj, const std::string& what, bool writable,
                                py::buffer_info& keep) {
            if (!PyObject_CheckBuffer(obj.ptr()))
                throw NativeError{Code::kInvalidArgument, what + " must be a bytes-like object"};
            const auto b = py::reinterpret_borrow<py::buffer>(obj);
            MutableView v{};
            if (writable) {
                if (b.request(false).readonly)  // a writable request on it would raise a bare BufferError
                    throw NativeError{Code::kInvalidArgument, what + " is read-only"};
                v = write_view(b, keep);
            } else {
                const ByteView r = read_view(b, keep);
                v = {const_cast<uint8_t*>(r.data), r.size};
            }
            if (!PyBuffer_IsContiguous(keep.view(), 'C'))
                throw NativeError{Code::kInvalidArgument, what + " must be C-contiguous"};
            return v;
        }

        // The transform options of shuffle_split/merge, validated; `keep` holds the residual buffer.
        static kvcore::shuffle::PlaneTransform transform(long elem_size, bool rotate, const py::object& residual,
                                                          long phase, py::buffer_info& keep) {
            if (elem_size != 1 && elem_size != 2 && elem_size != 4)
                throw NativeError{Code::kInvalidArgument,
                                  "elem_size must be 1, 2 or 4, got " + std::to_string(elem_size)};
            if (phase < 0) throw NativeError{Code::kInvalidArgument, "phase must be >= 0"};
            kvcore::shuffle::PlaneTransform t;
            t.rotate = rotate;
            if (residual.is_none()) {
                if (phase != 0) throw NativeError{Code::kInvalidArgument, "phase needs a residual"};
                return t;
            }
            const MutableView r = view(residual, "residual", false, keep);
            if (r.size == 0) throw NativeError{Code::kInvalidArgument, "residual must not be empty"};
            if (r.size > 0xffffffffu) throw NativeError{Code::kInvalidArgument, "residual longer than 2^32-1 bytes"};
            if (static_cast<size_t>(phase) >= r.size)
                throw NativeError{Code::kInvalidArgument, "phase " + std::to_string(phase) +
                                                              " must be < residual period " + std::to_string(r.size)};
            t.residual = r.data;
            t.period = static_cast<uint32_t>(r.size);
            t.phase = static_cast<uint32_t>(phase);
            return t;
        }

        static size_t elements(size_t bytes, long elem_size) {
            if (bytes % static_cast<size_t>(elem_size) != 0)
                throw NativeError{Code::kInvalidArgument, "buffer of " + std::to_string(bytes) +
                                                              " bytes is not a whole number of " +
                                                              std::to_string(elem_size) + "-byte elements"};
            return bytes / static_cast<size_t>(elem_size);
        }

        // Read views of `planes` (elem_size of them, equal lengths); returns the plane length.
        static size_t read_planes(const py::object& planes, long elem_size, std::vector<py::buffer_info>& keep,
                                   const uint8_t* ptrs[4]) {
            if (!py::isinstance<py::sequence>(planes) || PyObject_CheckBuffer(planes.ptr()))
                throw NativeError{Code::kInvalidArgument, "planes must be a list of bytes-like objects"};
            if (static_cast<long>(py::len(planes)) != elem_size)
                throw NativeError{Code::kInvalidArgument, "expected " + std::to_string(elem_size) + " planes, got " +
                                                              std::to_string(py::len(planes))};
            keep.resize(static_cast<size_t>(elem_size));
            size_t n = 0;
            for (long p = 0; p < elem_size; ++p) {
                const MutableView v = view(planes[py::int_(p)], "plane " + std::to_string(p), false, keep[p]);
                if (p == 0) n = v.size;
                else if (v.size != n)
                    throw NativeError{Code::kInvalidArgument, "planes differ in length (" + std::to_string(n) +
                                                                  " and " + std::to_string(v.size) + " bytes)"};
                ptrs[p] = v.data;
            }
            return n;
        }
    };
    m.def(
        "shuffle_split",
        [](py::object src, long elem_size, bool rotate, py::object residual, long phase) {
            py::buffer_info src_keep, res_keep;
            const auto t = ShuffleArgs::transform(elem_size, rotate, residual, phase, res_keep);
            const MutableView s = ShuffleArgs::view(src, "src", false, src_keep);
            const size_t n = ShuffleArgs::elements(s.size, elem_size);
            py::list out;
            uint8_t* ptrs[4] = {};
            for (long p = 0; p < elem_size; ++p) {
                PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
                if (b == nullptr) throw py::error_already_set();
                py::bytes obj = py::reinterpret_steal<py::bytes>(b);
                ptrs[p] = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(b));
                out.append(obj);
            }
            {
                py::gil_scoped_release nogil;
                kvcore::shuffle::split(s.data, n, static_cast<unsigned>(elem_size), t, ptrs);
            }
            return out;
        },
        py::arg("src"), py::arg("elem_size"), py::arg("rotate") = false, py::arg("residual") = py::none(),
        py::arg("phase") = 0,
        "Split elements of elem_size bytes (1, 2, 4) into elem_size byte planes; returns a list of bytes.");
    m.def(
        "shuffle_merge",
        [](py::object planes, long elem_size, bool rotate, py::object residual, long phase) {
            py::buffer_info res_keep;
            const auto t = ShuffleArgs::transform(elem_size, rotate, residual, phase, res_keep);
            std::vector<py::buffer_info> keep;
            const uint8_t* ptrs[4] = {};
            const size_t n = ShuffleArgs::read_planes(planes, elem_size, keep, ptrs);
            PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n * elem_size));
            if (b == nullptr) throw py::error_already_set();
            py::bytes out = py::reinterpret_steal<py::bytes>(b);
            uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(b));
            {
                py::gil_scoped_release nogil;
                kvcore::shuffle::merge(ptrs, n, static_cast<unsigned>(elem_size), t, dst);
            }
            return out;
        },
        py::arg("planes"), py::arg("elem_size"), py::arg("rotate") = false, py::arg("residual") = py::none(),
        py::arg("phase") = 0, "Inverse of shuffle_split: interleave elem_size planes into one bytes object.");
    m.def(
        "shuffle_split_into",
        [](py::object src, long elem_size, bool rotate, py::object residual, long phase, py::object planes_out) {
            py::buffer_info src_keep, res_keep;
            const auto t = ShuffleArgs::transform(elem_size, rotate, residual, phase, res_keep);
            const MutableView s = ShuffleArgs::view(src, "src", false, src_keep);
            const size_t n = ShuffleArgs::elements(s.size, elem_size);
            if (!py::isinstance<py::sequence>(planes_out) || PyObject_CheckBuffer(planes_out.ptr()))
                throw NativeError{Code::kInvalidArgument, "planes_out must be a list of writable buffers"};
            if (static_cast<long>(py::len(planes_out)) != elem_size)
                throw NativeError{Code::kInvalidArgument, "expected " + std::to_string(elem_size) +
                                                              " output planes, got " +
                                                              std::to_string(py::len(planes_out))};
            std::vector<py::buffer_info> keep(static_cast<size_t>(elem_size));
            uint8_t* ptrs[4] = {};
            for (long p = 0; p < elem_size; ++p) {
                const MutableView v =
                    ShuffleArgs::view(planes_out[py::int_(p)], "output plane " + std::to_string(p), true, keep[p]);
                if (v.size != n)
                    throw NativeError{Code::kInvalidArgument, "output plane " + std::to_string(p) + " has " +
                                                                  std::to_string(v.size) + " bytes, needs " +
                                                                  std::to_string(n)};
                ptrs[p] = v.data;
            }
            py::gil_scoped_release nogil;
            kvcore::shuffle::split(s.data, n, static_cast<unsigned>(elem_size), t, ptrs);
        },
        py::arg("src"), py::arg("elem_size"), py::arg("rotate"), py::arg("residual"), py::arg("phase"),
        py::arg("planes_out"), "shuffle_split into given writable buffers (each exactly len(src)/elem_size bytes).");
    m.def(
        "shuffle_merge_into",
        [](py::object planes, long elem_size, bool rotate, py::object residual, long phase, py::object dst) {
            py::buffer_info res_keep, dst_keep;
            const auto t = ShuffleArgs::transform(elem_size, rotate, residual, phase, res_keep);
            std::vector<py::buffer_info> keep;
            const uint8_t* ptrs[4] = {};
            const size_t n = ShuffleArgs::read_planes(planes, elem_size, keep, ptrs);
            const MutableView d = ShuffleArgs::view(dst, "dst", true, dst_keep);
            if (d.size != n * static_cast<size_t>(elem_size))
                throw NativeError{Code::kInvalidArgument, "dst has " + std::to_string(d.size) + " bytes, needs " +
                                                              std::to_string(n * elem_size)};
            py::gil_scoped_release nogil;
            kvcore::shuffle::merge(ptrs, n, static_cast<unsigned>(elem_size), t, d.data);
        },
        py::arg("planes"), py::arg("elem_size"), py::arg("rotate"), py::arg("residual"), py::arg("phase"),
        py::arg("dst"), "shuffle_merge into a given writable buffer of exactly len(plane)*elem_size bytes.");

    // ---- section: entropy: huffman ----

    // ---- section: entropy: fastcode ----

    // ---- section: codec ----

    // ---- section: data mover ----

    // ---- section: qat ----

    // ---- section: tiers ----
}
