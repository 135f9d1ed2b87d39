// A fixed-size pool of native worker threads.
//
// `parallel_for` splits independent work items (codec blocks, copy slices) over
// the workers and the calling thread; the caller always takes part, so a nested
// call from inside a worker can never deadlock. `submit` queues a task for
// asynchronous work (async copies, compress_async).
//
// fork(): a child process has only the thread that forked, so a pool's workers
// are gone there. Until 2026-12-06 a task submitted in such a child never ran
// (compress_async in a forked child never completed). Every pool now holds its
// lock across fork() (no worker is then inside it) and, in the child, drops the
// parent's workers and queued tasks and starts new workers on the next submit.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcore {

class ThreadPool {
public:
    explicit ThreadPool(unsigned n_workers);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    unsigned workers() const { return n_workers_; }

    // Calls fn(i) for every i in [0, n) using at most `max_threads` threads
    // (the caller counts as one; 0 = all workers + caller). Returns when all are
    // done; if any fn(i) threw, the first exception is then rethrown here (the
    // other items still ran).
    void parallel_for(size_t n, unsigned max_threads, const std::function<void(size_t)>& fn);

    // Queues a task to run on a worker thread.
    void submit(std::function<void()> task);

private:
    friend struct LivePools;
    // fork() handlers (LivePools calls them for every pool).
    void before_fork();
    void after_fork_in_parent();
    void after_fork_in_child();

    void worker_loop();
    void start_workers();  // with mutex_ held

    const unsigned n_workers_;
    std::mutex mutex_;
    // Replaced in a forked child (renew_after_fork).
    std::unique_ptr<std::condition_variable> cv_ = std::make_unique<std::condition_variable>();
    std::deque<std::function<void()>> queue_;
    bool stopping_ = false;
    bool restart_ = false;  // set in a forked child: workers start on the next submit
    std::vector<std::thread> threads_;
};

// For a forked child: a condition variable that the parent's threads waited on
// still counts them as waiters there, and glibc's notify and destructor can wait
// for them forever. The old one is leaked on purpose (destroying it is that wait)
// and cv is replaced by a new one.
void renew_after_fork(std::unique_ptr<std::condition_variable>& cv);

// The process-wide pool, created on first use with one worker per hardware
// thread minus one (the caller of parallel_for is the remaining thread).
ThreadPool& default_pool();
// Number of hardware threads (at least 1), counted on the first call.
unsigned hardware_threads();

}  // namespace kvcore
