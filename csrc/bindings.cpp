// The one binding layer between Python and the native core.
//
// Native functions return kvcore::Status; `check()` turns a failed Status into
// the matching Python exception from kvcore.errors. The GIL is released around
// all native work. Buffers cross as Python buffer objects (no libtorch here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "copy/async_ops.h"
#include "copy/copy_engine.h"
#include "cpu/cpu_features.h"
#include "dsa/dsa_desc.h"
#include "dsa/dsa_engine.h"
#include "parallel/thread_pool.h"
#include "pool/pinned_pool.h"

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

// ---- data mover helpers ----

// A block of a pinned pool exposed to Python with the buffer protocol.
// `exports` counts live memoryviews/numpy arrays over it, so free() can refuse
// to hand the memory back while something still reads it.
struct PinnedBlock {
    std::shared_ptr<kvcore::pool::PinnedPool> pool;
    uint8_t* ptr = nullptr;
    size_t nbytes = 0;
    int exports = 0;  // guarded by the GIL

    PinnedBlock() = default;
    PinnedBlock(const PinnedBlock&) = delete;
    PinnedBlock& operator=(const PinnedBlock&) = delete;
    ~PinnedBlock() {
        if (ptr) (void)pool->release(ptr);
    }
};

PinnedBlock* block_of(PyObject* obj) {
    try {
        return &py::handle(obj).cast<PinnedBlock&>();
    } catch (const std::exception&) {
        return nullptr;
    }
}

int block_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
    PinnedBlock* b = block_of(obj);
    if (b == nullptr || b->ptr == nullptr) {
        view->obj = nullptr;
        PyErr_SetString(PyExc_BufferError, b == nullptr ? "PinnedBuffer is not initialised" : "PinnedBuffer was freed");
        return -1;
    }
    if (PyBuffer_FillInfo(view, obj, b->ptr, Py_ssize_t(b->nbytes), 0, flags) != 0) return -1;
    ++b->exports;
    return 0;
}

void block_releasebuffer(PyObject* obj, Py_buffer*) {
    if (PinnedBlock* b = block_of(obj)) --b->exports;
}

// Runs `attempt(slice_ms)` until it stops returning kPoolExhausted/kTimeout or
// the timeout passes, with the GIL released and Ctrl-C honoured between slices.
template <typename F>
Status wait_in_slices(double timeout_s, F attempt) {
    const bool forever = timeout_s < 0 || std::isinf(timeout_s);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(forever ? 0 : int64_t(timeout_s * 1000.0));
    for (bool first = true;; first = false) {
        int64_t slice = 0;
        if (forever) {
            slice = 100;
        } else if (!first || timeout_s > 0) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            slice = std::max<int64_t>(0, std::min<int64_t>(left, 100));
        }
        Status st;
        {
            py::gil_scoped_release release;
            st = attempt(slice);
        }
        if (st.code != Code::kPoolExhausted && st.code != Code::kTimeout) return st;
        if (!forever && std::chrono::steady_clock::now() >= deadline) return st;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
}

std::vector<uint64_t> u64_array(const py::buffer& b, const char* what) {
    py::buffer_info info = b.request();
    if (info.itemsize != 8 || info.ndim != 1 || (info.ndim == 1 && info.strides[0] != 8))
        throw NativeError{Code::kInvalidArgument, std::string(what) + " must be a contiguous 1-D array of uint64"};
    std::vector<uint64_t> v(size_t(info.size));
    if (!v.empty()) std::memcpy(v.data(), info.ptr, v.size() * 8);
    return v;
}

enum class Engine : int { kAuto = 0, kCpu = 1, kDsa = 2 };

// The engine a copy of these segments runs on.
Engine pick_engine(int requested, const std::vector<kvcore::copy::Segment>& segs) {
    if (requested == int(Engine::kCpu)) return Engine::kCpu;
    kvcore::dsa::Engine* dsa = kvcore::dsa::Engine::instance();
    if (requested == int(Engine::kDsa)) {
        if (!dsa)
            throw NativeError{Code::kUnsupported,
                              "engine='dsa' is not available: " + kvcore::dsa::Engine::last_discovery().reason};
        return Engine::kDsa;
    }
    if (requested != int(Engine::kAuto)) throw NativeError{Code::kInvalidArgument, "unknown copy engine"};
    if (!dsa || segs.empty()) return Engine::kCpu;
    size_t total = 0;
    for (const auto& s : segs) total += s.size;
    return total / segs.size() >= dsa->break_even() ? Engine::kDsa : Engine::kCpu;
}

Status run_segments(Engine engine, const std::vector<kvcore::copy::Segment>& segs, const kvcore::copy::CopyOptions& options) {
    if (engine == Engine::kDsa) return kvcore::dsa::Engine::instance()->copy_many(segs.data(), segs.size());
    return kvcore::copy::copy_many(segs.data(), segs.size(), options);
}

py::dict queue_dict(const kvcore::dsa::WorkQueueInfo& q) {
    py::dict d;
    d["device"] = q.device;
    d["name"] = q.name;
    d["path"] = q.path;
    d["mode"] = q.dedicated ? "dedicated" : "shared";
    d["numa_node"] = q.numa_node;
    d["size"] = q.size;
    d["max_batch"] = q.max_batch;
    d["max_transfer"] = q.max_transfer;
    d["block_on_fault"] = q.block_on_fault;
    return d;
}

py::dict discovery_dict(const kvcore::dsa::Discovery& disc) {
    py::dict d;
    d["library_loaded"] = disc.library_loaded;
    d["cpu_movdir64b"] = disc.cpu_movdir64b;
    d["cpu_enqcmd"] = disc.cpu_enqcmd;
    py::list queues;
    for (const auto& q : disc.queues) queues.append(queue_dict(q));
    d["queues"] = queues;
    d["reason"] = disc.reason;
    return d;
}

py::bytes desc_bytes(const void* p, size_t n) { return py::bytes(static_cast<const char*>(p), n); }

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
    {
        namespace kp = kvcore::pool;
        namespace kc = kvcore::copy;
        namespace km = kvcore::mover;
        namespace kd = kvcore::dsa;

        py::class_<kp::PinnedPool, std::shared_ptr<kp::PinnedPool>>(m, "PinnedPoolNative")
            .def(py::init([](size_t capacity, size_t segment_bytes, size_t alignment, bool huge_pages, bool lock,
                             int numa_node) {
                     kp::PoolOptions o;
                     o.capacity = capacity;
                     o.segment_bytes = segment_bytes;
                     o.alignment = alignment;
                     o.huge_pages = huge_pages;
                     o.lock = lock;
                     o.numa_node = numa_node;
                     std::shared_ptr<kp::PinnedPool> pool;
                     Status st;
                     {
                         py::gil_scoped_release release;
                         st = kp::PinnedPool::create(o, &pool);
                     }
                     check(st);
                     return pool;
                 }),
                 py::arg("capacity"), py::arg("segment_bytes") = 0, py::arg("alignment") = 4096,
                 py::arg("huge_pages") = true, py::arg("lock") = true, py::arg("numa_node") = -1)
            .def("stats", [](const kp::PinnedPool& p) {
                const kp::PoolStats s = p.stats();
                py::dict d;
                d["capacity"] = s.capacity;
                d["used"] = s.used;
                d["free"] = s.free;
                d["largest_free_block"] = s.largest_free;
                d["allocations"] = s.allocations;
                d["total_allocations"] = s.total_allocations;
                d["failed_allocations"] = s.failed_allocations;
                d["free_extents"] = s.free_blocks;
                d["segments"] = s.segments;
                d["segment_bytes"] = s.segment_bytes;
                d["reserved_bytes"] = s.reserved_bytes;
                d["alignment"] = s.alignment;
                d["page_kind"] = kp::page_kind_name(s.page_kind);
                d["locked"] = s.locked;
                d["numa_node"] = s.numa_node < 0 ? py::object(py::none()) : py::object(py::int_(s.numa_node));
                return d;
            })
            .def("segments", [](const kp::PinnedPool& p) {
                py::list out;
                for (const auto& s : p.segments())
                    out.append(py::make_tuple(reinterpret_cast<uintptr_t>(s.base), s.size));
                return out;
            })
            .def("contains", [](const kp::PinnedPool& p, uintptr_t addr, size_t n) {
                return p.contains(reinterpret_cast<const uint8_t*>(addr), n);
            });
        m.def("memlock_limit", [] {
            const uint64_t v = kp::memlock_limit();
            return v == UINT64_MAX ? py::object(py::none()) : py::object(py::int_(v));
        });
        m.def("numa_node_count", &kp::numa_node_count);

        auto block = py::class_<PinnedBlock>(m, "PinnedBlock", py::buffer_protocol())
            .def(py::init([](std::shared_ptr<kp::PinnedPool> pool, size_t nbytes, double timeout_s) {
                     auto b = std::make_unique<PinnedBlock>();
                     uint8_t* ptr = nullptr;
                     check(wait_in_slices(timeout_s, [&](int64_t slice_ms) { return pool->allocate(nbytes, slice_ms, &ptr); }));
                     b->pool = std::move(pool);
                     b->ptr = ptr;
                     b->nbytes = nbytes;
                     return b;
                 }),
                 py::arg("pool"), py::arg("nbytes"), py::arg("timeout_s") = 0.0)
            .def_property_readonly("nbytes", [](const PinnedBlock& b) { return b.nbytes; })
            .def_property_readonly("address", [](const PinnedBlock& b) {
                if (!b.ptr) throw NativeError{Code::kInvalidArgument, "PinnedBuffer was freed"};
                return reinterpret_cast<uintptr_t>(b.ptr);
            })
            .def_property_readonly("block_bytes", [](const PinnedBlock& b) { return b.ptr ? b.pool->block_size(b.ptr) : 0; })
            .def_property_readonly("freed", [](const PinnedBlock& b) { return b.ptr == nullptr; })
            .def_property_readonly("exports", [](const PinnedBlock& b) { return b.exports; })
            .def("__len__", [](const PinnedBlock& b) { return b.nbytes; })
            .def("_free", [](PinnedBlock& b) {
                if (!b.ptr) return false;
                if (b.exports > 0)
                    throw NativeError{Code::kInvalidArgument,
                                      "cannot free a PinnedBuffer while " + std::to_string(b.exports) +
                                          " memoryview/array export(s) of it are alive; release them first"};
                check(b.pool->release(b.ptr));
                b.ptr = nullptr;
                return true;
            });
        {
            auto* type = reinterpret_cast<PyTypeObject*>(block.ptr());
            type->tp_as_buffer->bf_getbuffer = block_getbuffer;
            type->tp_as_buffer->bf_releasebuffer = block_releasebuffer;
        }

        py::class_<km::Completion, std::shared_ptr<km::Completion>>(m, "NativeFuture")
            .def("done", &km::Completion::done)
            .def("wait", [](const km::Completion& c, double timeout_s) {
                Status st = wait_in_slices(timeout_s, [&](int64_t slice_ms) {
                    return c.wait(slice_ms) ? Status::ok() : make_status(Code::kTimeout, "");
                });
                return st.is_ok();
            }, py::arg("timeout_s") = -1.0)
            .def("check", [](const km::Completion& c) { check(c.status()); })
            .def("notify_with", &km::Completion::notify_with)
            .def("take_payload", [](km::Completion& c) {
                std::vector<uint8_t>& p = c.payload();
                py::bytes out(reinterpret_cast<const char*>(p.data()), p.size());
                std::vector<uint8_t>().swap(p);
                return out;
            });
        m.def("mover_poll_notifications", [](double timeout_s) {
            py::gil_scoped_release release;
            return km::poll_notifications(int64_t(timeout_s * 1000.0));
        });
        m.def("mover_wake_notifications", &km::wake_notifications);
        m.def("mover_dispatch_threads", &km::dispatch_threads);

        // Copies of (dst, src, size) segments given as uint64 address arrays.
        // Returns None when run synchronously, a NativeFuture when async.
        m.def("mover_copy_segments", [](const py::buffer& dsts, const py::buffer& srcs, const py::buffer& sizes,
                                         int engine, unsigned threads, size_t nt_threshold, bool async) -> py::object {
            const std::vector<uint64_t> d = u64_array(dsts, "dsts"), s = u64_array(srcs, "srcs"),
                                        n = u64_array(sizes, "sizes");
            if (d.size() != s.size() || d.size() != n.size())
                throw NativeError{Code::kInvalidArgument, "dsts, srcs and sizes differ in length"};
            std::vector<kc::Segment> segs(d.size());
            for (size_t i = 0; i < d.size(); ++i)
                segs[i] = {reinterpret_cast<uint8_t*>(d[i]), reinterpret_cast<const uint8_t*>(s[i]), size_t(n[i])};
            const Engine chosen = pick_engine(engine, segs);
            kc::CopyOptions o;
            o.threads = threads;
            o.nt_threshold = nt_threshold;
            if (!async) {
                Status st;
                {
                    py::gil_scoped_release release;
                    st = run_segments(chosen, segs, o);
                }
                check(st);
                return py::none();
            }
            auto c = km::submit([chosen, segs = std::move(segs), o](km::Completion&) { return run_segments(chosen, segs, o); });
            return py::cast(c);
        }, py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("engine") = 0, py::arg("threads") = 0,
           py::arg("nt_threshold") = 0, py::arg("async_") = false);
        // One copy, addresses as integers (the common case without array set-up).
        m.def("mover_copy", [](uint64_t dst, uint64_t src, uint64_t n, int engine, unsigned threads, bool async) -> py::object {
            std::vector<kc::Segment> segs{{reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), size_t(n)}};
            const Engine chosen = pick_engine(engine, segs);
            kc::CopyOptions o;
            o.threads = threads;
            if (!async) {
                if (n <= (64u << 10) && chosen == Engine::kCpu) {  // too short to be worth releasing the GIL
                    check(kc::copy(segs[0].dst, segs[0].src, segs[0].size, o));
                    return py::none();
                }
                Status st;
                {
                    py::gil_scoped_release release;
                    st = run_segments(chosen, segs, o);
                }
                check(st);
                return py::none();
            }
            auto c = km::submit([chosen, segs = std::move(segs), o](km::Completion&) { return run_segments(chosen, segs, o); });
            return py::cast(c);
        }, py::arg("dst"), py::arg("src"), py::arg("n"), py::arg("engine") = 0, py::arg("threads") = 0, py::arg("async_") = false);
        m.def("mover_engine_for", [](uint64_t total, uint64_t count, int engine) {
            std::vector<kc::Segment> segs(count ? count : 1, kc::Segment{nullptr, nullptr, size_t(total / (count ? count : 1))});
            return pick_engine(engine, segs) == Engine::kDsa ? "dsa" : "cpu";
        });
        m.def("copy_variant", [] { return std::string(kc::variant()); });
        m.def("llc_bytes", &kc::llc_bytes);

        // DSA: discovery, engine state, and the descriptor builders (for layout tests).
        m.def("dsa_discover", [](const std::string& library) {
            kd::Discovery disc;
            {
                py::gil_scoped_release release;
                disc = kd::discover(library);
            }
            return discovery_dict(disc);
        }, py::arg("library") = "libaccel-config.so.1");
        m.def("dsa_status", [] {
            kd::Engine* e = nullptr;
            {
                py::gil_scoped_release release;
                e = kd::Engine::instance();
            }
            py::dict d = discovery_dict(kd::Engine::last_discovery());
            d["available"] = e != nullptr;
            d["break_even_bytes"] = e ? py::object(py::int_(e->break_even())) : py::object(py::none());
            d["page_faults"] = e ? e->page_faults() : 0;
            return d;
        });
        m.def("dsa_emulated_copy", [](const py::buffer& dsts, const py::buffer& srcs, const py::buffer& sizes,
                                       uint32_t max_batch, uint64_t max_transfer, uint32_t fault_every,
                                       uint32_t fault_after, bool dedicated) {
            const std::vector<uint64_t> d = u64_array(dsts, "dsts"), s = u64_array(srcs, "srcs"),
                                        n = u64_array(sizes, "sizes");
            if (d.size() != s.size() || d.size() != n.size())
                throw NativeError{Code::kInvalidArgument, "dsts, srcs and sizes differ in length"};
            std::vector<kc::Segment> segs(d.size());
            for (size_t i = 0; i < d.size(); ++i)
                segs[i] = {reinterpret_cast<uint8_t*>(d[i]), reinterpret_cast<const uint8_t*>(s[i]), size_t(n[i])};
            kd::EmulationOptions o;
            o.max_batch = max_batch;
            o.max_transfer = max_transfer;
            o.fault_every = fault_every;
            o.fault_after = fault_after;
            o.dedicated = dedicated;
            kd::EmulationStats stats;
            Status st;
            {
                py::gil_scoped_release release;
                st = kd::emulated_copy_many(segs.data(), segs.size(), o, &stats);
            }
            check(st);
            py::dict r;
            r["descriptors"] = stats.descriptors;
            r["batches"] = stats.batches;
            r["faults_injected"] = stats.faults_injected;
            r["faults_handled"] = stats.faults_handled;
            r["errors"] = stats.errors;
            return r;
        }, py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("max_batch") = 32,
           py::arg("max_transfer") = 1u << 20, py::arg("fault_every") = 0, py::arg("fault_after") = 0,
           py::arg("dedicated") = true);
        m.def("dsa_build_memmove", [](uint64_t src, uint64_t dst, uint32_t size, uint64_t comp, uint32_t flags) {
            kd::HwDesc d;
            kd::make_memmove(&d, src, dst, size, comp, flags);
            return desc_bytes(&d, sizeof(d));
        });
        m.def("dsa_build_batch", [](uint64_t list, uint32_t count, uint64_t comp, uint32_t flags) {
            kd::HwDesc d;
            kd::make_batch(&d, list, count, comp, flags);
            return desc_bytes(&d, sizeof(d));
        });
        m.def("dsa_parse_completion", [](const py::bytes& raw) {
            const std::string s = raw;
            if (s.size() != sizeof(kd::CompletionRecord))
                throw NativeError{Code::kInvalidArgument, "a completion record is 32 bytes"};
            kd::CompletionRecord c;
            std::memcpy(static_cast<void*>(&c), s.data(), sizeof(c));
            py::dict d;
            d["status"] = kd::load_status(&c) & kd::kStatusMask;
            d["write_fault"] = bool(kd::load_status(&c) & kd::kStatusWriteFault);
            d["status_name"] = kd::status_name(kd::load_status(&c));
            d["result"] = c.result;
            d["bytes_completed"] = c.bytes_completed;
            d["fault_addr"] = c.fault_addr;
            return d;
        });
        m.def("dsa_layout", [] {
            py::dict d;
            d["desc_size"] = sizeof(kd::HwDesc);
            d["desc_align"] = alignof(kd::HwDesc);
            d["desc.completion_addr"] = offsetof(kd::HwDesc, completion_addr);
            d["desc.src_addr"] = offsetof(kd::HwDesc, src_addr);
            d["desc.dst_addr"] = offsetof(kd::HwDesc, dst_addr);
            d["desc.xfer_size"] = offsetof(kd::HwDesc, xfer_size);
            d["desc.int_handle"] = offsetof(kd::HwDesc, int_handle);
            d["desc.op_specific"] = offsetof(kd::HwDesc, op_specific);
            d["comp_size"] = sizeof(kd::CompletionRecord);
            d["comp_align"] = alignof(kd::CompletionRecord);
            d["comp.status"] = offsetof(kd::CompletionRecord, status);
            d["comp.result"] = offsetof(kd::CompletionRecord, result);
            d["comp.bytes_completed"] = offsetof(kd::CompletionRecord, bytes_completed);
            d["comp.fault_addr"] = offsetof(kd::CompletionRecord, fault_addr);
            d["op_memmove"] = kd::kOpMemmove;
            d["op_batch"] = kd::kOpBatch;
            d["flag_crav"] = kd::kFlagCompletionAddrValid;
            d["flag_rcr"] = kd::kFlagRequestCompletion;
            d["flag_cc"] = kd::kFlagCacheControl;
            d["flag_bof"] = kd::kFlagBlockOnFault;
            return d;
        });
    }

    // ---- section: qat ----

    // ---- section: tiers ----
}
