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
#include "frame/codec.h"
#include "frame/plane_methods.h"
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
        d["period"] = info.period;
        d["methods"] = methods;
        return d;
    });

    // ---- section: data mover ----

    // ---- section: qat ----

    // ---- section: tiers ----
}
