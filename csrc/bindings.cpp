// The one binding layer between Python and the native core.
//
// Native functions return kvcore::Status; `check()` turns a failed Status into
// the matching Python exception from kvcore.errors. The GIL is released around
// all native work. Buffers cross as Python buffer objects (no libtorch here).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "checksum/checksum.h"
#include "common/status.h"
#include "copy/async_ops.h"
#include "copy/copy_engine.h"
#include "cpu/cpu_features.h"
#include "deflate/deflate_plane.h"
#include "dsa/dsa_desc.h"
#include "dsa/dsa_engine.h"
#include "entropy/fastcode.h"
#include "entropy/huffman.h"
#include "frame/analysis.h"
#include "frame/batch_progress.h"
#include "frame/codec.h"
#include "frame/plane_methods.h"
#include "parallel/thread_pool.h"
#include "pool/pinned_pool.h"
#include "qat/qat.h"
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
        case Code::kDeviceTimeout: return "DeviceTimeoutError";
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
    // Asking a read-only object for a writable buffer raises a bare BufferError: look first.
    if (request(b, false).readonly) throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
    keep = request(b, true);
    if (!c_contiguous(keep)) throw NativeError{Code::kInvalidArgument, "output buffer must be C-contiguous"};
    // Bytes written over Python object pointers (a numpy object array) crash the process later.
    if (keep.format.find('O') != std::string::npos)
        throw NativeError{Code::kInvalidArgument, "output buffer holds Python objects, not bytes"};
    return {static_cast<uint8_t*>(keep.ptr), static_cast<size_t>(keep.size * keep.itemsize)};
}

// A buffer export held for one call (released on scope exit), or none where the object
// refuses it: the error is cleared, and the caller falls back to a path that reports it.
struct BufferView {
    Py_buffer view{};
    bool held = false;

    BufferView(py::handle obj, int flags) {
        held = PyObject_GetBuffer(obj.ptr(), &view, flags) == 0;
        if (!held) PyErr_Clear();
    }
    BufferView(const BufferView&) = delete;
    BufferView& operator=(const BufferView&) = delete;
    ~BufferView() {
        if (held) PyBuffer_Release(&view);
    }

    // Held, C-contiguous, and of plain items (bytes written over Python object
    // pointers crash the process later).
    bool plain_contiguous() const {
        return held && PyBuffer_IsContiguous(&view, 'C') &&
               (view.format == nullptr || std::strchr(view.format, 'O') == nullptr);
    }
};

// The exports of a copy's (dst, src) buffer objects, taken for one call.
struct HostPair {
    BufferView src;
    BufferView dst;

    HostPair(py::handle dst_obj, py::handle src_obj) : src(src_obj, PyBUF_RECORDS_RO), dst(dst_obj, PyBUF_RECORDS) {}

    // Both plain and C-contiguous, dst writable (its export asked for that) and large enough.
    bool usable() const { return src.plain_contiguous() && dst.plain_contiguous() && dst.view.len >= src.view.len; }
    size_t size() const { return size_t(src.view.len); }
    std::vector<kvcore::copy::Segment> segments() const {
        return {{static_cast<uint8_t*>(dst.view.buf), static_cast<const uint8_t*>(src.view.buf), size()}};
    }
};

// A tensor's bytes by address: the Python layer passes data_ptr() and nbytes of a
// contiguous CPU tensor it holds for the whole call. Going through the buffer
// protocol instead (tensor -> uint8 view -> numpy) costs more than decoding a
// small frame.
MutableView address_view(uint64_t addr, uint64_t nbytes) {
    if (addr == 0 && nbytes != 0) throw NativeError{Code::kInvalidArgument, "null tensor address"};
    return {reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(addr)), static_cast<size_t>(nbytes)};
}

// A decode destination from a tensor's address, its byte size and its layout (run_bytes 0: contiguous).
kvcore::frame::OutputRuns output_runs(uint64_t addr, uint64_t nbytes, uint64_t run_bytes, uint64_t stride) {
    const MutableView dst = address_view(addr, nbytes);
    return {dst.data, dst.size, static_cast<size_t>(run_bytes), static_cast<size_t>(stride)};
}

unsigned thread_count(const py::object& threads) {
    if (threads.is_none()) return 0;  // all cores
    const long n = threads.cast<long>();
    if (n < 1) throw NativeError{Code::kInvalidArgument, "threads must be >= 1"};
    // The pools use at most the threads they have: a larger count means all of them
    // (cast as it was, 2**32 + 1 meant one).
    return static_cast<unsigned>(std::min<long>(n, std::numeric_limits<unsigned>::max()));
}

// A compression job for a tensor by address (the output is set by the caller).
// The shape is checked against the size and the block size here, before any
// output is sized from it.
kvcore::frame::CompressJob compress_job(uint64_t addr, uint64_t nbytes, uint8_t dtype, std::vector<uint64_t> shape,
                                        uint32_t block_bytes) {
    namespace fr = kvcore::frame;
    const MutableView in = address_view(addr, nbytes);
    fr::TensorDesc desc{static_cast<fr::DType>(dtype), std::move(shape)};
    check(fr::validate_desc(desc, in.size, block_bytes));
    return {in.data, in.size, std::move(desc), nullptr, 0};
}

// Each job's layout from layouts (empty, or one per job; a null one: chosen from
// the job's tensor). The layouts outlive the native call: the caller holds the list.
void set_layouts(std::vector<kvcore::frame::CompressJob>& jobs,
                 const std::vector<std::shared_ptr<kvcore::frame::AnalyzedLayout>>& layouts) {
    if (layouts.empty()) return;
    if (layouts.size() != jobs.size())
        throw NativeError{Code::kInvalidArgument, "layouts must be empty or one per tensor"};
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i].layout = layouts[i].get();
}

// Python's mode codes: 0 dense, 1 fast, 2 max (dense, with the signs coded by channel).
kvcore::frame::EncodeOptions mode_options(uint8_t mode) {
    namespace fr = kvcore::frame;
    if (mode > 2) throw NativeError{Code::kInvalidArgument, "unknown mode"};
    fr::EncodeOptions options;
    options.mode = mode == 1 ? fr::Mode::kFast : fr::Mode::kDense;
    options.max_ratio = mode == 2;
    return options;
}

kvcore::frame::EncodeOptions encode_options(uint8_t mode, uint8_t backend, bool deflate, bool lanes,
                                            uint32_t block_bytes, const py::object& threads) {
    namespace fr = kvcore::frame;
    if (backend > 2) throw NativeError{Code::kInvalidArgument, "unknown backend"};
    fr::EncodeOptions options = mode_options(mode);
    options.backend = static_cast<fr::Backend>(backend);
    options.deflate = deflate;
    options.lanes = lanes;
    options.block_bytes = block_bytes;
    options.threads = thread_count(threads);
    check(fr::check_options(options));  // before any output is sized from them
    return options;
}

// ---- data mover helpers ----

// A block of a pinned pool exposed to Python with the buffer protocol.
// `exports` counts live memoryviews/numpy arrays over it (and tensor() views, which
// torch makes over a memoryview), so free() can refuse to hand the memory back
// while something still reads it.
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

// Puts the counting buffer functions above in place of pybind11's on the PinnedBlock type.
// From Python 3.12 (PEP 688) readying a type also makes __buffer__ / __release_buffer__
// descriptors that wrap the slot functions of that moment, and a Python subclass
// (kvcore.PinnedBuffer) takes its slots from those descriptors, not from the base's slots:
// they must wrap the same functions, or the subclass gets pybind11's, which knows no buffer.
void install_block_buffer(PyTypeObject* type) {
    type->tp_as_buffer->bf_getbuffer = block_getbuffer;
    type->tp_as_buffer->bf_releasebuffer = block_releasebuffer;
#if PY_VERSION_HEX >= 0x030C0000
    const auto repoint = [type](const char* name, void* fn) {
        PyObject* d = PyDict_GetItemString(type->tp_dict, name);  // borrowed
        if (d != nullptr && Py_IS_TYPE(d, &PyWrapperDescr_Type)) reinterpret_cast<PyWrapperDescrObject*>(d)->d_wrapped = fn;
    };
    repoint("__buffer__", reinterpret_cast<void*>(&block_getbuffer));
    repoint("__release_buffer__", reinterpret_cast<void*>(&block_releasebuffer));
    PyType_Modified(type);
#endif
}

// Runs `attempt(slice_ms)` until it stops returning kPoolExhausted/kTimeout or
// the timeout passes, with the GIL released and Ctrl-C honoured between slices.
template <typename F>
Status wait_in_slices(double timeout_s, F attempt) {
    // Negative means no limit; so does one of 1e9 s (31 years) or more, since a deadline in
    // steady_clock's int64 nanoseconds overflows near 292 years. NaN waits like 0.
    const bool forever = timeout_s < 0 || timeout_s >= 1e9;
    const double limit_s = forever || std::isnan(timeout_s) ? 0.0 : timeout_s;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::ceil<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limit_s));
    for (bool first = true;; first = false) {
        int64_t slice = 0;
        if (forever) {
            slice = 100;
        } else if (!first || timeout_s > 0) {
            // Rounded up: the last part of a millisecond is waited for, not spun through in slices of 0.
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
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
    // DSA refuses a copy that overlaps its own source; the CPU engine moves it like memmove.
    for (const auto& s : segs)
        if (s.size && s.dst < s.src + s.size && s.src < s.dst + s.size) return Engine::kCpu;
    size_t total = 0;
    for (const auto& s : segs) total += s.size;
    return total / segs.size() >= dsa->break_even() ? Engine::kDsa : Engine::kCpu;
}

Status run_segments(Engine engine, const std::vector<kvcore::copy::Segment>& segs, const kvcore::copy::CopyOptions& options) {
    if (engine == Engine::kDsa) return kvcore::dsa::Engine::instance()->copy_many(segs.data(), segs.size());
    return kvcore::copy::copy_many(segs.data(), segs.size(), options);
}

// Runs the copies now (GIL released) or hands them to the mover's threads.
// The largest host copy a caller waiting for it may run itself: about a millisecond of
// memcpy, so a wait() with no time limit is not held much longer than the copy.
constexpr size_t kHelpedCopyBytes = 8u << 20;

py::object run_or_submit(Engine engine, std::vector<kvcore::copy::Segment> segs,
                         const kvcore::copy::CopyOptions& options, bool async) {
    if (!async) {
        Status st;
        {
            py::gil_scoped_release release;
            st = run_segments(engine, segs, options);
        }
        check(st);
        return py::none();
    }
    size_t bytes = 0;
    for (const auto& seg : segs) bytes += seg.size;
    // A waiter may run a short CPU copy itself (Completion::run_here): DSA and CUDA
    // work keeps to its dispatch thread, and a long copy to the mover's threads.
    const bool helpable = engine == Engine::kCpu && bytes <= kHelpedCopyBytes;
    auto c = kvcore::mover::submit([engine, segs = std::move(segs), options](kvcore::mover::Completion&) {
        return run_segments(engine, segs, options);
    }, helpable);
    return py::cast(c);
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

// The copies of a test's emulated DSA queue, given as arrays of addresses and sizes.
std::vector<kvcore::copy::Segment> address_segments(const py::buffer& dsts, const py::buffer& srcs,
                                                    const py::buffer& sizes) {
    const std::vector<uint64_t> d = u64_array(dsts, "dsts"), s = u64_array(srcs, "srcs"), n = u64_array(sizes, "sizes");
    if (d.size() != s.size() || d.size() != n.size())
        throw NativeError{Code::kInvalidArgument, "dsts, srcs and sizes differ in length"};
    std::vector<kvcore::copy::Segment> segs(d.size());
    for (size_t i = 0; i < d.size(); ++i)
        segs[i] = {reinterpret_cast<uint8_t*>(d[i]), reinterpret_cast<const uint8_t*>(s[i]), size_t(n[i])};
    return segs;
}

// The emulated queue's options that both emulation bindings take.
kvcore::dsa::EmulationOptions emulation_options(uint32_t max_batch, uint64_t max_transfer, uint32_t fault_every,
                                                uint32_t fault_after, bool dedicated, uint32_t wq_size) {
    kvcore::dsa::EmulationOptions o;
    o.max_batch = max_batch;
    o.max_transfer = max_transfer;
    o.fault_every = fault_every;
    o.fault_after = fault_after;
    o.dedicated = dedicated;
    o.wq_size = wq_size;
    return o;
}

py::dict emulation_stats_dict(const kvcore::dsa::EmulationStats& stats) {
    py::dict r;
    r["descriptors"] = stats.descriptors;
    r["batches"] = stats.batches;
    r["faults_injected"] = stats.faults_injected;
    r["faults_handled"] = stats.faults_handled;
    r["errors"] = stats.errors;
    r["stalled"] = stats.stalled;
    r["late_completions"] = stats.late_completions;
    return r;
}

// What timed-out descriptors left behind in a DSA engine (nullptr: none open).
void engine_health(kvcore::dsa::Engine* e, py::dict& d) {
    d["timeouts"] = e ? e->timeouts() : 0;
    d["overdue_descriptors"] = e ? e->overdue() : 0;
    d["wedged_queues"] = e ? e->wedged_queues() : 0;
    d["cpu_fallbacks"] = e ? e->cpu_fallbacks() : 0;
}

py::bytes desc_bytes(const void* p, size_t n) { return py::bytes(static_cast<const char*>(p), n); }

// Trims a frame written into a bytes object of capacity `cap` to its size n
// (consumes the reference), for glibc's malloc: a capacity at or above its mmap
// threshold is mapped fresh, and faulted in again, on every call. A frame
// whose capacity is below 32 MiB (glibc's largest dynamic threshold) and above
// every earlier one's is copied into an exact-size object and the full one
// freed: freeing a mapped chunk raises the threshold to its size, so later
// calls of up to that capacity are served from the heap, whose pages are
// already mapped. Their frames are shrunk in place, which on the heap costs no
// copy (the copy took about a tenth of compress's time on 16-19 MB tensors of
// kvdata). Shrinking the first one in place instead would free only the
// smaller size and leave the threshold below the capacity. With another
// allocator, or a threshold fixed by mallopt, shrinking in place is still
// correct, only not always free of faults. Heap pages are not kept either:
// when the free space at the heap's top passes glibc's trim threshold (twice
// the mmap threshold once raised) it is returned to the kernel, and the next
// call faults it in again; a loop that kept 72 frames of 512 KiB tensors and
// freed them together ran at 0.58x the speed of compress(out=) on the Zen 4 VM
// for that reason (ad hoc, 2026-12-05; docs/CHANGES.md). Called with the GIL held; the
// copy runs without it.
constexpr size_t kRecycleBelow = size_t(32) << 20;
std::atomic<size_t> heap_served_cap{0};  // capacities up to this one come from the heap (once copied)

PyObject* trim_frame(PyObject* obj, size_t n, size_t cap) {
    if (n == size_t(PyBytes_GET_SIZE(obj))) return obj;
    if (cap < kRecycleBelow && cap > heap_served_cap.load(std::memory_order_relaxed)) {
        PyObject* exact = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
        if (exact != nullptr) {
            py::gil_scoped_release release;
            std::memcpy(PyBytes_AS_STRING(exact), PyBytes_AS_STRING(obj), n);
        }
        Py_DECREF(obj);
        if (exact != nullptr && heap_served_cap.load(std::memory_order_relaxed) < cap)
            heap_served_cap.store(cap, std::memory_order_relaxed);  // the GIL orders the writers
        return exact;  // nullptr with the error set when out of memory
    }
    if (_PyBytes_Resize(&obj, static_cast<Py_ssize_t>(n)) != 0) return nullptr;
    return obj;
}

// The head a frame whose capacity passes kRecycleBelow is coded into when it
// is estimated to fit (CompressJob::head): small enough that glibc serves it
// from the heap once an earlier one has been freed (trim_frame). At 32 MiB
// less 4 KiB glibc 2.36 still mapped every one afresh; at 8 KiB less it did not.
// MiniLM's fp16 KV (37.7 MB, a 32 MB frame) compressed into a new bytes object
// ran 1.16x slower than into a reused buffer when coded into a fresh mapping
// (2026-12-06); MiniLM bf16 1.12x, its fp32 cast 1.06x.
constexpr size_t kHeadBytes = kRecycleBelow - (size_t(64) << 10);

PyObject* new_frame_bytes(size_t n) {
    PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
    if (raw == nullptr) throw py::error_already_set();
    return raw;
}

// The bytes object a compression writes its frame into (no copy, no
// zero-fill), with a head where its capacity passes kHeadBytes; take() keeps
// the one the frame is in, trimmed to the frame's size, once done.
struct FrameOut {
    py::object obj;
    py::object head;  // until the first take()
    size_t capacity = 0;       // obj's
    size_t kept_capacity = 0;  // of the object take() keeps
    // Set by an asynchronous compression job (CompressJob::in_head) before it completes.
    std::shared_ptr<std::atomic<bool>> in_head = std::make_shared<std::atomic<bool>>(false);
    explicit FrameOut(size_t cap)
        : obj(py::reinterpret_steal<py::object>(new_frame_bytes(cap))), capacity(cap), kept_capacity(cap) {
        if (cap > kHeadBytes) head = py::reinterpret_steal<py::object>(new_frame_bytes(kHeadBytes));
    }
    FrameOut(const FrameOut&) = delete;
    FrameOut& operator=(const FrameOut&) = delete;
    static uint8_t* data_of(const py::object& b) { return reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(b.ptr())); }
    // Points job's output here: nothing else sees these objects until take().
    void attach(kvcore::frame::CompressJob& job) const {
        job.dst = data_of(obj);
        job.cap = capacity;
        job.fresh_dst = true;
        if (head) {
            job.head = data_of(head);
            job.head_bytes = kHeadBytes;
        }
    }
    py::bytes take(size_t n) { return take(n, in_head->load(std::memory_order_acquire)); }
    py::bytes take(size_t n, bool frame_in_head) {
        if (head) {
            if (frame_in_head) {
                std::swap(obj, head);
                kept_capacity = kHeadBytes;
            }
            head = py::object();
        }
        if (n > kept_capacity) throw NativeError{Code::kInvalidArgument, "frame larger than its buffer"};
        if (n != size_t(PyBytes_GET_SIZE(obj.ptr()))) {
            if (Py_REFCNT(obj.ptr()) != 1) return py::bytes(reinterpret_cast<const char*>(data_of(obj)), n);
            PyObject* trimmed = trim_frame(obj.release().ptr(), n, kept_capacity);
            if (trimmed == nullptr) throw py::error_already_set();
            obj = py::reinterpret_steal<py::object>(trimmed);
        }
        return py::reinterpret_borrow<py::bytes>(obj);
    }
};

// Compresses the jobs (outputs unset) into fresh bytes objects of
// max_frame_size each, or their heads, trimmed to the frames' sizes.
std::vector<py::bytes> compress_to_bytes(std::vector<kvcore::frame::CompressJob>& jobs,
                                         const kvcore::frame::EncodeOptions& options) {
    namespace fr = kvcore::frame;
    std::vector<std::unique_ptr<FrameOut>> outs;
    for (fr::CompressJob& job : jobs) {
        // jobs from compress_job: validated
        outs.push_back(std::make_unique<FrameOut>(fr::max_frame_size(job.desc, options.block_bytes)));
        outs.back()->attach(job);
    }
    Status st;
    {
        py::gil_scoped_release release;
        st = fr::compress_many(jobs.data(), jobs.size(), options);
    }
    check(st);
    std::vector<py::bytes> out;
    for (size_t i = 0; i < jobs.size(); ++i) out.push_back(outs[i]->take(jobs[i].written, jobs[i].in_head));
    return out;
}

// The decode jobs of a batch: frames[i] (buffer views kept in *keep) into outs[i] =
// (address, bytes, run_bytes, run_stride).
std::vector<kvcore::frame::FrameJob> frame_jobs(const std::vector<py::buffer>& frames,
                                                const std::vector<std::array<uint64_t, 4>>& outs,
                                                std::vector<py::buffer_info>* keep) {
    if (frames.size() != outs.size()) throw NativeError{Code::kInvalidArgument, "frames and outs differ in length"};
    keep->resize(frames.size());
    std::vector<kvcore::frame::FrameJob> jobs(frames.size());
    for (size_t i = 0; i < frames.size(); ++i) {
        const ByteView in = read_view(frames[i], (*keep)[i]);
        jobs[i] = {in.data, in.size, output_runs(outs[i][0], outs[i][1], outs[i][2], outs[i][3])};
    }
    return jobs;
}

// Whether a frame decodes to out_bytes bytes of dtype code `dtype` (reads its
// header; raises CorruptFrameError where that is bad).
bool output_matches(const ByteView& frame, int dtype, uint64_t out_bytes) {
    kvcore::frame::TensorDesc desc;
    check(kvcore::frame::read_desc(frame.data, frame.size, &desc));
    uint64_t elems = 1;  // (parse_header checked the product: at most 2^60)
    for (const uint64_t d : desc.shape) elems *= d;
    return static_cast<int>(desc.dtype) == dtype && elems * kvcore::frame::dtype_size(desc.dtype) == out_bytes;
}

// A decompress_many batch running on the mover's threads: it holds the frames'
// buffer views and waits for the batch before they are released, so dropping
// it early never leaves native code reading freed memory.
struct DecodeBatch {
    std::vector<py::buffer_info> keep;
    std::shared_ptr<kvcore::frame::BatchProgress> progress;
    std::shared_ptr<kvcore::mover::Completion> running;
    // The caller's outputs, released only after the wait below: a caller interrupted
    // (Ctrl-C) in its own wait may drop them while the batch still writes into them.
    py::object outputs;
    DecodeBatch() = default;
    DecodeBatch(const DecodeBatch&) = delete;
    DecodeBatch& operator=(const DecodeBatch&) = delete;
    ~DecodeBatch() {
        if (!running) return;
        py::gil_scoped_release release;
        running->wait(-1);
    }
};

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
        // Planes too large to stay cached are written around the caches (AVX-512):
        // 37.7 MB of MiniLM bf16 into two planes at different offsets in their lines
        // split 1.15-1.23x faster on the Zen 4 VM (ad hoc A/B, 2026-12-05).
        static kvcore::shuffle::Stores split_stores(size_t bytes) {
            return bytes >= kvcore::cpu::streaming_store_bytes() ? kvcore::shuffle::Stores::kStreaming
                                                                 : kvcore::shuffle::Stores::kCached;
        }
        // A C-contiguous byte view of `obj` (any buffer-protocol object), held by `keep`.
        static MutableView view(const py::object& obj, const std::string& what, bool writable,
                                py::buffer_info& keep) {
            if (!PyObject_CheckBuffer(obj.ptr()))
                throw NativeError{Code::kInvalidArgument, what + " must be a bytes-like object"};
            const auto b = py::reinterpret_borrow<py::buffer>(obj);
            MutableView v{};
            if (writable) {
                v = write_view(b, keep);
            } else {
                const ByteView r = read_view(b, keep);
                v = {const_cast<uint8_t*>(r.data), r.size};
            }
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
                const auto stores = ShuffleArgs::split_stores(s.size);
                py::gil_scoped_release nogil;
                kvcore::shuffle::split(s.data, n, static_cast<unsigned>(elem_size), t, ptrs, stores);
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
            const auto stores = ShuffleArgs::split_stores(s.size);
            py::gil_scoped_release nogil;
            kvcore::shuffle::split(s.data, n, static_cast<unsigned>(elem_size), t, ptrs, stores);
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
    m.def("huffman_bound", &kvcore::entropy::huffman_bound, py::arg("n"),
          "Largest stream huffman_encode produces for n symbols.");
    m.def(
        "huffman_encode",
        [](const py::buffer& src, std::optional<double> lanes) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            if (lanes && !(*lanes >= 0)) throw NativeError{Code::kInvalidArgument, "lanes must be >= 0"};
            // Encode straight into a bytes object of the bound size, then shrink it in place.
            const size_t cap = kvcore::entropy::huffman_bound(in.size);
            PyObject* raw = PyBytes_FromStringAndSize(nullptr, Py_ssize_t(cap));
            if (!raw) throw py::error_already_set();
            uint8_t* dst = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
            size_t written = 0;
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::huffman_encode(in.data, in.size, nullptr, dst, cap, &written, true,
                                                     lanes.value_or(-1.0));
            }
            if (!st.is_ok()) {
                Py_DECREF(raw);
                check(st);
            }
            if (_PyBytes_Resize(&raw, Py_ssize_t(written)) != 0) throw py::error_already_set();
            return py::reinterpret_steal<py::bytes>(raw);
        },
        py::arg("src"), py::arg("lanes") = py::none(),
        "Huffman-codes a byte buffer (order-0, canonical, 6 streams); returns the stream. lanes=x: the "
        "lane-interleaved stream instead where it is at most x (a share) larger.");
    m.def(
        "huffman_decode",
        [](const py::buffer& stream, long long n) {
            if (n < 0) throw NativeError{Code::kInvalidArgument, "n must be >= 0"};
            py::buffer_info keep;
            const ByteView in = read_view(stream, keep);
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
            if (out.request(false).readonly)  // request(true) would raise a plain BufferError
                throw NativeError{Code::kInvalidArgument, "output buffer is read-only"};
            const MutableView o = write_view(out, keep_out);
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
        [](const py::buffer& src, bool sampled, std::optional<double> lanes) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            if (lanes && !(*lanes >= 0)) throw NativeError{Code::kInvalidArgument, "lanes must be >= 0"};
            if (in.size > UINT32_MAX) throw NativeError{Code::kInvalidArgument, "buffer larger than 2^32-1 bytes"};
            size_t size = 0;
            {
                py::gil_scoped_release release;
                uint32_t hist[256];
                const bool exact = sampled ? kvcore::entropy::histogram_estimate(in.data, in.size, hist)
                                           : (kvcore::entropy::histogram(in.data, in.size, hist), true);
                size = kvcore::entropy::huffman_estimate(hist, in.size, exact, lanes.value_or(-1.0));
            }
            return size;
        },
        py::arg("src"), py::arg("sampled") = false, py::arg("lanes") = py::none(),
        "Upper bound (exact + <= 5 bytes; a lane stream: <= 260) of len(huffman_encode(src, lanes=lanes)), "
        "without coding; sampled=True: "
        "the estimate from sampled weights that the frame encoder uses to skip planes that would not shrink.");
    m.def(
        "huffman_pairing",
        [](const py::buffer& src) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            uint32_t hist[256];
            kvcore::entropy::histogram(in.data, in.size, hist);
            return std::string(kvcore::entropy::huffman_pairing(hist, in.size));
        },
        py::arg("src"),
        "How huffman_encode(src) codes its symbols on the active ISA: 'chunks' (four or eight a put, joined "
        "by the AVX-512 kernel), 'single' (one a table lookup), 'window' or 'rank' (two, indexed by a window "
        "of values or by rank); the bytes are the same.");
    m.def(
        "byte_histogram",
        [](const py::buffer& src) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
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
    m.def(
        "byte_histogram_estimate",
        [](const py::buffer& src, bool complete) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            if (in.size > UINT32_MAX) throw NativeError{Code::kInvalidArgument, "buffer larger than 2^32-1 bytes"};
            uint32_t hist[256];
            bool exact = false;
            {
                py::gil_scoped_release release;
                exact = complete ? kvcore::entropy::histogram_estimate(in.data, in.size, hist)
                                 : kvcore::entropy::histogram_weights(in.data, in.size, hist);
            }
            return py::make_tuple(std::vector<uint64_t>(hist, hist + 256), exact);
        },
        py::arg("src"), py::arg("complete") = true,
        "(weights, exact): symbol weights for building a code, from a sample; with complete, nonzero for "
        "every byte value present (else a value the sample missed may weigh 0, as fast mode uses them); "
        "exact tells whether they are the true counts.");
    m.def(
        "order0_bits",
        [](const std::vector<uint32_t>& counts, unsigned lo, unsigned hi) {
            if (counts.size() != 256) throw NativeError{Code::kInvalidArgument, "counts must hold 256 values"};
            if (lo > hi || hi > 255) throw NativeError{Code::kInvalidArgument, "need 0 <= lo <= hi <= 255"};
            return kvcore::entropy::order0_bits(counts.data(), lo, hi);
        },
        py::arg("counts"), py::arg("lo") = 0, py::arg("hi") = 255,
        "Bits of an ideal order-0 code of the symbols lo..hi with these 256 counts (the encoder's estimates).");

    // ---- section: entropy: fastcode ----
    m.def("fastcode_bound", &kvcore::entropy::fastcode_bound, py::arg("n"));
    m.def(
        "fastcode_encode",
        [](const py::buffer& src, unsigned width, const py::object& cap, const py::object& weights) {
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            std::vector<uint32_t> w;
            if (!weights.is_none()) {
                w = weights.cast<std::vector<uint32_t>>();
                if (w.size() != 256) throw NativeError{Code::kInvalidArgument, "weights must hold 256 values"};
                if (width != 0) throw NativeError{Code::kInvalidArgument, "weights choose the width: give width=0"};
            }
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
                uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());
                st = w.empty() ? kvcore::entropy::fastcode_encode_width(in.data, in.size, nullptr, width, dst,
                                                                        out.size(), &written)
                               : kvcore::entropy::fastcode_encode_estimated(in.data, in.size, w.data(), dst,
                                                                            out.size(), &written);
            }
            check(st);
            return py::bytes(out.data(), written);
        },
        py::arg("src"), py::arg("width") = 0, py::arg("cap") = py::none(), py::arg("weights") = py::none(),
        "Encodes a byte plane; BufferTooSmallError unless the stream is smaller than the input\n"
        "(or fits `cap`). width: 0 = smallest stream, 1..7 forces the code width. weights: 256\n"
        "estimated symbol counts that choose the width and table (escapes are counted while coding).");
    m.def(
        "fastcode_decode",
        [](const py::buffer& stream, long long n) {
            if (n < 0) throw NativeError{Code::kInvalidArgument, "n must be >= 0"};
            py::buffer_info keep;
            const ByteView in = read_view(stream, keep);
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
            const ByteView in = read_view(stream, keep_in);
            const MutableView dst = write_view(out, keep_out);
            Status st;
            {
                py::gil_scoped_release release;
                st = kvcore::entropy::fastcode_decode(in.data, in.size, dst.data, dst.size);
            }
            check(st);
        },
        py::arg("stream"), py::arg("out"));

    // ---- section: codec ----
    namespace fr = kvcore::frame;
    m.def(
        "max_frame_size",
        [](uint8_t dtype, std::vector<uint64_t> shape, uint32_t block_bytes) {
            const fr::TensorDesc desc{static_cast<fr::DType>(dtype), std::move(shape)};
            check(fr::validate_shape(desc, block_bytes));
            return fr::max_frame_size(desc, block_bytes);
        },
        py::arg("dtype"), py::arg("shape"), py::arg("block_bytes") = 0);
    py::class_<fr::AnalyzedLayout, std::shared_ptr<fr::AnalyzedLayout>>(
        m, "Layout", "A tensor's layout as compress chose it (made by analyze), to code tensors of its kind with.")
        .def_property_readonly("dtype", [](const fr::AnalyzedLayout& a) { return static_cast<int>(a.dtype); })
        .def_property_readonly("channels", [](const fr::AnalyzedLayout& a) { return a.channels; })
        .def_property_readonly("coding", [](const fr::AnalyzedLayout& a) { return fr::coding_name(a.coding); })
        .def_property_readonly("rotate", [](const fr::AnalyzedLayout& a) { return a.layout.rotate; })
        .def_property_readonly("residual",
                               [](const fr::AnalyzedLayout& a) {
                                   const auto& r = a.layout.residual;
                                   return r.empty() ? py::object(py::none())
                                                    : py::object(py::bytes(reinterpret_cast<const char*>(r.data()),
                                                                           r.size()));
                               })
        .def_property_readonly("plane_entropy", [](const fr::AnalyzedLayout& a) { return a.layout.plane_entropy; });
    m.def(
        "analyze",
        [](const std::tuple<uint64_t, uint64_t, uint8_t, std::vector<uint64_t>>& src, uint8_t mode, bool deflate) {
            const auto& [addr, nbytes, dtype, shape] = src;
            const MutableView in = address_view(addr, nbytes);
            const fr::TensorDesc desc{static_cast<fr::DType>(dtype), shape};
            fr::EncodeOptions options = mode_options(mode);
            options.deflate = deflate;
            auto out = std::make_shared<fr::AnalyzedLayout>();
            Status st;
            {
                py::gil_scoped_release release;
                st = fr::analyze(in.data, in.size, desc, options, out.get());  // validates desc against the size
            }
            check(st);
            return out;
        },
        py::arg("src"), py::arg("mode") = 0, py::arg("deflate") = false,
        "The layout compress would choose for src = (address, bytes, dtype code, shape) in this mode (deflate:\n"
        "with a DEFLATE backend).");
    m.def(
        "compress_batch",
        [](const std::vector<std::tuple<uint64_t, uint64_t, uint8_t, std::vector<uint64_t>>>& srcs, uint8_t mode,
           uint8_t backend, bool deflate, bool lanes, uint32_t block_bytes, const py::object& threads,
           const std::vector<std::shared_ptr<fr::AnalyzedLayout>>& layouts) {
            std::vector<fr::CompressJob> jobs;
            for (const auto& [addr, nbytes, dtype, shape] : srcs)
                jobs.push_back(compress_job(addr, nbytes, dtype, shape, block_bytes));
            set_layouts(jobs, layouts);
            return compress_to_bytes(jobs, encode_options(mode, backend, deflate, lanes, block_bytes, threads));
        },
        py::arg("srcs"), py::arg("mode") = 0, py::arg("backend") = 0, py::arg("deflate") = false,
        py::arg("lanes") = false, py::arg("block_bytes") = 0, py::arg("threads") = py::none(),
        py::arg("layouts") = std::vector<std::shared_ptr<fr::AnalyzedLayout>>{},
        "Compresses every srcs[i] = (address, bytes, dtype code, shape) in one call, the blocks of all of them\n"
        "spread over the threads; returns the frames. layouts: empty, or one Layout (or None) per source.");
    m.def(
        "decompress_into",
        [](const py::buffer& frame, uint64_t out_addr, uint64_t out_bytes, uint64_t run_bytes, uint64_t run_stride,
           const py::object& threads, bool fresh, int dtype) {
            py::buffer_info keep_in;
            const ByteView in = read_view(frame, keep_in);
            if (dtype >= 0 && !output_matches(in, dtype, out_bytes)) return false;
            const fr::FrameJob job{in.data, in.size, output_runs(out_addr, out_bytes, run_bytes, run_stride), fresh};
            const unsigned n_threads = thread_count(threads);
            Status st;
            {
                py::gil_scoped_release release;
                st = fr::decompress_many(&job, 1, n_threads);
            }
            check(st);
            return true;
        },
        py::arg("frame"), py::arg("out_addr"), py::arg("out_bytes"), py::arg("run_bytes") = 0,
        py::arg("run_stride") = 0, py::arg("threads") = py::none(), py::arg("fresh") = false, py::arg("dtype") = -1,
        "Decodes a frame into out_bytes at out_addr: contiguous, or (run_bytes > 0) runs of run_bytes that\n"
        "start run_stride bytes apart. fresh: the output was just allocated, and nothing else uses it yet.\n"
        "dtype >= 0: the output's dtype code; a frame of another dtype or size is not decoded, and False\n"
        "is returned (so the caller need not read the header first to check its output).");
    m.def(
        "decompress_batch",
        [](const std::vector<py::buffer>& frames, const std::vector<std::array<uint64_t, 4>>& outs,
           const py::object& threads) {
            std::vector<py::buffer_info> keep;
            const std::vector<fr::FrameJob> jobs = frame_jobs(frames, outs, &keep);
            const unsigned n_threads = thread_count(threads);
            Status st;
            {
                py::gil_scoped_release release;
                st = fr::decompress_many(jobs.data(), jobs.size(), n_threads);
            }
            check(st);
        },
        py::arg("frames"), py::arg("outs"), py::arg("threads") = py::none(),
        "Decodes frames[i] into outs[i] = (address, bytes, run_bytes, run_stride) (as decompress_into) for every\n"
        "i, the blocks of all frames spread over the threads.");
    py::class_<DecodeBatch>(m, "DecodeBatch")
        .def("wait", [](const DecodeBatch& b, size_t frame, double timeout_s) {
            return wait_in_slices(timeout_s, [&](int64_t slice_ms) {
                return b.progress->wait(frame, slice_ms) ? Status::ok() : make_status(Code::kTimeout, "");
            }).is_ok();
        }, py::arg("frame"), py::arg("timeout_s") = -1.0,
        "Waits for frame to settle (decoded and verified, or failed); True once it has.")
        .def("check", [](const DecodeBatch& b, size_t frame) { check(b.progress->status(frame)); },
             py::arg("frame"), "Raises the settled frame's error, if any.")
        .def("wait_all", [](const DecodeBatch& b) {
            check(wait_in_slices(-1.0, [&](int64_t slice_ms) {
                return b.running->wait(slice_ms) ? Status::ok() : make_status(Code::kTimeout, "");
            }));
        }, "Waits for the whole batch (every frame settled, the native call returned).")
        .def("__len__", [](const DecodeBatch& b) { return b.progress->size(); })
        .def_readwrite("outputs", &DecodeBatch::outputs,
                       "The tensors the batch decodes into, kept until it has finished.");
    m.def(
        "decompress_batch_async",
        [](const std::vector<py::buffer>& frames, const std::vector<std::array<uint64_t, 4>>& outs,
           const py::object& threads) {
            auto batch = std::make_unique<DecodeBatch>();
            std::vector<fr::FrameJob> jobs = frame_jobs(frames, outs, &batch->keep);
            const unsigned n_threads = thread_count(threads);
            batch->progress = std::make_shared<fr::BatchProgress>(jobs.size());
            batch->running = kvcore::mover::submit(
                [jobs = std::move(jobs), progress = batch->progress, n_threads](kvcore::mover::Completion&) {
                    const Status st = fr::decompress_many(
                        jobs.data(), jobs.size(), n_threads,
                        [&](size_t i, const Status& frame_status) { progress->settle(i, frame_status); });
                    progress->settle_rest(st);  // frames the batch never reached (a bad header, overlapping outputs)
                    return st;
                });
            return batch;
        },
        py::arg("frames"), py::arg("outs"), py::arg("threads") = py::none(),
        "decompress_batch on the mover's threads: returns at once with a DecodeBatch whose frames settle in\n"
        "about frame order, each as soon as its blocks are decoded and verified.");
    m.def(
        "first_mismatch",
        [](const std::vector<py::buffer>& frames, const std::vector<std::pair<int, uint64_t>>& outs) -> int64_t {
            if (frames.size() != outs.size()) throw NativeError{Code::kInvalidArgument, "frames and outs differ in length"};
            for (size_t i = 0; i < frames.size(); ++i) {
                py::buffer_info keep;
                if (!output_matches(read_view(frames[i], keep), outs[i].first, outs[i].second)) return int64_t(i);
            }
            return -1;
        },
        py::arg("frames"), py::arg("outs"),
        "The first i whose frames[i] does not decode to outs[i] = (dtype code, bytes), or -1 (reads the headers).");
    m.def("frame_desc", [](const py::buffer& frame) {
        py::buffer_info keep;
        const ByteView in = read_view(frame, keep);
        fr::TensorDesc desc;
        check(fr::read_desc(in.data, in.size, &desc));
        return py::make_tuple(static_cast<int>(desc.dtype), py::tuple(py::cast(desc.shape)));
    });
    m.def(
        "analyze_layout",
        [](const py::buffer& src, int dtype, uint32_t channels, bool channel_coded, bool signs_coded,
           bool fixed_width_coded, bool rotated_preferred) {
            if (dtype < 0 || dtype > 255 || !fr::dtype_valid(static_cast<uint8_t>(dtype)))
                throw NativeError{Code::kInvalidArgument, "unknown dtype code"};
            if (channels == 0) throw NativeError{Code::kInvalidArgument, "channels must be positive"};
            py::buffer_info keep;
            const ByteView in = read_view(src, keep);
            const unsigned esize = fr::dtype_size(static_cast<fr::DType>(dtype));
            if (in.size % esize != 0) throw NativeError{Code::kInvalidArgument, "not a whole number of elements"};
            fr::Layout layout;
            {
                py::gil_scoped_release release;
                fr::LayoutCoding coding;
                coding.channel_coded = channel_coded;
                coding.signs_coded = signs_coded;
                coding.fixed_width_coded = fixed_width_coded;
                coding.rotated_preferred = rotated_preferred;
                layout = fr::choose_layout(in.data, in.size / esize, static_cast<fr::DType>(dtype), channels, coding);
            }
            py::dict d;
            d["rotate"] = layout.rotate;
            d["plane_entropy"] = layout.plane_entropy;
            d["sign_saving"] = layout.sign_saving;
            d["try_rotated"] = layout.try_rotated;
            d["residual"] = layout.residual.empty() ? py::object(py::none())
                                                    : py::object(py::bytes(reinterpret_cast<const char*>(
                                                                               layout.residual.data()),
                                                                           layout.residual.size()));
            return d;
        },
        py::arg("src"), py::arg("dtype"), py::arg("channels"), py::arg("channel_coded") = false,
        py::arg("signs_coded") = false, py::arg("fixed_width_coded") = false, py::arg("rotated_preferred") = false,
        "The encoder's layout analysis of src (elements of frame dtype code `dtype`, `channels` per row):\n"
        "rotate, the estimated bits per byte of each plane, the residual table or None, sign_saving (bits\n"
        "per element the signs method is estimated to save in the rotated layout) and try_rotated (max mode\n"
        "codes the frame rotated as well and keeps the smaller); channel_coded: as for\n"
        "dense mode (the residual weighed against channel-grouped coding); signs_coded: as for max mode (the\n"
        "rotated layout counts the signs method in); fixed_width_coded: as for fast mode (the residual weighed\n"
        "by the fixed-width code's size); rotated_preferred: as for dense mode (a large float16 or float8\n"
        "tensor's rotated layout taken unless the plain one estimates clearly smaller). For tests.");
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
                     Status st = wait_in_slices(timeout_s, [&](int64_t slice_ms) {
                         return pool->allocate(nbytes, slice_ms, &ptr, /*count_failure=*/false);
                     });
                     // One failed allocation, however many slices it waited: the last try counts it.
                     if (st.code == Code::kPoolExhausted) st = pool->allocate(nbytes, 0, &ptr);
                     check(st);
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
                                          " export(s) of it are alive (memoryviews, arrays, tensor views and "
                                          "the views made from them); release or delete them first"};
                check(b.pool->release(b.ptr));
                b.ptr = nullptr;
                return true;
            });
        install_block_buffer(reinterpret_cast<PyTypeObject*>(block.ptr()));

        py::class_<km::Completion, std::shared_ptr<km::Completion>>(m, "NativeFuture")
            .def("done", &km::Completion::done)
            .def("wait", [](km::Completion& c, double timeout_s) {
                if (timeout_s < 0) {  // no time limit: a short copy not yet taken runs here
                    py::gil_scoped_release release;
                    c.run_here();
                }
                Status st = wait_in_slices(timeout_s, [&](int64_t slice_ms) {
                    return c.wait(slice_ms) ? Status::ok() : make_status(Code::kTimeout, "");
                });
                return st.is_ok();
            }, py::arg("timeout_s") = -1.0)
            .def("check", [](const km::Completion& c) { check(c.status()); })
            // Failed because a device did not finish in time (it may still use the buffers).
            .def("device_timed_out", [](const km::Completion& c) {
                return c.done() && c.status().code == Code::kDeviceTimeout;
            })
            .def("result_size", &km::Completion::result_size)
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
            return run_or_submit(chosen, std::move(segs), o, async);
        }, py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("engine") = 0, py::arg("threads") = 0,
           py::arg("nt_threshold") = 0, py::arg("async_") = false);
        // One copy, addresses as integers (the common case without array set-up).
        m.def("mover_copy", [](uint64_t dst, uint64_t src, uint64_t n, int engine, unsigned threads, bool async) -> py::object {
            std::vector<kc::Segment> segs{{reinterpret_cast<uint8_t*>(dst), reinterpret_cast<const uint8_t*>(src), size_t(n)}};
            const Engine chosen = pick_engine(engine, segs);
            kc::CopyOptions o;
            o.threads = threads;
            if (!async && n <= (64u << 10) && chosen == Engine::kCpu) {  // too short to be worth releasing the GIL
                check(kc::copy(segs[0].dst, segs[0].src, segs[0].size, o));
                return py::none();
            }
            return run_or_submit(chosen, std::move(segs), o, async);
        }, py::arg("dst"), py::arg("src"), py::arg("n"), py::arg("engine") = 0, py::arg("threads") = 0, py::arg("async_") = false);
        // copy_async's fast path: a copy between two host buffer objects, checked here without
        // the Python layer's regions and checks (for a small copy they cost several times the
        // copy itself). Both must be C-contiguous buffers of plain items (no 'O' in their
        // formats), dst writable and at least src's size; anything else is declined, having
        // copied nothing, and the caller takes the general path, which raises the matching error.
        // mover_copy_small runs a copy of fewer than `limit` bytes on the calling thread:
        // 1 = copied, 0 = declined (also a copy that would run on DSA: one that times out
        // keeps its buffers, which the Python path does), 2 = usable but of `limit` bytes or
        // more (nothing copied: the caller starts it with mover_submit_pair).
        m.def("mover_copy_small", [](py::handle dst, py::handle src, int engine, unsigned threads, size_t limit) {
            const HostPair pair(dst, src);
            if (!pair.usable()) return 0;
            if (pair.size() >= limit) return 2;
            std::vector<kc::Segment> segs = pair.segments();
            if (pair.size() == 0) return 1;
            if (pick_engine(engine, segs) != Engine::kCpu) return 0;
            kc::CopyOptions o;
            o.threads = threads;
            if (pair.size() <= (64u << 10)) {  // too short to be worth releasing the GIL
                check(kc::copy(segs[0].dst, segs[0].src, pair.size(), o));
            } else {
                run_or_submit(Engine::kCpu, std::move(segs), o, false);  // the exports stay held meanwhile
            }
            return 1;
        }, py::arg("dst"), py::arg("src"), py::arg("engine"), py::arg("threads"), py::arg("limit"));
        // Starts the copy of a usable pair (as above) on the mover's threads: a NativeFuture, or
        // None where declined. The caller holds exports of both (memoryviews) until it ends.
        m.def("mover_submit_pair", [](py::handle dst, py::handle src, int engine, unsigned threads) -> py::object {
            const HostPair pair(dst, src);
            if (!pair.usable()) return py::none();
            std::vector<kc::Segment> segs = pair.segments();
            const Engine chosen = pick_engine(engine, segs);
            kc::CopyOptions o;
            o.threads = threads;
            return run_or_submit(chosen, std::move(segs), o, true);
        }, py::arg("dst"), py::arg("src"), py::arg("engine"), py::arg("threads"));
        // The address of a buffer object's memory, or None where it refuses an export (numpy
        // does for some dtypes, datetime64 say). The export is released at once: the caller
        // holds the object, or an export of it, while it uses the address.
        m.def("buffer_address", [](py::handle obj) -> py::object {
            const BufferView v(obj, PyBUF_RECORDS_RO);
            if (!v.held) return py::none();
            return py::int_(reinterpret_cast<uintptr_t>(v.view.buf));
        });
        // Asynchronous codec: the same frame::compress/decompress on the mover's threads.
        py::class_<FrameOut>(m, "FrameOut")
            .def(py::init<size_t>())
            .def("take", py::overload_cast<size_t>(&FrameOut::take))
            .def_readonly("capacity", &FrameOut::capacity);
        m.def("mover_compress_async", [](uint64_t addr, uint64_t nbytes, uint8_t dtype, std::vector<uint64_t> shape,
                                         uint8_t mode, uint32_t block_bytes, unsigned threads, FrameOut& out, bool lanes,
                                         std::shared_ptr<kvcore::frame::AnalyzedLayout> layout, uint8_t backend,
                                         bool deflate) {
            namespace fr = kvcore::frame;
            fr::EncodeOptions options = encode_options(mode, backend, deflate, lanes, block_bytes, py::none());
            options.threads = threads;
            fr::TensorDesc desc{static_cast<fr::DType>(dtype), std::move(shape)};
            check(fr::validate_desc(desc, nbytes, block_bytes));
            if (out.capacity < fr::max_frame_size(desc, block_bytes))
                throw NativeError{Code::kBufferTooSmall, "frame buffer below max_frame_size"};
            check(fr::check_layout(layout.get(), desc, options));
            fr::CompressJob job{reinterpret_cast<const uint8_t*>(addr), nbytes, std::move(desc), nullptr, 0};
            job.layout = layout.get();
            out.attach(job);
            // The task holds the layout until it has coded with it.
            return km::submit([job, options, in_head = out.in_head, layout](km::Completion& c) mutable {
                const Status st = fr::compress_many(&job, 1, options);
                in_head->store(job.in_head, std::memory_order_release);
                c.set_result_size(job.written);
                return st;
            });
        }, py::arg("addr"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"), py::arg("mode"),
           py::arg("block_bytes"), py::arg("threads"), py::arg("out"), py::arg("lanes") = false,
           py::arg("layout") = nullptr, py::arg("backend") = 0, py::arg("deflate") = false);
        m.def("mover_decompress_async", [](uint64_t frame, uint64_t size, uint64_t dst, uint64_t dst_size,
                                           unsigned threads, bool fresh) {
            const kvcore::frame::FrameJob job{reinterpret_cast<const uint8_t*>(frame), size,
                                              kvcore::frame::OutputRuns{reinterpret_cast<uint8_t*>(dst), dst_size}, fresh};
            return km::submit([job, threads](km::Completion&) { return kvcore::frame::decompress_many(&job, 1, threads); });
        }, py::arg("frame"), py::arg("size"), py::arg("dst"), py::arg("dst_size"), py::arg("threads"),
           py::arg("fresh") = false);
        m.def("mover_engine_for", [](uint64_t total, uint64_t count, int engine) {
            std::vector<kc::Segment> segs(count ? count : 1, kc::Segment{nullptr, nullptr, size_t(total / (count ? count : 1))});
            return pick_engine(engine, segs) == Engine::kDsa ? "dsa" : "cpu";
        });
        m.def("copy_variant", [] { return std::string(kc::variant()); });
        m.def("llc_bytes", &kvcore::cpu::llc_bytes);

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
            engine_health(e, d);
            return d;
        });
        py::class_<kd::EmulatedEngine>(m, "DsaEmulatedEngine",
                                       "A DSA engine on a software-emulated work queue that lives across copies (tests).")
            .def(py::init([](uint32_t max_batch, uint64_t max_transfer, uint32_t fault_every, uint32_t fault_after,
                             bool dedicated, uint32_t wq_size, uint32_t stall_first, uint32_t stall_ms,
                             uint32_t timeout_ms) {
                     kd::EmulationOptions o =
                         emulation_options(max_batch, max_transfer, fault_every, fault_after, dedicated, wq_size);
                     o.stall_first = stall_first;
                     o.stall_ms = stall_ms;
                     o.timeout_ms = timeout_ms;
                     return std::make_unique<kd::EmulatedEngine>(o);
                 }),
                 py::arg("max_batch") = 32, py::arg("max_transfer") = 1u << 20, py::arg("fault_every") = 0,
                 py::arg("fault_after") = 0, py::arg("dedicated") = true, py::arg("wq_size") = 16,
                 py::arg("stall_first") = 0, py::arg("stall_ms") = 0, py::arg("timeout_ms") = 5000)
            .def("copy", [](kd::EmulatedEngine& self, const py::buffer& dsts, const py::buffer& srcs,
                            const py::buffer& sizes) {
                const std::vector<kc::Segment> segs = address_segments(dsts, srcs, sizes);
                Status st;
                {
                    py::gil_scoped_release release;
                    st = self.copy_many(segs.data(), segs.size());
                }
                check(st);
            }, py::arg("dsts"), py::arg("srcs"), py::arg("sizes"))
            .def("complete_held", [](kd::EmulatedEngine& self) {
                py::gil_scoped_release release;
                self.complete_held();
            }, "The emulated device runs the descriptors it holds (stall_first with stall_ms=0) now.")
            .def("stats", [](kd::EmulatedEngine& self) {
                py::dict r = emulation_stats_dict(self.stats());
                engine_health(&self.engine(), r);
                return r;
            });
        m.def("dsa_emulated_copy", [](const py::buffer& dsts, const py::buffer& srcs, const py::buffer& sizes,
                                       uint32_t max_batch, uint64_t max_transfer, uint32_t fault_every,
                                       uint32_t fault_after, bool dedicated, uint32_t wq_size) {
            const std::vector<kc::Segment> segs = address_segments(dsts, srcs, sizes);
            const kd::EmulationOptions o =
                emulation_options(max_batch, max_transfer, fault_every, fault_after, dedicated, wq_size);
            kd::EmulationStats stats;
            Status st;
            {
                py::gil_scoped_release release;
                st = kd::emulated_copy_many(segs.data(), segs.size(), o, &stats);
            }
            check(st);
            return emulation_stats_dict(stats);
        }, py::arg("dsts"), py::arg("srcs"), py::arg("sizes"), py::arg("max_batch") = 32,
           py::arg("max_transfer") = 1u << 20, py::arg("fault_every") = 0, py::arg("fault_after") = 0,
           py::arg("dedicated") = true, py::arg("wq_size") = 16);
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
    {
        // XXH3-64 over data that arrives in pieces (a chunk blob read or written in
        // segments): update() releases the GIL, so an I/O thread hashes while another
        // thread decodes. Calls on one object are serialized.
        struct Checksum64 {
            std::mutex mutex;
            kvcore::StreamingChecksum64 state;
            uint64_t bytes = 0;
        };
        py::class_<Checksum64>(m, "Checksum64",
                               "XXH3-64 (same digest as xxhash.xxh3_64) over data given in pieces.")
            .def(py::init([](uint64_t seed) {
                     auto c = std::make_unique<Checksum64>();
                     c->state.reset(seed);
                     return c;
                 }),
                 py::arg("seed") = 0)
            .def(
                "update",
                [](Checksum64& c, const py::buffer& data) {
                    py::buffer_info keep;
                    const ByteView in = read_view(data, keep);
                    py::gil_scoped_release release;
                    std::lock_guard<std::mutex> lock(c.mutex);
                    c.state.update(in.data, in.size);
                    c.bytes += in.size;
                },
                py::arg("data"))
            .def("intdigest",
                 [](Checksum64& c) {
                     std::lock_guard<std::mutex> lock(c.mutex);
                     return c.state.digest();
                 })
            .def_property_readonly("nbytes", [](Checksum64& c) {
                std::lock_guard<std::mutex> lock(c.mutex);
                return c.bytes;
            });

        m.def(
            "compress_batch_into",
            [](const std::vector<std::tuple<uint64_t, uint64_t, uint8_t, std::vector<uint64_t>>>& srcs,
               const std::vector<py::buffer>& outs, uint8_t mode, uint8_t backend, bool deflate, bool lanes,
               uint32_t block_bytes, const py::object& threads,
               const std::vector<std::shared_ptr<fr::AnalyzedLayout>>& layouts) {
                if (srcs.size() != outs.size()) throw NativeError{Code::kInvalidArgument, "srcs and outs differ in length"};
                std::vector<py::buffer_info> keep(outs.size());
                std::vector<fr::CompressJob> jobs;
                for (size_t i = 0; i < srcs.size(); ++i) {
                    const auto& [addr, nbytes, dtype, shape] = srcs[i];
                    jobs.push_back(compress_job(addr, nbytes, dtype, shape, block_bytes));
                    const MutableView dst = write_view(outs[i], keep[i]);
                    jobs.back().dst = dst.data;
                    jobs.back().cap = dst.size;
                }
                set_layouts(jobs, layouts);
                const fr::EncodeOptions options = encode_options(mode, backend, deflate, lanes, block_bytes, threads);
                Status st;
                {
                    py::gil_scoped_release release;
                    // compress_many checks every shape against its input size and every
                    // output capacity against max_frame_size before writing anything.
                    st = fr::compress_many(jobs.data(), jobs.size(), options);
                }
                check(st);
                std::vector<size_t> written;
                for (const auto& j : jobs) written.push_back(j.written);
                return written;
            },
            py::arg("srcs"), py::arg("outs"), py::arg("mode") = 0, py::arg("backend") = 0, py::arg("deflate") = false,
            py::arg("lanes") = false, py::arg("block_bytes") = 0, py::arg("threads") = py::none(),
            py::arg("layouts") = std::vector<std::shared_ptr<fr::AnalyzedLayout>>{},
            "Compresses every srcs[i] = (address, bytes, dtype code, shape) into the start of outs[i] (at least\n"
            "max_frame_size bytes), the blocks of all of them spread over the threads; returns the frames' sizes.\n"
            "layouts: empty, or one Layout (or None) per source.");
    }
}
