#include "qat/qat.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "qat/qatzip_abi.h"

namespace kvcore::qat {

namespace abi {

const char* code_name(int rc) {
    switch (rc) {
        case QZ_OK: return "QZ_OK";
        case QZ_DUPLICATE: return "QZ_DUPLICATE";
        case QZ_FORCE_SW: return "QZ_FORCE_SW";
        case QZ_PARAMS: return "QZ_PARAMS";
        case QZ_FAIL: return "QZ_FAIL";
        case QZ_BUF_ERROR: return "QZ_BUF_ERROR";
        case QZ_DATA_ERROR: return "QZ_DATA_ERROR";
        case QZ_TIMEOUT: return "QZ_TIMEOUT";
        case QZ_INTEG: return "QZ_INTEG";
        case QZ_NO_HW: return "QZ_NO_HW";
        case QZ_NO_MDRV: return "QZ_NO_MDRV";
        case QZ_NO_INST_ATTACH: return "QZ_NO_INST_ATTACH";
        case QZ_LOW_MEM: return "QZ_LOW_MEM";
        case QZ_LOW_DEST_MEM: return "QZ_LOW_DEST_MEM";
        case QZ_UNSUPPORTED_FMT: return "QZ_UNSUPPORTED_FMT";
        case QZ_NONE: return "QZ_NONE";
        case QZ_NOSW_NO_HW: return "QZ_NOSW_NO_HW";
        case QZ_NOSW_NO_MDRV: return "QZ_NOSW_NO_MDRV";
        case QZ_NOSW_NO_INST_ATTACH: return "QZ_NOSW_NO_INST_ATTACH";
        case QZ_NOSW_LOW_MEM: return "QZ_NOSW_LOW_MEM";
        case QZ_NO_SW_AVAIL: return "QZ_NO_SW_AVAIL";
        case QZ_NOSW_UNSUPPORTED_FMT: return "QZ_NOSW_UNSUPPORTED_FMT";
        case QZ_NOT_SUPPORTED: return "QZ_NOT_SUPPORTED";
        default: return "QZ_UNKNOWN";
    }
}

}  // namespace abi

namespace {

std::string code_text(int rc) { return std::string(abi::code_name(rc)) + " (" + std::to_string(rc) + ")"; }

// One opened QATzip library: its entry points and the result of its probe.
struct Library {
    void* handle = nullptr;  // never dlclosed (see qat.h)
    std::string path;
    bool hardware = false;
    int probe_code = 0;
    std::string message;
    uint32_t min_bytes = 4096;

    abi::qzInit_fn init = nullptr;
    abi::qzGetDefaultsDeflate_fn get_defaults = nullptr;
    abi::qzSetupSessionDeflate_fn setup = nullptr;
    abi::qzCompress_fn compress = nullptr;
    abi::qzCompressExt_fn compress_ext = nullptr;
    abi::qzDecompress_fn decompress = nullptr;
    abi::qzDecompressExt_fn decompress_ext = nullptr;
    abi::qzTeardownSession_fn teardown = nullptr;
    abi::qzClose_fn close = nullptr;
    abi::qzMalloc_fn malloc_fn = nullptr;
    abi::qzFree_fn free_fn = nullptr;
    abi::qzMemFindAddr_fn find_addr = nullptr;
};

struct AtomicCounters {
    std::atomic<uint64_t> hw_compress_calls{0}, hw_decompress_calls{0}, hw_bytes_in{0}, hw_bytes_out{0},
        sw_execution_calls{0}, fallback_pieces{0}, buf_errors{0}, data_errors{0}, other_errors{0},
        sessions_opened{0}, sessions_closed{0};
    std::atomic<int> last_error_code{0};
};

AtomicCounters g_counters;

struct Registry {
    std::mutex mutex;
    std::shared_ptr<Library> current;
    bool configured = false;  // load() or unload() was called, or the default was tried
    std::string last_message = "not loaded";
    std::string last_path;
    std::unordered_map<void*, std::shared_ptr<Library>> pinned;  // pinned_alloc() blocks
};

Registry& registry() {
    static Registry r;
    return r;
}

std::shared_ptr<Library> current_library() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    return r.current;
}

void note_error(int rc) {
    if (rc == abi::QZ_BUF_ERROR)
        g_counters.buf_errors.fetch_add(1, std::memory_order_relaxed);
    else if (rc == abi::QZ_DATA_ERROR)
        g_counters.data_errors.fetch_add(1, std::memory_order_relaxed);
    else
        g_counters.other_errors.fetch_add(1, std::memory_order_relaxed);
    g_counters.last_error_code.store(rc, std::memory_order_relaxed);
}

// A QATzip session bound to one library and compression level.
class Session {
public:
    Session() = default;
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    ~Session() { close(); }

    // Opens the session (qzInit with software backup off, then raw-DEFLATE setup).
    // Returns QZ_OK or the failing QATzip code.
    int open(std::shared_ptr<Library> lib, int level) {
        close();
        std::memset(&sess_, 0, sizeof(sess_));
        int rc = lib->init(&sess_, 0);
        if (rc != abi::QZ_OK && rc != abi::QZ_DUPLICATE) return rc;
        abi::ParamsStorage ps;
        std::memset(&ps, 0, sizeof(ps));
        rc = lib->get_defaults(&ps.p);
        if (rc == abi::QZ_OK) {
            abi::QzSessionParamsCommon& c = ps.p.common_params;
            c.direction = abi::QZ_DIR_BOTH;
            c.comp_lvl = static_cast<unsigned>(level);
            c.comp_algorithm = abi::QZ_DEFLATE;
            c.sw_backup = 0;
            c.hw_buff_sz = kHwBufferBytes;
            c.strm_buff_sz = kHwBufferBytes;
            c.input_sz_thrshold = abi::QZ_COMP_THRESHOLD_MINIMUM;
            ps.p.huffman_hdr = abi::QZ_DYNAMIC_HDR;
            ps.p.data_fmt = abi::QZ_DEFLATE_RAW;
            rc = lib->setup(&sess_, &ps.p);
        }
        if (rc != abi::QZ_OK && rc != abi::QZ_DUPLICATE) {
            lib->teardown(&sess_);
            lib->close(&sess_);
            return rc;
        }
        lib_ = std::move(lib);
        level_ = level;
        g_counters.sessions_opened.fetch_add(1, std::memory_order_relaxed);
        return abi::QZ_OK;
    }

    void close() {
        if (!lib_) return;
        lib_->teardown(&sess_);
        lib_->close(&sess_);
        lib_.reset();
        g_counters.sessions_closed.fetch_add(1, std::memory_order_relaxed);
    }

    bool matches(const Library* lib, int level) const { return lib_.get() == lib && level_ == level; }
    bool bound_to(const Library* lib) const { return lib_.get() == lib; }
    int level() const { return level_; }
    abi::QzSession* get() { return &sess_; }

private:
    std::shared_ptr<Library> lib_;
    int level_ = -1;
    abi::QzSession sess_{};
};

thread_local Session t_session;

int clamp_level(int level) { return std::min(9, std::max(1, level)); }

// This thread's session for lib at level, opened on first use. Returns a QATzip code.
int thread_session(const std::shared_ptr<Library>& lib, int level, abi::QzSession** out) {
    if (!t_session.matches(lib.get(), level)) {
        const int rc = t_session.open(lib, level);
        if (rc != abi::QZ_OK) return rc;
    }
    *out = t_session.get();
    return abi::QZ_OK;
}

template <typename T>
bool resolve(void* handle, const char* name, T* fn) {
    *fn = reinterpret_cast<T>(dlsym(handle, name));
    return *fn != nullptr;
}

}  // namespace

namespace {

// Serializes load(), unload() and the first default load (held across dlopen and the probe).
std::mutex& config_mutex() {
    static std::mutex m;
    return m;
}

Status load_locked(const LoadOptions& options) {
    const std::string path = options.library_path.empty() ? "libqatzip.so.3" : options.library_path;
    Registry& r = registry();
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        r.configured = true;
        r.current.reset();
        r.last_path = path;
    }
    auto fail = [&](std::string message) {
        std::lock_guard<std::mutex> lock(r.mutex);
        r.last_message = message;
        return make_status(Code::kUnsupported, "QAT: " + message);
    };
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* err = dlerror();
        return fail("cannot load " + path + ": " + (err ? err : "unknown error"));
    }
    auto lib = std::make_shared<Library>();
    lib->handle = handle;
    lib->path = path;
    lib->min_bytes = options.min_bytes;
    const bool ok = resolve(handle, "qzInit", &lib->init) &&
                    resolve(handle, "qzGetDefaultsDeflate", &lib->get_defaults) &&
                    resolve(handle, "qzSetupSessionDeflate", &lib->setup) &&
                    resolve(handle, "qzCompress", &lib->compress) &&
                    resolve(handle, "qzDecompress", &lib->decompress) &&
                    resolve(handle, "qzTeardownSession", &lib->teardown) &&
                    resolve(handle, "qzClose", &lib->close);
    if (!ok) return fail(path + " lacks a QATzip entry point (" + dlerror() + ")");
    resolve(handle, "qzCompressExt", &lib->compress_ext);
    resolve(handle, "qzDecompressExt", &lib->decompress_ext);
    resolve(handle, "qzMalloc", &lib->malloc_fn);
    resolve(handle, "qzFree", &lib->free_fn);
    resolve(handle, "qzMemFindAddr", &lib->find_addr);
    dlerror();  // clear what the optional look-ups left

    // Probe: a full session set-up with software backup off on a scratch session.
    {
        Session probe;
        const int rc = probe.open(lib, 1);
        lib->probe_code = rc;
        lib->hardware = rc == abi::QZ_OK;
        lib->message = lib->hardware ? "QAT hardware attached" : "no QAT hardware: " + code_text(rc);
    }
    std::lock_guard<std::mutex> lock(r.mutex);
    r.last_message = lib->message;
    r.current = std::move(lib);
    return Status::ok();
}

}  // namespace

Status load(const LoadOptions& options) {
    std::lock_guard<std::mutex> config(config_mutex());
    return load_locked(options);
}

void unload() {
    std::lock_guard<std::mutex> config(config_mutex());
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.configured = true;
    r.current.reset();
    r.last_path.clear();
    r.last_message = "unloaded";
}

void ensure_default_loaded() {
    Registry& r = registry();
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        if (r.configured) return;
    }
    std::lock_guard<std::mutex> config(config_mutex());
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        if (r.configured) return;  // another thread loaded meanwhile
    }
    (void)load_locked(LoadOptions{});  // absence of the system library is a normal outcome
}

StatusReport status() {
    ensure_default_loaded();
    StatusReport s;
    {
        Registry& r = registry();
        std::lock_guard<std::mutex> lock(r.mutex);
        s.message = r.last_message;
        s.library = r.last_path;
        if (r.current) {
            s.loaded = true;
            s.hardware = r.current->hardware;
            s.probe_code = r.current->probe_code;
            s.min_bytes = r.current->min_bytes;
            s.has_ext_api = r.current->compress_ext != nullptr && r.current->decompress_ext != nullptr;
        }
    }
    const auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    Counters& c = s.counters;
    c.hw_compress_calls = ld(g_counters.hw_compress_calls);
    c.hw_decompress_calls = ld(g_counters.hw_decompress_calls);
    c.hw_bytes_in = ld(g_counters.hw_bytes_in);
    c.hw_bytes_out = ld(g_counters.hw_bytes_out);
    c.sw_execution_calls = ld(g_counters.sw_execution_calls);
    c.fallback_pieces = ld(g_counters.fallback_pieces);
    c.buf_errors = ld(g_counters.buf_errors);
    c.data_errors = ld(g_counters.data_errors);
    c.other_errors = ld(g_counters.other_errors);
    c.sessions_opened = ld(g_counters.sessions_opened);
    c.sessions_closed = ld(g_counters.sessions_closed);
    s.last_error_code = g_counters.last_error_code.load(std::memory_order_relaxed);
    return s;
}

void reset_counters() {
    for (auto* a : {&g_counters.hw_compress_calls, &g_counters.hw_decompress_calls, &g_counters.hw_bytes_in,
                    &g_counters.hw_bytes_out, &g_counters.sw_execution_calls, &g_counters.fallback_pieces,
                    &g_counters.buf_errors, &g_counters.data_errors, &g_counters.other_errors,
                    &g_counters.sessions_opened, &g_counters.sessions_closed})
        a->store(0, std::memory_order_relaxed);
    g_counters.last_error_code.store(0, std::memory_order_relaxed);
}

bool hardware_available() {
    ensure_default_loaded();
    auto lib = current_library();
    return lib && lib->hardware;
}

uint32_t min_bytes() {
    auto lib = current_library();
    return lib ? lib->min_bytes : 0;
}

void count_fallback() { g_counters.fallback_pieces.fetch_add(1, std::memory_order_relaxed); }

Status compress_piece(const uint8_t* src, uint32_t n, uint8_t* dst, uint32_t cap, int level, uint32_t* written) {
    *written = 0;
    auto lib = current_library();
    if (!lib || !lib->hardware)
        return make_status(Code::kUnsupported, lib ? "QAT: " + lib->message : "QAT: QATzip is not loaded");
    if (n > kHwBufferBytes) return invalid("QAT: piece larger than the hardware buffer");
    abi::QzSession* sess = nullptr;
    int rc = thread_session(lib, clamp_level(level), &sess);
    if (rc != abi::QZ_OK) {
        note_error(rc);
        return make_status(Code::kBackendError, "QAT: session set-up failed: " + code_text(rc));
    }
    unsigned src_len = n, dst_len = cap;
    uint64_t ext_rc = 0;
    rc = lib->compress_ext ? lib->compress_ext(sess, src, &src_len, dst, &dst_len, 1, &ext_rc)
                           : lib->compress(sess, src, &src_len, dst, &dst_len, 1);
    if (rc == abi::QZ_OK && src_len != n) rc = abi::QZ_BUF_ERROR;  // stopped early: output full
    if (rc == abi::QZ_BUF_ERROR) {
        note_error(rc);
        return make_status(Code::kBufferTooSmall, "QAT: compressed piece does not fit (QZ_BUF_ERROR)");
    }
    if (rc != abi::QZ_OK) {
        note_error(rc);
        return make_status(Code::kBackendError, "QAT: qzCompress failed: " + code_text(rc));
    }
    if (dst_len > cap) {
        note_error(abi::QZ_FAIL);
        return make_status(Code::kBackendError, "QAT: qzCompress reported more output than the buffer holds");
    }
    if (ext_rc & abi::QZ_SW_EXECUTION_MASK) {
        g_counters.sw_execution_calls.fetch_add(1, std::memory_order_relaxed);
    } else {
        g_counters.hw_compress_calls.fetch_add(1, std::memory_order_relaxed);
        g_counters.hw_bytes_in.fetch_add(n, std::memory_order_relaxed);
        g_counters.hw_bytes_out.fetch_add(dst_len, std::memory_order_relaxed);
    }
    *written = dst_len;
    return Status::ok();
}

Status decompress_piece(const uint8_t* src, uint32_t src_size, uint8_t* dst, uint32_t n) {
    auto lib = current_library();
    if (!lib || !lib->hardware)
        return make_status(Code::kUnsupported, lib ? "QAT: " + lib->message : "QAT: QATzip is not loaded");
    abi::QzSession* sess = nullptr;
    // Any compression level serves decompression: keep this thread's session if it is bound to lib.
    int rc = thread_session(lib, t_session.bound_to(lib.get()) ? t_session.level() : 1, &sess);
    if (rc != abi::QZ_OK) {
        note_error(rc);
        return make_status(Code::kBackendError, "QAT: session set-up failed: " + code_text(rc));
    }
    unsigned src_len = src_size, dst_len = n;
    uint64_t ext_rc = 0;
    rc = lib->decompress_ext ? lib->decompress_ext(sess, src, &src_len, dst, &dst_len, &ext_rc)
                             : lib->decompress(sess, src, &src_len, dst, &dst_len);
    if (rc == abi::QZ_DATA_ERROR || rc == abi::QZ_BUF_ERROR) {
        note_error(rc);
        return corrupt(std::string("deflate piece rejected by QAT: ") + code_text(rc));
    }
    if (rc != abi::QZ_OK) {
        note_error(rc);
        return make_status(Code::kBackendError, "QAT: qzDecompress failed: " + code_text(rc));
    }
    if (src_len != src_size || dst_len != n)
        return corrupt("deflate piece: QAT decoded " + std::to_string(dst_len) + " bytes from " +
                       std::to_string(src_len) + " (expected " + std::to_string(n) + " from " +
                       std::to_string(src_size) + ")");
    if (ext_rc & abi::QZ_SW_EXECUTION_MASK) {
        g_counters.sw_execution_calls.fetch_add(1, std::memory_order_relaxed);
    } else {
        g_counters.hw_decompress_calls.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::ok();
}

void* pinned_alloc(size_t bytes, int numa_node) {
    auto lib = current_library();
    if (!lib || !lib->hardware || !lib->malloc_fn || !lib->free_fn || bytes == 0) return nullptr;
    void* p = lib->malloc_fn(bytes, numa_node < 0 ? abi::QZ_AUTO_SELECT_NUMA_NODE : numa_node, abi::PINNED_MEM);
    if (p == nullptr) return nullptr;
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pinned.emplace(p, std::move(lib));
    return p;
}

void pinned_free(void* p) {
    if (p == nullptr) return;
    std::shared_ptr<Library> lib;
    {
        Registry& r = registry();
        std::lock_guard<std::mutex> lock(r.mutex);
        auto it = r.pinned.find(p);
        if (it == r.pinned.end()) return;  // not ours: ignore rather than free foreign memory
        lib = std::move(it->second);
        r.pinned.erase(it);
    }
    lib->free_fn(p);
}

bool is_pinned(const void* p) {
    auto lib = current_library();
    if (!lib || !lib->find_addr || p == nullptr) return false;
    return lib->find_addr(static_cast<unsigned char*>(const_cast<void*>(p))) == abi::PINNED_MEM;
}

}  // namespace kvcore::qat
