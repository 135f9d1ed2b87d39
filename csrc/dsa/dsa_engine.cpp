#include "dsa/dsa_engine.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "common/arch.h"
#if KVCORE_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "dsa/dsa_desc.h"

namespace kvcore::dsa {

const char* status_name(uint8_t status) {
    switch (status & kStatusMask) {
        case 0x00: return "none";
        case 0x01: return "success";
        case 0x02: return "success-pred";
        case 0x03: return "page-fault-nobof";
        case 0x04: return "page-fault-ir";
        case 0x05: return "batch-fail";
        case 0x06: return "batch-page-fault";
        case 0x07: return "dr-offset-noinc";
        case 0x08: return "dr-offset-erange";
        case 0x09: return "dif-error";
        case 0x10: return "bad-opcode";
        case 0x11: return "invalid-flags";
        case 0x12: return "nonzero-reserved";
        case 0x13: return "xfer-size-out-of-range";
        case 0x14: return "desc-count-out-of-range";
        case 0x15: return "dr-out-of-range";
        case 0x16: return "overlapping-buffers";
        case 0x17: return "dualcast-error";
        case 0x18: return "desc-list-alignment";
        case 0x19: return "invalid-int-handle";
        case 0x1a: return "completion-record-translation";
        case 0x1b: return "completion-record-alignment";
        case 0x1c: return "address-alignment";
        case 0x1d: return "privilege";
        case 0x1e: return "traffic-class";
        case 0x1f: return "readback-page-fault";
        case 0x20: return "hardware-error";
        case 0x21: return "hardware-error-drb";
        case 0x22: return "translation-failure";
        default: return "unknown";
    }
}

namespace {

// ---- libaccel-config, resolved at run time (signatures of libaccel_config.h) ----
struct accfg_ctx;
struct accfg_device;
struct accfg_wq;

constexpr int kDeviceEnabled = 1;  // ACCFG_DEVICE_ENABLED
constexpr int kWqShared = 0;       // ACCFG_WQ_SHARED
constexpr int kWqDedicated = 1;    // ACCFG_WQ_DEDICATED
constexpr int kWqEnabled = 1;      // ACCFG_WQ_ENABLED
constexpr int kWqTypeUser = 2;     // ACCFG_WQT_USER

struct Accfg {
    int (*new_ctx)(accfg_ctx**);
    accfg_ctx* (*unref)(accfg_ctx*);
    accfg_device* (*device_get_first)(accfg_ctx*);
    accfg_device* (*device_get_next)(accfg_device*);
    const char* (*device_get_devname)(accfg_device*);
    int (*device_get_state)(accfg_device*);
    int (*device_get_numa_node)(accfg_device*);
    accfg_wq* (*wq_get_first)(accfg_device*);
    accfg_wq* (*wq_get_next)(accfg_wq*);
    const char* (*wq_get_devname)(accfg_wq*);
    int (*wq_get_mode)(accfg_wq*);
    int (*wq_get_state)(accfg_wq*);
    int (*wq_get_type)(accfg_wq*);
    uint64_t (*wq_get_size)(accfg_wq*);
    unsigned (*wq_get_max_batch_size)(accfg_wq*);
    uint64_t (*wq_get_max_transfer_size)(accfg_wq*);
    int (*wq_get_block_on_fault)(accfg_wq*);
    int (*wq_get_user_dev_path)(accfg_wq*, char*, size_t);
};

struct DlCloser {
    void operator()(void* h) const {
        if (h) dlclose(h);
    }
};
using Library = std::unique_ptr<void, DlCloser>;

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* missing) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr) {
        *missing = name;
        return false;
    }
    return true;
}

bool load_accfg(void* lib, Accfg* a, std::string* missing) {
    return resolve(lib, "accfg_new", &a->new_ctx, missing) && resolve(lib, "accfg_unref", &a->unref, missing) &&
           resolve(lib, "accfg_device_get_first", &a->device_get_first, missing) &&
           resolve(lib, "accfg_device_get_next", &a->device_get_next, missing) &&
           resolve(lib, "accfg_device_get_devname", &a->device_get_devname, missing) &&
           resolve(lib, "accfg_device_get_state", &a->device_get_state, missing) &&
           resolve(lib, "accfg_device_get_numa_node", &a->device_get_numa_node, missing) &&
           resolve(lib, "accfg_wq_get_first", &a->wq_get_first, missing) &&
           resolve(lib, "accfg_wq_get_next", &a->wq_get_next, missing) &&
           resolve(lib, "accfg_wq_get_devname", &a->wq_get_devname, missing) &&
           resolve(lib, "accfg_wq_get_mode", &a->wq_get_mode, missing) &&
           resolve(lib, "accfg_wq_get_state", &a->wq_get_state, missing) &&
           resolve(lib, "accfg_wq_get_type", &a->wq_get_type, missing) &&
           resolve(lib, "accfg_wq_get_size", &a->wq_get_size, missing) &&
           resolve(lib, "accfg_wq_get_max_batch_size", &a->wq_get_max_batch_size, missing) &&
           resolve(lib, "accfg_wq_get_max_transfer_size", &a->wq_get_max_transfer_size, missing) &&
           resolve(lib, "accfg_wq_get_block_on_fault", &a->wq_get_block_on_fault, missing) &&
           resolve(lib, "accfg_wq_get_user_dev_path", &a->wq_get_user_dev_path, missing);
}

#if KVCORE_X86
void cpu_submit_features(bool* movdir64b, bool* enqcmd) {
    uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
    *movdir64b = *enqcmd = false;
    if (__get_cpuid_max(0, nullptr) < 7) return;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    *movdir64b = ecx & (1u << 28);
    *enqcmd = ecx & (1u << 29);
}

// ---- submission instructions ----
__attribute__((target("movdir64b"))) void submit_movdir64b(void* portal, const void* desc) {
    _movdir64b(portal, desc);
}

// Returns true when the shared queue accepted the descriptor.
__attribute__((target("enqcmd"))) bool submit_enqcmd(void* portal, const void* desc) {
    return _enqcmd(portal, desc) == 0;
}

void spin_pause() { _mm_pause(); }
void store_fence() { _mm_sfence(); }
#else
// DSA is an x86 device, submitted to by x86 instructions: discovery finds no
// CPU support here, so no queue is opened (only a test's software device runs).
void cpu_submit_features(bool* movdir64b, bool* enqcmd) { *movdir64b = *enqcmd = false; }
void submit_movdir64b(void*, const void*) {}
bool submit_enqcmd(void*, const void*) { return false; }
void spin_pause() {}
void store_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

constexpr auto kSubmitTimeout = std::chrono::seconds(5);  // a shared queue that stays full
constexpr int kMaxFaultRetries = 256;
constexpr size_t kBatchWindow = 4;  // batches in flight per copy_many

void touch(uint64_t addr, bool write) {
    volatile uint8_t* p = reinterpret_cast<volatile uint8_t*>(addr);
    if (write) {
        const uint8_t v = *p;
        *p = v;
    } else {
        (void)*p;
    }
}

}  // namespace

Discovery discover(const std::string& library) {
    Discovery d;
    cpu_submit_features(&d.cpu_movdir64b, &d.cpu_enqcmd);
    Library lib(dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL));
    if (!lib) {
        const char* err = dlerror();
        d.reason = library + " is not loadable (" + (err ? err : "unknown error") +
                   "); install libaccel-config1 to use Intel DSA";
        return d;
    }
    Accfg a{};
    std::string missing;
    if (!load_accfg(lib.get(), &a, &missing)) {
        d.reason = library + " lacks " + missing;
        return d;
    }
    d.library_loaded = true;
    accfg_ctx* ctx = nullptr;
    if (a.new_ctx(&ctx) != 0 || ctx == nullptr) {
        d.reason = "accfg_new failed (no idxd driver?)";
        return d;
    }
    size_t enabled_user = 0;
    for (accfg_device* dev = a.device_get_first(ctx); dev; dev = a.device_get_next(dev)) {
        const char* dname = a.device_get_devname(dev);
        if (!dname || std::strncmp(dname, "dsa", 3) != 0) continue;
        if (a.device_get_state(dev) != kDeviceEnabled) continue;
        for (accfg_wq* wq = a.wq_get_first(dev); wq; wq = a.wq_get_next(wq)) {
            if (a.wq_get_state(wq) != kWqEnabled || a.wq_get_type(wq) != kWqTypeUser) continue;
            const int mode = a.wq_get_mode(wq);
            if (mode != kWqShared && mode != kWqDedicated) continue;
            ++enabled_user;
            WorkQueueInfo q;
            q.device = dname;
            const char* wname = a.wq_get_devname(wq);
            q.name = wname ? wname : "";
            char path[512] = {0};
            if (a.wq_get_user_dev_path(wq, path, sizeof(path)) == 0 && path[0])
                q.path = path;
            else
                q.path = "/dev/dsa/" + q.name;
            q.dedicated = mode == kWqDedicated;
            q.numa_node = a.device_get_numa_node(dev);
            q.size = uint32_t(a.wq_get_size(wq));
            q.max_batch = a.wq_get_max_batch_size(wq);
            q.max_transfer = a.wq_get_max_transfer_size(wq);
            q.block_on_fault = a.wq_get_block_on_fault(wq) > 0;
            if (q.dedicated ? !d.cpu_movdir64b : !d.cpu_enqcmd) continue;
            d.queues.push_back(std::move(q));
        }
    }
    a.unref(ctx);
    if (d.queues.empty()) {
        if (enabled_user == 0)
            d.reason = "no enabled user-mode DSA work queue (configure one with accel-config)";
        else
            d.reason = "this CPU lacks MOVDIR64B/ENQCMD for the enabled DSA work queues";
    }
    return d;
}

// ---- one mapped work queue ----
class Queue {
public:
    static Status open(const WorkQueueInfo& info, std::unique_ptr<Queue>* out) {
        const int fd = ::open(info.path.c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0)
            return make_status(Code::kBackendError, "cannot open DSA work queue " + info.path + ": " + std::strerror(errno));
        void* portal = mmap(nullptr, 0x1000, PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (portal == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            return make_status(Code::kBackendError, "cannot map the portal of " + info.path + ": " + std::strerror(err));
        }
        *out = std::make_unique<Queue>(info, fd, portal);
        return Status::ok();
    }

    Queue(const WorkQueueInfo& info, int fd, void* portal) : info_(info), fd_(fd), portal_(portal) {}
    // A queue whose "device" is a function executing the descriptor (tests).
    Queue(const WorkQueueInfo& info, std::function<void(const HwDesc*)> device)
        : info_(info), fd_(-1), portal_(nullptr), device_(std::move(device)) {}
    // The file is closed before the memory of overdue descriptors is freed, as
    // a member: releasing it waits for the descriptors in flight (the idxd
    // driver drains the dedicated queue, or this process's PASID on a shared
    // one: drivers/dma/idxd/cdev.c).
    ~Queue() {
        if (portal_) munmap(portal_, 0x1000);
        if (fd_ >= 0) ::close(fd_);
    }
    Queue(const Queue&) = delete;
    Queue& operator=(const Queue&) = delete;

    const WorkQueueInfo& info() const { return info_; }

    // Dedicated queues have no back-pressure: never more descriptors in
    // flight than the queue has entries (slots; see Slot).
    bool try_acquire() {
        if (!info_.dedicated) return true;
        int cur = inflight_.load(std::memory_order_relaxed);
        while (cur < entries())
            if (inflight_.compare_exchange_weak(cur, cur + 1)) return true;
        return false;
    }
    // Only for a thread that holds no slot: the slots it waits for must be
    // returned by threads that do not wait in turn. False when every slot came
    // to be held by overdue descriptors, which may never return them.
    bool acquire() {
        for (unsigned spins = 0;; ++spins) {
            if (try_acquire()) return true;
            if ((spins & 1023) == 1023) {
                reap();
                if (wedged()) return false;
            }
            spin_pause();
        }
    }
    void release() {
        if (info_.dedicated) inflight_.fetch_sub(1);
    }

    // Takes over a slot whose descriptor timed out: the device may still run it
    // and write the completion records in `memory`, so `memory` is kept, and the
    // slot held, until `record` (the one written last) is written.
    void park(std::shared_ptr<void> memory, const CompletionRecord* record) {
        std::lock_guard<std::mutex> lock(overdue_mutex_);
        overdue_.push_back({std::move(memory), record});
        overdue_count_.fetch_add(1);
    }
    // Frees the overdue descriptors the device has completed since, and their slots.
    void reap() {
        if (overdue_count_.load(std::memory_order_relaxed) == 0) return;
        std::lock_guard<std::mutex> lock(overdue_mutex_);
        const auto completed = std::stable_partition(overdue_.begin(), overdue_.end(), [](const Overdue& o) {
            return load_status(o.record) == kStatusNone;
        });
        const size_t n = size_t(overdue_.end() - completed);
        overdue_.erase(completed, overdue_.end());
        overdue_count_.fetch_sub(n);
        for (size_t i = 0; i < n; ++i) release();
    }
    size_t overdue() const { return overdue_count_.load(); }
    // Every slot of a dedicated queue is held by an overdue descriptor.
    bool wedged() const { return info_.dedicated && int(overdue_count_.load()) >= entries(); }

    Status submit(const HwDesc* desc) {
        store_fence();  // descriptor, lists and zeroed records visible to the device first
        if (device_) {
            device_(desc);
            return Status::ok();
        }
        if (info_.dedicated) {
            submit_movdir64b(portal_, desc);
            return Status::ok();
        }
        const auto deadline = std::chrono::steady_clock::now() + kSubmitTimeout;
        for (unsigned tries = 0;; ++tries) {
            if (submit_enqcmd(portal_, desc)) return Status::ok();
            spin_pause();
            if ((tries & 1023) == 1023 && std::chrono::steady_clock::now() > deadline)
                return make_status(Code::kBackendError, "DSA shared work queue " + info_.name + " stayed full for 5 s");
        }
    }

private:
    struct Overdue {
        std::shared_ptr<void> memory;
        const CompletionRecord* record;
    };
    int entries() const { return std::max<int>(1, int(info_.size)); }

    WorkQueueInfo info_;
    int fd_;
    void* portal_;
    std::mutex overdue_mutex_;
    std::vector<Overdue> overdue_;  // destroyed after device_ (an emulator's late thread)
    std::atomic<size_t> overdue_count_{0};
    std::function<void(const HwDesc*)> device_;
    std::atomic<int> inflight_{0};
};

// A taken slot of a queue, returned when destroyed, unless park() handed it
// to the queue with a descriptor that timed out.
class Slot {
public:
    Slot() = default;
    explicit Slot(Queue* q) : q_(q) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&& other) noexcept {
        std::swap(q_, other.q_);
        return *this;
    }
    ~Slot() {
        if (q_) q_->release();
    }
    void park(std::shared_ptr<void> memory, const CompletionRecord* record) {
        q_->park(std::move(memory), record);
        q_ = nullptr;
    }

private:
    Queue* q_ = nullptr;
};

namespace {

struct EngineHolder {
    std::once_flag once;
    Discovery discovery;
    std::unique_ptr<Engine> engine;
};
EngineHolder& holder() {
    static EngineHolder h;
    return h;
}

// One MEMMOVE with its record (64-byte aligned together).
struct alignas(64) Single {
    HwDesc desc;
    CompletionRecord comp;
};

// A batch: the list of MEMMOVEs, their records, the batch descriptor and its record.
struct BatchJob {
    std::vector<HwDesc> descs;
    std::vector<CompletionRecord> comps;
    Single batch;
    std::vector<copy::Segment> segs;
    Queue* queue = nullptr;
    Slot slot;  // of queue: kept while the batch and its fix-ups run
};

}  // namespace

Engine::Engine(Key, std::vector<std::unique_ptr<Queue>> queues, std::chrono::milliseconds poll_timeout)
    : queues_(std::move(queues)), poll_timeout_(poll_timeout) {
    max_transfer_ = UINT64_MAX;
    max_batch_ = UINT32_MAX;
    for (const auto& q : queues_) {
        max_transfer_ = std::min<uint64_t>(max_transfer_, q->info().max_transfer ? q->info().max_transfer : (2u << 20));
        max_batch_ = std::min<uint32_t>(max_batch_, q->info().max_batch ? q->info().max_batch : 1);
    }
    max_transfer_ = std::min<uint64_t>(max_transfer_, uint64_t(1) << 31);
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::make_for_test(std::vector<std::unique_ptr<Queue>> queues,
                                              std::chrono::milliseconds poll_timeout) {
    return std::make_unique<Engine>(Key{}, std::move(queues), poll_timeout);
}

size_t Engine::overdue() {
    size_t n = 0;
    for (auto& q : queues_) {
        q->reap();
        n += q->overdue();
    }
    return n;
}

size_t Engine::wedged_queues() {
    size_t n = 0;
    for (auto& q : queues_) {
        q->reap();
        n += q->wedged();
    }
    return n;
}

bool Engine::poll(const CompletionRecord* c) {
    const auto deadline = std::chrono::steady_clock::now() + poll_timeout_;
    for (unsigned spins = 0;; ++spins) {
        if (load_status(c) != kStatusNone) return true;
        spin_pause();
        if ((spins & 4095) == 4095 && std::chrono::steady_clock::now() > deadline) {
            timeouts_.fetch_add(1, std::memory_order_relaxed);
            return false;
        }
    }
}

const Discovery& Engine::last_discovery() {
    instance();
    return holder().discovery;
}

Engine* Engine::instance() {
    EngineHolder& h = holder();
    std::call_once(h.once, [&h] {
        h.discovery = discover();
        std::vector<std::unique_ptr<Queue>> queues;
        std::string errors;
        for (const WorkQueueInfo& info : h.discovery.queues) {
            std::unique_ptr<Queue> q;
            Status st = Queue::open(info, &q);
            if (st.is_ok())
                queues.push_back(std::move(q));
            else
                errors += (errors.empty() ? "" : "; ") + st.message;
        }
        if (queues.empty()) {
            if (h.discovery.reason.empty()) h.discovery.reason = errors.empty() ? "no DSA work queue" : errors;
            return;
        }
        h.engine = std::make_unique<Engine>(Key{}, std::move(queues));
        h.engine->measure_break_even();
    });
    return h.engine.get();
}

// MEMMOVE flags: completion record requested; block on fault where the queue
// allows it (the device waits for the OS instead of returning a partial copy).
static uint32_t memmove_flags(const Queue& q) {
    return kFlagCompletionAddrValid | kFlagRequestCompletion | (q.info().block_on_fault ? kFlagBlockOnFault : 0);
}

Queue* Engine::usable_queue() {
    // One ticket, then every queue from it on: other threads' tickets in between must not
    // make this one see a wedged queue twice and miss a free one.
    const size_t first = next_.fetch_add(1, std::memory_order_relaxed);
    for (size_t tried = 0; tried < queues_.size(); ++tried) {
        Queue& q = *queues_[(first + tried) % queues_.size()];
        q.reap();
        if (!q.wedged()) return &q;
    }
    return nullptr;
}

Status Engine::run_one(Slot& slot, Queue& q, uint8_t* dst, const uint8_t* src, size_t n) {
    auto job = std::make_shared<Single>();
    size_t done = 0;
    int faults = 0;
    while (done < n) {
        const size_t len = std::min<uint64_t>(n - done, max_transfer_);
        make_memmove(&job->desc, reinterpret_cast<uint64_t>(src + done), reinterpret_cast<uint64_t>(dst + done),
                     uint32_t(len), reinterpret_cast<uint64_t>(&job->comp),
                     memmove_flags(q));
        reset(&job->comp);
        KVCORE_RETURN_IF_ERROR(q.submit(&job->desc));
        if (!poll(&job->comp)) {
            slot.park(job, &job->comp);
            return make_status(Code::kDeviceTimeout, "DSA memmove on " + q.info().name + " did not complete in " +
                                                        std::to_string(poll_timeout_.count()) + " ms");
        }
        const uint8_t status = load_status(&job->comp);
        if ((status & kStatusMask) == kStatusSuccess) {
            done += len;
            continue;
        }
        if ((status & kStatusMask) == kStatusPageFaultNoBof && faults < kMaxFaultRetries) {
            ++faults;
            page_faults_.fetch_add(1, std::memory_order_relaxed);
            touch(job->comp.fault_addr, status & kStatusWriteFault);
            done += std::min<size_t>(job->comp.bytes_completed, len);
            continue;
        }
        if ((status & kStatusMask) == kStatusPageFaultNoBof) {  // keeps faulting: finish on the CPU
            page_faults_.fetch_add(1, std::memory_order_relaxed);
            done += std::min<size_t>(job->comp.bytes_completed, len);
            copy::copy_bytes(dst + done, src + done, n - done, false);
            return Status::ok();
        }
        return make_status(Code::kBackendError, std::string("DSA memmove failed on ") + q.info().name + ": status 0x" +
                                                    std::to_string(status & kStatusMask) + " (" + status_name(status) + ")");
    }
    return Status::ok();
}

Status Engine::copy(uint8_t* dst, const uint8_t* src, size_t n) {
    const copy::Segment seg{dst, src, n};
    return copy_many(&seg, 1);
}

Status Engine::copy_many(const copy::Segment* segs, size_t count) {
    std::vector<copy::Segment> chunks;
    for (size_t i = 0; i < count; ++i) {
        const copy::Segment& s = segs[i];
        if (s.size && (s.dst < s.src + s.size && s.src < s.dst + s.size))
            return invalid("DSA copies cannot overlap their source");
        for (size_t off = 0; off < s.size; off += max_transfer_)
            chunks.push_back({s.dst + off, s.src + off, std::min<size_t>(max_transfer_, s.size - off)});
    }
    const size_t batch = std::max<size_t>(1, max_batch_);
    std::deque<std::shared_ptr<BatchJob>> inflight;
    size_t next = 0;
    Status result;

    auto finish = [&](BatchJob& job) -> Status {
        const bool ok = poll(&job.batch.comp);
        if (!ok)
            return make_status(Code::kDeviceTimeout, "DSA batch on " + job.queue->info().name + " did not complete in " +
                                                        std::to_string(poll_timeout_.count()) + " ms");
        if ((load_status(&job.batch.comp) & kStatusMask) == kStatusSuccess) return Status::ok();
        // Some descriptors failed or never ran: finish each one that did not succeed.
        for (size_t k = 0; k < job.segs.size(); ++k) {
            const uint8_t st = load_status(&job.comps[k]) & kStatusMask;
            if (st == kStatusSuccess) continue;
            size_t skip = 0;
            if (st == kStatusPageFaultNoBof) {
                page_faults_.fetch_add(1, std::memory_order_relaxed);
                touch(job.comps[k].fault_addr, load_status(&job.comps[k]) & kStatusWriteFault);
                skip = std::min<size_t>(job.comps[k].bytes_completed, job.segs[k].size);
            } else if (st != kStatusNone) {
                return make_status(Code::kBackendError, std::string("DSA memmove in a batch failed: ") + status_name(st));
            }
            const copy::Segment& s = job.segs[k];
            KVCORE_RETURN_IF_ERROR(run_one(job.slot, *job.queue, s.dst + skip, s.src + skip, s.size - skip));
        }
        return Status::ok();
    };
    auto finish_oldest = [&] {
        std::shared_ptr<BatchJob> job = std::move(inflight.front());
        inflight.pop_front();
        Status st = finish(*job);
        if (!st.is_ok()) {
            if (load_status(&job->batch.comp) == kStatusNone)  // the device may still write to it
                job->slot.park(job, &job->batch.comp);
            if (result.is_ok()) result = st;
        }
    };

    while (next < chunks.size() && result.is_ok()) {
        if (inflight.size() == kBatchWindow) {
            finish_oldest();
            continue;
        }
        Queue* usable = usable_queue();
        if (usable == nullptr) {  // every slot is held by a descriptor the device never completed
            cpu_fallbacks_.fetch_add(1, std::memory_order_relaxed);
            for (; next < chunks.size(); ++next) copy::copy_bytes(chunks[next].dst, chunks[next].src, chunks[next].size, false);
            break;
        }
        Queue& q = *usable;
        // A thread that holds slots never waits for one: the slots it would wait for
        // can be its own (a queue of fewer entries than kBatchWindow) or those of a
        // thread that waits too. Finishing its oldest batch returns one.
        if (!q.try_acquire()) {
            if (!inflight.empty()) {
                finish_oldest();
                continue;
            }
            if (!q.acquire()) continue;  // it became wedged meanwhile: pick again
        }
        Slot slot(&q);
        const size_t k = std::min(batch, chunks.size() - next);
        if (k < 2) {  // a batch holds at least two descriptors
            result = run_one(slot, q, chunks[next].dst, chunks[next].src, chunks[next].size);
            ++next;
            continue;
        }
        auto job = std::make_shared<BatchJob>();
        job->queue = &q;
        job->slot = std::move(slot);
        job->descs.resize(k);
        job->comps.resize(k);
        job->segs.assign(chunks.begin() + next, chunks.begin() + next + k);
        for (size_t j = 0; j < k; ++j) {
            reset(&job->comps[j]);
            make_memmove(&job->descs[j], reinterpret_cast<uint64_t>(job->segs[j].src),
                         reinterpret_cast<uint64_t>(job->segs[j].dst), uint32_t(job->segs[j].size),
                         reinterpret_cast<uint64_t>(&job->comps[j]), memmove_flags(q));
        }
        reset(&job->batch.comp);
        make_batch(&job->batch.desc, reinterpret_cast<uint64_t>(job->descs.data()), uint32_t(k),
                   reinterpret_cast<uint64_t>(&job->batch.comp), kFlagCompletionAddrValid | kFlagRequestCompletion);
        result = q.submit(&job->batch.desc);
        if (!result.is_ok()) break;
        inflight.push_back(std::move(job));
        next += k;
    }
    while (!inflight.empty()) finish_oldest();  // after an error too: the device may still be writing
    return result;
}

void Engine::measure_break_even() {
    constexpr size_t kMax = size_t(1) << 20;
    std::vector<uint8_t> a(kMax, 1), b(kMax, 2);
    Queue& q = *queues_[0];
    if (!q.acquire()) return;  // keep the default
    Slot slot(&q);
    size_t found = 0;
    for (size_t size = 4096; size <= kMax && !found; size *= 2) {
        double cpu = 1e30, dev = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
            auto t0 = std::chrono::steady_clock::now();
            std::memcpy(b.data(), a.data(), size);
            auto t1 = std::chrono::steady_clock::now();
            if (!run_one(slot, q, b.data(), a.data(), size).is_ok()) return;  // keep the default
            auto t2 = std::chrono::steady_clock::now();
            cpu = std::min(cpu, std::chrono::duration<double>(t1 - t0).count());
            dev = std::min(dev, std::chrono::duration<double>(t2 - t1).count());
        }
        if (dev <= cpu) found = size;
    }
    break_even_ = found ? found : kMax * 2;
}

// Executes descriptors like the device would (synchronously, or later for the
// ones stall_first holds), for tests.
struct Emulator {
    using Clock = std::chrono::steady_clock;

    EmulationOptions options;
    EmulationStats stats;
    uint64_t counter = 0;    // MEMMOVEs seen (fault_every)
    uint64_t submitted = 0;  // descriptors submitted (stall_first)
    std::mutex mutex;        // the late thread runs descriptors too
    std::condition_variable wake;
    std::deque<std::pair<Clock::time_point, const HwDesc*>> held;  // to run late
    std::thread late;
    bool stopping = false;

    ~Emulator() { stop(); }

    // Drops what is still held (as a drained queue would) and ends the late thread.
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stopping = true;
            held.clear();
        }
        wake.notify_all();
        if (late.joinable()) late.join();
    }

    void submit(const HwDesc* d) {
        std::lock_guard<std::mutex> lock(mutex);
        if (submitted++ < options.stall_first) {
            ++stats.stalled;
            if (options.stall_ms == 0) {  // until complete_held(), if ever
                held.emplace_back(Clock::time_point::max(), d);
                return;
            }
            held.emplace_back(Clock::now() + std::chrono::milliseconds(options.stall_ms), d);
            if (!late.joinable()) late = std::thread([this] { run_late(); });
            wake.notify_all();
            return;
        }
        execute(d);
    }

    // Runs every held descriptor now.
    void complete_held() {
        std::lock_guard<std::mutex> lock(mutex);
        for (const auto& h : held) {
            execute(h.second);
            ++stats.late_completions;
        }
        held.clear();
    }

    void run_late() {
        std::unique_lock<std::mutex> lock(mutex);
        while (!stopping) {
            if (held.empty()) {
                wake.wait(lock);
                continue;
            }
            if (Clock::now() < held.front().first) {
                wake.wait_until(lock, held.front().first);
                continue;
            }
            const HwDesc* d = held.front().second;
            held.pop_front();
            execute(d);
            ++stats.late_completions;
        }
    }

    static void complete(CompletionRecord* c, uint8_t status, uint32_t bytes, uint64_t fault) {
        c->bytes_completed = bytes;
        c->fault_addr = fault;
        __atomic_store_n(&c->status, status, __ATOMIC_RELEASE);
    }

    // Returns true when the descriptor completed successfully.
    bool memmove_desc(const HwDesc* d) {
        auto* comp = reinterpret_cast<CompletionRecord*>(d->completion_addr);
        if (reinterpret_cast<uintptr_t>(comp) % 32) {
            ++stats.errors;
            return false;  // the device cannot even report
        }
        const uint32_t flags = flags_of(*d);
        if (!(flags & kFlagCompletionAddrValid) || !(flags & kFlagRequestCompletion)) {
            ++stats.errors;
            return false;
        }
        if (opcode_of(*d) != kOpMemmove) {
            ++stats.errors;
            complete(comp, 0x10, 0, 0);
            return false;
        }
        if (d->xfer_size == 0 || d->xfer_size > options.max_transfer) {
            ++stats.errors;
            complete(comp, 0x13, 0, 0);
            return false;
        }
        ++stats.descriptors;
        auto* dst = reinterpret_cast<uint8_t*>(d->dst_addr);
        const auto* src = reinterpret_cast<const uint8_t*>(d->src_addr);
        const uint32_t n = d->xfer_size;
        ++counter;
        if (options.fault_every && counter % options.fault_every == 0 && n > options.fault_after) {
            std::memcpy(dst, src, options.fault_after);
            ++stats.faults_injected;
            complete(comp, kStatusPageFaultNoBof | kStatusWriteFault, options.fault_after,
                     reinterpret_cast<uint64_t>(dst + options.fault_after));
            return false;
        }
        std::memcpy(dst, src, n);
        complete(comp, kStatusSuccess, n, 0);
        return true;
    }

    void execute(const HwDesc* d) {
        if (opcode_of(*d) != kOpBatch) {
            memmove_desc(d);
            return;
        }
        auto* comp = reinterpret_cast<CompletionRecord*>(d->completion_addr);
        const auto* list = reinterpret_cast<const HwDesc*>(d->src_addr);
        ++stats.batches;
        if (reinterpret_cast<uintptr_t>(list) % 64) {
            ++stats.errors;
            complete(comp, 0x18, 0, 0);
            return;
        }
        if (d->xfer_size < 2 || d->xfer_size > options.max_batch) {
            ++stats.errors;
            complete(comp, 0x14, 0, 0);
            return;
        }
        uint32_t ok = 0;
        for (uint32_t i = 0; i < d->xfer_size; ++i) ok += memmove_desc(&list[i]);
        complete(comp, ok == d->xfer_size ? kStatusSuccess : kStatusBatchFail, ok, 0);
    }
};

EmulatedEngine::EmulatedEngine(const EmulationOptions& options) : emulator_(std::make_shared<Emulator>()) {
    emulator_->options = options;
    WorkQueueInfo info;
    info.name = "emulated";
    info.dedicated = options.dedicated;
    info.size = options.wq_size;
    info.max_batch = options.max_batch;
    info.max_transfer = options.max_transfer;
    std::vector<std::unique_ptr<Queue>> queues;
    queues.push_back(std::make_unique<Queue>(info, [emulator = emulator_](const HwDesc* d) { emulator->submit(d); }));
    engine_ = Engine::make_for_test(std::move(queues), std::chrono::milliseconds(options.timeout_ms));
}

EmulatedEngine::~EmulatedEngine() { emulator_->stop(); }

void EmulatedEngine::complete_held() { emulator_->complete_held(); }

EmulationStats EmulatedEngine::stats() const {
    EmulationStats s;
    {
        std::lock_guard<std::mutex> lock(emulator_->mutex);
        s = emulator_->stats;
    }
    s.faults_handled = engine_->page_faults();
    return s;
}

Status emulated_copy_many(const copy::Segment* segs, size_t count, const EmulationOptions& options,
                          EmulationStats* stats) {
    EmulatedEngine emulated(options);
    Status st = emulated.copy_many(segs, count);
    *stats = emulated.stats();
    return st;
}

}  // namespace kvcore::dsa
