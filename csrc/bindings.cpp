// The one binding layer between Python and the native core.
//
// Native functions return kvcore::Status; `check()` turns a failed Status into
// the matching Python exception from kvcore.errors. The GIL is released around
// all native work. Buffers cross as Python buffer objects (no libtorch here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/status.h"
#include "cpu/cpu_features.h"
#include "deflate/deflate_plane.h"
#include "parallel/thread_pool.h"
#include "qat/qat.h"

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

    // ---- section: data mover ----

    // ---- section: qat ----
    {
        using kvcore::frame::Backend;
        auto parse_backend = [](const std::string& name) {
            if (name == "auto") return Backend::kAuto;
            if (name == "software") return Backend::kSoftware;
            if (name == "qat") return Backend::kQat;
            throw NativeError{Code::kInvalidArgument, "backend must be 'auto', 'software' or 'qat', not '" + name + "'"};
        };
        auto report_dict = [](const kvcore::deflate::EncodeReport& r) {
            py::dict d;
            d["pieces"] = r.pieces;
            d["qat_pieces"] = r.qat_pieces;
            d["software_pieces"] = r.software_pieces;
            d["stored_pieces"] = r.stored_pieces;
            d["fallback_pieces"] = r.fallback_pieces;
            return d;
        };
        auto encode = [parse_backend](const py::buffer& src, const std::string& backend, int level,
                                      const py::object& threads, const py::object& max_bytes,
                                      kvcore::deflate::EncodeReport* rep) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            const Backend be = parse_backend(backend);
            const unsigned nthreads = thread_count(threads);
            const size_t bound = kvcore::deflate::deflate_plane_bound(in.size);
            size_t cap = bound;
            if (!max_bytes.is_none()) {
                const long long m = max_bytes.cast<long long>();
                if (m < 0) throw NativeError{Code::kInvalidArgument, "max_bytes must be >= 0"};
                cap = std::min(bound, static_cast<size_t>(m));
            }
            std::vector<uint8_t> out;
            size_t written = 0;
            {
                py::gil_scoped_release release;
                out.resize(std::max<size_t>(cap, 1));
                check(kvcore::deflate::deflate_plane_encode(in.data, in.size, be, level, out.data(), cap, &written,
                                                            rep, nthreads));
            }
            return py::bytes(reinterpret_cast<const char*>(out.data()), written);
        };
        m.def("deflate_plane_bound", &kvcore::deflate::deflate_plane_bound, py::arg("n"),
              "Largest payload deflate_plane_encode writes for n input bytes.");
        m.def(
            "deflate_plane_encode",
            [encode](const py::buffer& src, const std::string& backend, int level, const py::object& threads,
                     const py::object& max_bytes) { return encode(src, backend, level, threads, max_bytes, nullptr); },
            py::arg("src"), py::arg("backend") = "auto", py::arg("level") = 1, py::arg("threads") = py::none(),
            py::arg("max_bytes") = py::none(),
            "Codes bytes as a deflate plane payload (piece table + raw DEFLATE pieces); BufferTooSmallError "
            "when it would exceed max_bytes.");
        m.def(
            "deflate_plane_encode_report",
            [encode, report_dict](const py::buffer& src, const std::string& backend, int level,
                                  const py::object& threads) {
                kvcore::deflate::EncodeReport rep;
                py::bytes payload = encode(src, backend, level, threads, py::none(), &rep);
                return py::make_tuple(payload, report_dict(rep));
            },
            py::arg("src"), py::arg("backend") = "auto", py::arg("level") = 1, py::arg("threads") = py::none(),
            "deflate_plane_encode, also returning how each piece was coded.");
        m.def(
            "deflate_plane_decode",
            [parse_backend](const py::buffer& payload, long long n, const std::string& backend,
                            const py::object& threads) {
                if (n < 0) throw NativeError{Code::kInvalidArgument, "n must be >= 0"};
                py::buffer_info keep;
                const ByteView in = read_view(payload, keep);
                const Backend be = parse_backend(backend);
                const unsigned nthreads = thread_count(threads);
                py::bytes out(nullptr, static_cast<size_t>(n));
                uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AsString(out.ptr()));
                {
                    py::gil_scoped_release release;
                    check(kvcore::deflate::deflate_plane_decode(in.data, in.size, dst, static_cast<size_t>(n), be,
                                                                nthreads));
                }
                return out;
            },
            py::arg("payload"), py::arg("n"), py::arg("backend") = "software", py::arg("threads") = py::none(),
            "Decodes a deflate plane payload into exactly n bytes (CorruptFrameError otherwise).");

        auto status_dict = [] {
            kvcore::qat::StatusReport s;
            {
                py::gil_scoped_release release;
                s = kvcore::qat::status();
            }
            py::dict d;
            d["loaded"] = s.loaded;
            d["hardware"] = s.hardware;
            d["library"] = s.library;
            d["message"] = s.message;
            d["probe_code"] = s.probe_code;
            d["hw_buffer_bytes"] = s.hw_buffer_bytes;
            d["min_bytes"] = s.min_bytes;
            d["has_ext_api"] = s.has_ext_api;
            d["last_error_code"] = s.last_error_code;
            const kvcore::qat::Counters& c = s.counters;
            py::dict k;
            k["hw_compress_calls"] = c.hw_compress_calls;
            k["hw_decompress_calls"] = c.hw_decompress_calls;
            k["hw_bytes_in"] = c.hw_bytes_in;
            k["hw_bytes_out"] = c.hw_bytes_out;
            k["sw_execution_calls"] = c.sw_execution_calls;
            k["fallback_pieces"] = c.fallback_pieces;
            k["buf_errors"] = c.buf_errors;
            k["data_errors"] = c.data_errors;
            k["other_errors"] = c.other_errors;
            k["sessions_opened"] = c.sessions_opened;
            k["sessions_closed"] = c.sessions_closed;
            d["counters"] = k;
            return d;
        };
        m.def(
            "qat_load",
            [status_dict](const py::object& path, long long min_bytes) {
                if (min_bytes < 0 || min_bytes > 0xFFFFFFFFll)
                    throw NativeError{Code::kInvalidArgument, "min_bytes out of range"};
                kvcore::qat::LoadOptions o;
                if (!path.is_none()) o.library_path = path.cast<std::string>();
                o.min_bytes = static_cast<uint32_t>(min_bytes);
                kvcore::Status st;
                {
                    py::gil_scoped_release release;
                    st = kvcore::qat::load(o);
                }
                if (!path.is_none()) check(st);  // the system library may be absent; a named one must load
                return status_dict();
            },
            py::arg("path") = py::none(), py::arg("min_bytes") = 4096,
            "Loads QATzip (default: libqatzip.so.3) with dlopen and probes for QAT hardware.");
        m.def("qat_unload", [] { kvcore::qat::unload(); }, "Stops using the loaded QATzip library.");
        m.def("qat_status", status_dict, "QATzip library, hardware and per-call counters.");
        m.def("qat_reset_counters", &kvcore::qat::reset_counters);
        m.def(
            "qat_pinned_alloc_check",
            [](size_t bytes) {
                py::gil_scoped_release release;
                void* p = kvcore::qat::pinned_alloc(bytes, -1);
                const bool pinned = p != nullptr && kvcore::qat::is_pinned(p);
                kvcore::qat::pinned_free(p);
                return std::make_pair(p != nullptr, pinned);
            },
            py::arg("bytes"),
            "Allocates and frees one block through the pool's QAT allocator hook: (allocated, pinned).");
    }

    // ---- section: tiers ----
}
