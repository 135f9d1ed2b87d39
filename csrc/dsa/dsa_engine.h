// Intel DSA (Data Streaming Accelerator) copy engine through the idxd driver.
//
// libaccel-config is loaded at run time (dlopen "libaccel-config.so.1"), so it
// is optional: without it, or without an enabled user-mode DSA work queue, or
// on a CPU without MOVDIR64B/ENQCMD, discovery reports why and the mover uses
// the CPU engine. A usable queue's portal (/dev/dsa/wqD.Q) is mapped and
// MEMMOVE descriptors are written to it with MOVDIR64B (dedicated queue, with
// software flow control) or ENQCMD (shared queue, retried while the queue is
// full); many blocks go out as BATCH descriptors. Completion records are
// polled; a copy that stops on a page fault has the faulting page touched and
// its remainder resubmitted. A descriptor that times out keeps its memory and
// its queue entry until the device writes its completion record (it may still
// run); when every entry of every queue is held that way, copies run on the
// CPU. Copies below a break-even size measured when the engine opens stay on
// the CPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "copy/copy_engine.h"

namespace kvcore::dsa {

struct WorkQueueInfo {
    std::string device;       // "dsa0"
    std::string name;         // "wq0.0"
    std::string path;         // "/dev/dsa/wq0.0"
    bool dedicated = false;
    int numa_node = -1;
    uint32_t size = 0;        // entries
    uint32_t max_batch = 0;
    uint64_t max_transfer = 0;
    bool block_on_fault = false;
};

struct Discovery {
    bool library_loaded = false;
    bool cpu_movdir64b = false;
    bool cpu_enqcmd = false;
    std::vector<WorkQueueInfo> queues;  // enabled user-mode DSA queues this CPU can submit to
    std::string reason;                 // why nothing is usable (empty when a queue is)
};

// Enumerates enabled user-mode DSA work queues through libaccel-config.
// Never fails: problems end up in Discovery::reason.
Discovery discover(const std::string& library = "libaccel-config.so.1");

struct CompletionRecord;
class Queue;
class Slot;

// A software stand-in for a work queue, for tests of the submission,
// batching and page-fault paths on machines without DSA: it executes each
// descriptor when it is submitted, checks what the hardware would (sizes,
// counts, alignments), and can inject partial completions on page faults.
struct EmulationOptions {
    uint32_t max_batch = 32;
    uint64_t max_transfer = uint64_t(1) << 20;
    uint32_t fault_every = 0;   // every n-th MEMMOVE stops early with a page fault (0: never)
    uint32_t fault_after = 0;   // bytes it completes before the fault
    bool dedicated = true;
    uint32_t wq_size = 16;      // entries of a dedicated queue (the engine's flow control)
    uint32_t stall_first = 0;   // the first n descriptors submitted are held, not run at once
    uint32_t stall_ms = 0;      // a held descriptor runs this long after its submission
                                // (0: when EmulatedEngine::complete_held() is called, if ever)
    uint32_t timeout_ms = 5000; // how long the engine polls a completion record
};
struct EmulationStats {
    uint64_t descriptors = 0;   // MEMMOVEs executed (inside batches or alone)
    uint64_t batches = 0;
    uint64_t faults_injected = 0;
    uint64_t faults_handled = 0;  // seen by the engine
    uint64_t errors = 0;          // descriptors the emulator rejected
    uint64_t stalled = 0;         // descriptors held (stall_first)
    uint64_t late_completions = 0;  // held descriptors run later (stall_ms)
};
Status emulated_copy_many(const copy::Segment* segs, size_t count, const EmulationOptions& options,
                          EmulationStats* stats);

class Engine {
public:
    // The process-wide engine, opened on first use; nullptr when DSA is not
    // usable (see last_discovery().reason).
    static Engine* instance();
    static const Discovery& last_discovery();

    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;
    ~Engine();

    size_t break_even() const { return break_even_; }
    size_t queue_count() const { return queues_.size(); }
    uint64_t page_faults() const { return page_faults_.load(); }
    uint64_t timeouts() const { return timeouts_.load(); }
    uint64_t cpu_fallbacks() const { return cpu_fallbacks_.load(); }
    // Descriptors that timed out and that the device has not completed yet
    // (each holds its queue entry and memory); both return the entries of the
    // ones that completed since, first.
    size_t overdue();
    // Dedicated queues whose every entry is held by such a descriptor: copies
    // skip them (and run on the CPU when all queues are).
    size_t wedged_queues();

    Status copy(uint8_t* dst, const uint8_t* src, size_t n);
    Status copy_many(const copy::Segment* segs, size_t count);

    struct Key {
    private:
        friend class Engine;
        Key() = default;
    };
    Engine(Key, std::vector<std::unique_ptr<Queue>> queues,
           std::chrono::milliseconds poll_timeout = std::chrono::seconds(5));
    static std::unique_ptr<Engine> make_for_test(std::vector<std::unique_ptr<Queue>> queues,
                                                 std::chrono::milliseconds poll_timeout);

private:
    // The next queue not wedged by overdue descriptors; nullptr when none is.
    Queue* usable_queue();
    // Spins until the device writes the record; false (and counted) on timeout.
    bool poll(const CompletionRecord* c);
    // MEMMOVEs one after another in `slot`, a slot of q that the caller holds.
    Status run_one(Slot& slot, Queue& q, uint8_t* dst, const uint8_t* src, size_t n);
    void measure_break_even();

    std::vector<std::unique_ptr<Queue>> queues_;
    std::atomic<size_t> next_{0};
    std::atomic<uint64_t> page_faults_{0};
    std::atomic<uint64_t> timeouts_{0};
    std::atomic<uint64_t> cpu_fallbacks_{0};
    std::chrono::milliseconds poll_timeout_;
    size_t break_even_ = 64 << 10;
    uint64_t max_transfer_ = 0;
    uint32_t max_batch_ = 0;
};

struct Emulator;

// An engine on one software-emulated queue that lives across copies, so tests
// can follow what a descriptor that completes late (or never) does to later ones.
class EmulatedEngine {
public:
    explicit EmulatedEngine(const EmulationOptions& options);
    ~EmulatedEngine();  // stops the emulator before the engine frees what it kept
    EmulatedEngine(const EmulatedEngine&) = delete;
    EmulatedEngine& operator=(const EmulatedEngine&) = delete;

    Status copy_many(const copy::Segment* segs, size_t count) { return engine_->copy_many(segs, count); }
    EmulationStats stats() const;
    Engine& engine() { return *engine_; }
    // The device finishes the descriptors it holds now (stall_ms = 0).
    void complete_held();

private:
    std::shared_ptr<Emulator> emulator_;
    std::unique_ptr<Engine> engine_;
};

}  // namespace kvcore::dsa
