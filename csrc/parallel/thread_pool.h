// A fixed-size pool of native worker threads.
//
// `parallel_for` splits independent work items (codec blocks, copy slices) over
// the workers and the calling thread; the caller always takes part, so a nested
// call from inside a worker can never deadlock. `submit` queues a task for
// asynchronous work (async copies, compress_async).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
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

    unsigned workers() const { return static_cast<unsigned>(threads_.size()); }

    // Calls fn(i) for every i in [0, n) using at most `max_threads` threads
    // (the caller counts as one; 0 = all workers + caller). Returns when all are
    // done; if any fn(i) threw, the first exception is then rethrown here (the
    // other items still ran).
    void parallel_for(size_t n, unsigned max_threads, const std::function<void(size_t)>& fn);

    // Queues a task to run on a worker thread.
    void submit(std::function<void()> task);

private:
    void worker_loop();

    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

// The process-wide pool, created on first use with one worker per hardware
// thread minus one (the caller of parallel_for is the remaining thread).
ThreadPool& default_pool();
// Number of hardware threads (at least 1), counted on the first call.
unsigned hardware_threads();

}  // namespace kvcore
