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
#include "entropy/fastcode.h"
#include "entropy/huffman.h"
#include "frame/codec.h"
#include "frame/plane_methods.h"
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

bool c_contiguous(const py::buffer_info& info) {
    py::ssize_t expected = info.itemsize;
    for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
        if (info.shape[i] != 1 && info.strides[i] != expected) return false;
        expected *= info.shape[i];
    }
    return true;
}

py::buffer_info request(const py::buffer& b, bool writable) {
    try {
        return b.request(writable);
    } catch (const py::error_already_set& e) {
        throw NativeError{Code::kInvalidArgument,
                          std::string(writable ? "output must be a writable buffer: " : "not a buffer: ") + e.what()};
    }
}

// A contiguous byte view of any buffer-protocol object.
struct ByteView {
    const uint8_t* data;
    size_t size;
};

ByteView read_view(const py::buffer& b, py::buffer_info& keep) {
    keep = request(b, false);
    if (!c_contiguous(keep)) throw NativeError{Code::kInvalidArgument, "buffer must be C-contiguous"};
    return {static_cast<const uint8_t*>(keep.ptr), static_cast<size_t>(keep.size * keep.itemsize)};
}

struct MutableView {
    uint8_t* data;
    size_t size;
};

MutableView write_view(const py::buffer& b, py::buffer_info& keep) {
    keep = request(b, true);
    if (keep.readonly) throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
    if (!c_contiguous(keep)) throw NativeError{Code::kInvalidArgument, "output buffer must be C-contiguous"};
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
    // A writable, C-contiguous view (clear errors for read-only and strided outputs).
    static const auto fastcode_out_view = [](const py::buffer& out, py::buffer_info& keep) {
        const py::buffer_info probe = out.request(false);
        if (probe.readonly) throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
        py::ssize_t expect = probe.itemsize;
        for (py::ssize_t d = probe.ndim - 1; d >= 0; --d) {
            if (probe.shape[d] > 1 && probe.strides[d] != expect)
                throw NativeError{Code::kInvalidArgument, "output buffer must be C-contiguous"};
            expect *= probe.shape[d];
        }
        return write_view(out, keep);
    };
    m.def("fastcode_bound", &kvcore::entropy::fastcode_bound, py::arg("n"));
    m.def(
        "fastcode_encode",
        [](const py::buffer& src, unsigned width, const py::object& cap) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
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
            const ByteView in = read_view(stream, keep);
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
            const ByteView in = read_view(stream, keep_in);
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
            const ByteView in = read_view(stream, keep_in);
            const ByteView plane = read_view(other, keep_other);
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
    namespace fr = kvcore::frame;
    m.def(
        "max_frame_size",
        [](uint8_t dtype, std::vector<uint64_t> shape, uint32_t block_bytes) {
            if (!fr::dtype_valid(dtype) || shape.size() > fr::kMaxDims)
                throw NativeError{Code::kInvalidArgument, "invalid dtype or rank"};
            return fr::max_frame_size(fr::TensorDesc{static_cast<fr::DType>(dtype), std::move(shape)}, block_bytes);
        },
        py::arg("dtype"), py::arg("shape"), py::arg("block_bytes") = 0);
    m.def(
        "compress",
        [](const py::buffer& src, uint8_t dtype, std::vector<uint64_t> shape, uint8_t mode, uint8_t backend,
           bool deflate, uint32_t block_bytes, const py::object& threads) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            if (!fr::dtype_valid(dtype)) throw NativeError{Code::kInvalidArgument, "unknown dtype code"};
            if (shape.size() > fr::kMaxDims) throw NativeError{Code::kInvalidArgument, "rank above 8"};
            if (mode > 1 || backend > 2) throw NativeError{Code::kInvalidArgument, "unknown mode or backend"};
            fr::TensorDesc desc{static_cast<fr::DType>(dtype), std::move(shape)};
            fr::EncodeOptions options;
            options.mode = static_cast<fr::Mode>(mode);
            options.backend = static_cast<fr::Backend>(backend);
            options.deflate = deflate;
            options.block_bytes = block_bytes;
            options.threads = thread_count(threads);
            // Validated before sizing the output, so a bad shape cannot ask for a huge buffer.
            uint64_t elems = 1;
            for (uint64_t d : desc.shape) {
                if (d != 0 && elems > UINT64_MAX / 16 / d) throw NativeError{Code::kInvalidArgument, "tensor too large"};
                elems *= d;
            }
            if (elems * fr::dtype_size(desc.dtype) != in.size)
                throw NativeError{Code::kInvalidArgument, "buffer size does not match shape and dtype"};
            const size_t cap = fr::max_frame_size(desc, block_bytes);
            PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(cap));
            if (raw == nullptr) throw py::error_already_set();
            py::object frame = py::reinterpret_steal<py::object>(raw);
            size_t written = 0;
            Status st;
            {
                py::gil_scoped_release release;
                st = fr::compress(in.data, in.size, desc, options,
                                  reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw)), cap, &written);
            }
            check(st);
            PyObject* shrunk = frame.release().ptr();
            if (_PyBytes_Resize(&shrunk, static_cast<Py_ssize_t>(written)) != 0) throw py::error_already_set();
            return py::reinterpret_steal<py::bytes>(shrunk);
        },
        py::arg("src"), py::arg("dtype"), py::arg("shape"), py::arg("mode") = 0, py::arg("backend") = 0,
        py::arg("deflate") = false, py::arg("block_bytes") = 0, py::arg("threads") = py::none());
    m.def(
        "decompress_into",
        [](const py::buffer& frame, const py::buffer& out, const py::object& threads) {
            py::buffer_info keep_in, keep_out;
            const ByteView in = read_view(frame, keep_in);
            const MutableView dst = write_view(out, keep_out);
            const unsigned n_threads = thread_count(threads);
            Status st;
            {
                py::gil_scoped_release release;
                st = fr::decompress(in.data, in.size, dst.data, dst.size, n_threads);
            }
            check(st);
        },
        py::arg("frame"), py::arg("out"), py::arg("threads") = py::none());
    m.def("frame_desc", [](const py::buffer& frame) {
        py::buffer_info keep;
        const ByteView in = read_view(frame, keep);
        fr::TensorDesc desc;
        check(fr::read_desc(in.data, in.size, &desc));
        return py::make_tuple(static_cast<int>(desc.dtype), py::tuple(py::cast(desc.shape)));
    });
    m.def("frame_info", [](const py::buffer& frame) {
        py::buffer_info keep;
        const ByteView in = read_view(frame, keep);
        fr::FrameInfo info;
        Status st;
        {
            py::gil_scoped_release release;
            st = fr::read_info(in.data, in.size, &info);
        }
        check(st);
        py::dict methods;
        for (unsigned mth = 0; mth < info.method_counts.size(); ++mth) {
            if (info.method_counts[mth] == 0) continue;
            methods[fr::method_name(static_cast<uint8_t>(mth))] =
                py::dict(py::arg("planes") = info.method_counts[mth], py::arg("bytes") = info.method_bytes[mth]);
        }
        py::dict d;
        d["version"] = info.version;
        d["dtype_code"] = static_cast<int>(info.desc.dtype);
        d["shape"] = py::tuple(py::cast(info.desc.shape));
        d["original_bytes"] = info.original_bytes;
        d["frame_bytes"] = info.frame_bytes;
        d["block_elems"] = info.block_elems;
        d["n_blocks"] = info.n_blocks;
        d["flags"] = info.flags;
        d["channels"] = info.channels;
        d["methods"] = methods;
        return d;
    });

    // ---- section: data mover ----

    // ---- section: qat ----

    // ---- section: tiers ----
}
