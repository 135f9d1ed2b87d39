// Asynchronous operations of the data mover (copies, gather/scatter, codec).
//
// An operation is a task queued on the mover's dispatch threads; the task
// itself spreads its work over the shared thread pool (default_pool()), so a
// copy and a compression that are both in flight overlap. Every operation
// returns a Completion: done / wait(timeout) / status, an optional byte
// payload (compressed frames), and a notification token that the Python layer
// collects with poll_notifications() to wake asyncio and done-callbacks
// without native code ever calling into Python.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace kvcore::mover {

struct QueuedTask;

class Completion {
public:
    Completion() = default;
    // help: the queued task a waiter may run itself (run_here); null for none.
    explicit Completion(std::shared_ptr<QueuedTask> help) : help_(std::move(help)) {}

    void finish(Status status);
    // Runs the operation on the calling thread when it was submitted to be helped
    // (submit's helpable) and no dispatch thread has taken it yet; true when it did.
    // A caller about to wait for it saves the dispatch thread's wake-up (tens of
    // microseconds on a busy host: more than a small copy takes).
    bool run_here();
    bool done() const;
    // Waits up to timeout_ms (< 0: no limit); true if the operation finished.
    bool wait(int64_t timeout_ms) const;
    Status status() const;
    // Queues `token` on the notification queue when the operation finishes
    // (at once if it already has). One token per completion.
    void notify_with(uint64_t token);
    // Result bytes (written by the task before finish()).
    std::vector<uint8_t>& payload() { return payload_; }
    // A size the task reports (bytes of a frame it wrote); read after done().
    void set_result_size(uint64_t n) { result_size_ = n; }
    uint64_t result_size() const {
        if (done()) return result_size_;  // no longer written
        std::lock_guard<std::mutex> lock(mutex_);
        return result_size_;
    }

private:
    mutable std::mutex mutex_;
    mutable std::condition_variable cv_;
    // Set (under mutex_) after status_, never cleared: once it reads true, done(),
    // wait() and status() take no lock, so a forked child can read an operation that
    // finished before fork() even if a parent thread held mutex_ at that moment.
    std::atomic<bool> done_{false};
    bool has_token_ = false;
    uint64_t token_ = 0;
    Status status_;
    std::vector<uint8_t> payload_;
    uint64_t result_size_ = 0;  // written by the task before finish() takes the mutex
    const std::shared_ptr<QueuedTask> help_;  // a helpable task's (see submit)
};

using Task = std::function<Status(Completion&)>;

// Queues a task on the dispatch threads. helpable: a waiter may run it itself
// (Completion::run_here): only for short work with no order to keep against
// other operations (a host copy of a few MiB on the CPU).
std::shared_ptr<Completion> submit(Task task, bool helpable = false);

// Blocks up to timeout_ms for finished tokens; returns them (maybe none).
std::vector<uint64_t> poll_notifications(int64_t timeout_ms);
// Wakes every poll_notifications() caller (used at shutdown).
void wake_notifications();

// Number of dispatch threads.
unsigned dispatch_threads();

}  // namespace kvcore::mover
