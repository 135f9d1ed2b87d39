#include "copy/async_ops.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <string>

#include "parallel/thread_pool.h"

namespace kvcore::mover {
namespace {

struct Notifications {
    std::mutex mutex;
    // Replaced in a forked child (renew_after_fork): the parent's polling thread
    // still counted as its waiter there, and the child's exit blocked in its destructor.
    std::unique_ptr<std::condition_variable> cv = std::make_unique<std::condition_variable>();
    std::deque<uint64_t> tokens;
    uint64_t wakeups = 0;
};

Notifications& notifications() {
    static Notifications n;
    // The lock is held across fork(); the child's queue and waiters start empty.
    static const bool fork_handlers = [] {
        pthread_atfork([] { notifications().mutex.lock(); }, [] { notifications().mutex.unlock(); },
                       [] {
                           Notifications& c = notifications();
                           renew_after_fork(c.cv);
                           c.tokens.clear();
                           c.mutex.unlock();
                       });
        return true;
    }();
    (void)fork_handlers;
    return n;
}

void push_token(uint64_t token) {
    Notifications& n = notifications();
    {
        std::lock_guard<std::mutex> lock(n.mutex);
        n.tokens.push_back(token);
    }
    n.cv->notify_all();
}

ThreadPool& dispatcher() {
    // Dispatch threads only coordinate: the copy/codec work inside a task runs
    // on default_pool() with the dispatch thread taking part. The pool and the
    // notification queue are constructed first, so they are destroyed after
    // the dispatcher has drained its queue and joined at exit.
    default_pool();
    notifications();
    static ThreadPool pool(dispatch_threads());
    return pool;
}

}  // namespace

unsigned dispatch_threads() { return std::clamp(hardware_threads() / 4, 2u, 4u); }

void Completion::finish(Status status) {
    bool notify = false;
    uint64_t token = 0;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        status_ = std::move(status);
        done_.store(true, std::memory_order_release);
        notify = has_token_;
        token = token_;
    }
    cv_.notify_all();
    if (notify) push_token(token);
}

bool Completion::done() const { return done_.load(std::memory_order_acquire); }

bool Completion::wait(int64_t timeout_ms) const {
    if (done()) return true;
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout_ms < 0) {
        cv_.wait(lock, [this] { return done_.load(std::memory_order_relaxed); });
        return true;
    }
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return done_.load(std::memory_order_relaxed); });
}

Status Completion::status() const {
    if (done()) return status_;  // no longer written
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
}

void Completion::notify_with(uint64_t token) {
    bool now = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        has_token_ = true;
        token_ = token;
        now = done_.load(std::memory_order_relaxed);
    }
    if (now) push_token(token);
}

// A queued operation: run once, by a dispatch thread or by a waiter (run_here),
// whichever claims it first.
struct QueuedTask {
    Task task;
    std::atomic<bool> claimed{false};

    void run(Completion& completion) {
        if (claimed.exchange(true, std::memory_order_acq_rel)) return;
        Status st;
        try {
            st = task(completion);
        } catch (const std::bad_alloc&) {
            st = make_status(Code::kOutOfMemory, "out of memory in an asynchronous operation");
        } catch (const std::exception& e) {
            st = make_status(Code::kBackendError, std::string("asynchronous operation failed: ") + e.what());
        }
        task = nullptr;  // what it holds goes now, not when the last reference does
        completion.finish(std::move(st));
    }
};

std::shared_ptr<Completion> submit(Task task, bool helpable) {
    auto queued = std::make_shared<QueuedTask>();
    queued->task = std::move(task);
    auto completion = std::make_shared<Completion>(helpable ? queued : nullptr);
    dispatcher().submit([completion, queued] { queued->run(*completion); });
    return completion;
}

bool Completion::run_here() {
    if (!help_ || done() || help_->claimed.load(std::memory_order_acquire)) return false;
    help_->run(*this);
    return done();
}

std::vector<uint64_t> poll_notifications(int64_t timeout_ms) {
    Notifications& n = notifications();
    std::unique_lock<std::mutex> lock(n.mutex);
    const uint64_t seen = n.wakeups;
    n.cv->wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)),
                  [&] { return !n.tokens.empty() || n.wakeups != seen; });
    std::vector<uint64_t> out(n.tokens.begin(), n.tokens.end());
    n.tokens.clear();
    return out;
}

void wake_notifications() {
    Notifications& n = notifications();
    {
        std::lock_guard<std::mutex> lock(n.mutex);
        ++n.wakeups;
    }
    n.cv->notify_all();
}

}  // namespace kvcore::mover
