#include "parallel/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>

namespace kvcore {

// The pools alive in the process, for the fork() handlers, which are registered
// once. Constructing and destroying a pool takes `mutex`, and so does fork().
struct LivePools {
    std::mutex mutex;
    std::vector<ThreadPool*> pools;

    static LivePools& get() {
        static LivePools live;
        static const bool fork_handlers = [] {
            pthread_atfork(
                [] {
                    LivePools& l = get();
                    l.mutex.lock();
                    for (ThreadPool* p : l.pools) p->before_fork();
                },
                [] {
                    LivePools& l = get();
                    for (ThreadPool* p : l.pools) p->after_fork_in_parent();
                    l.mutex.unlock();
                },
                [] {
                    LivePools& l = get();
                    for (ThreadPool* p : l.pools) p->after_fork_in_child();
                    l.mutex.unlock();
                });
            return true;
        }();
        (void)fork_handlers;
        return live;
    }
};

ThreadPool::ThreadPool(unsigned n_workers) : n_workers_(n_workers) {
    LivePools& live = LivePools::get();
    std::lock_guard<std::mutex> live_lock(live.mutex);
    live.pools.push_back(this);
    std::lock_guard<std::mutex> lock(mutex_);
    start_workers();
}

void ThreadPool::start_workers() {
    threads_.reserve(n_workers_);
    for (unsigned i = 0; i < n_workers_; ++i) threads_.emplace_back([this] { worker_loop(); });
}

void ThreadPool::before_fork() { mutex_.lock(); }

void ThreadPool::after_fork_in_parent() { mutex_.unlock(); }

void ThreadPool::after_fork_in_child() {
    // The parent's workers do not exist here: their handles are left unjoined (a
    // joinable std::thread may not be destroyed) and the tasks queued for them are
    // left unrun and undestroyed (they belong to the parent, and may hold objects
    // that must not be released here). Both are leaked on purpose, once per fork.
    std::make_unique<std::vector<std::thread>>(std::move(threads_)).release();
    std::make_unique<std::deque<std::function<void()>>>(std::move(queue_)).release();
    renew_after_fork(cv_);
    threads_.clear();
    queue_.clear();
    restart_ = true;
    mutex_.unlock();  // locked by before_fork in the thread that forked, which is this one
}

void renew_after_fork(std::unique_ptr<std::condition_variable>& cv) {
    cv.release();
    cv = std::make_unique<std::condition_variable>();
}

ThreadPool::~ThreadPool() {
    {
        LivePools& live = LivePools::get();
        std::lock_guard<std::mutex> live_lock(live.mutex);
        live.pools.erase(std::find(live.pools.begin(), live.pools.end(), this));
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    cv_->notify_all();
    for (auto& t : threads_) t.join();
}

void ThreadPool::worker_loop() {
    for (;;) {
        std::function<void()> task;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_->wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, and nothing left to run
            task = std::move(queue_.front());
            queue_.pop_front();
        }
        task();
    }
}

void ThreadPool::submit(std::function<void()> task) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (restart_) {
            restart_ = false;
            start_workers();
        }
        queue_.push_back(std::move(task));
    }
    cv_->notify_one();
}

namespace {

// Work shared by the caller and the helpers of one parallel_for.
struct ForState {
    explicit ForState(size_t n_, const std::function<void(size_t)>& fn_) : n(n_), fn(fn_) {}
    const size_t n;
    const std::function<void(size_t)>& fn;  // owned by the caller, who outlives every use
    std::atomic<size_t> next{0};
    std::mutex mutex;
    std::condition_variable cv;
    size_t finished = 0;
    std::exception_ptr error;  // the first item that threw (std::bad_alloc, say), rethrown by the caller

    // Runs items until none are left. An item that throws counts as run: a helper
    // thread must not take the process down, nor leave the caller waiting.
    void drain() {
        size_t ran = 0;
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n; ++ran) {
            try {
                fn(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex);
                if (!error) error = std::current_exception();
            }
        }
        if (ran == 0) return;
        std::lock_guard<std::mutex> lock(mutex);
        finished += ran;
        if (finished == n) cv.notify_all();
    }
};

}  // namespace

void ThreadPool::parallel_for(size_t n, unsigned max_threads, const std::function<void(size_t)>& fn) {
    if (n == 0) return;
    unsigned helpers = max_threads == 0 ? workers() : max_threads - 1;
    if (helpers > workers()) helpers = workers();
    if (helpers > n - 1) helpers = static_cast<unsigned>(n - 1);
    auto state = std::make_shared<ForState>(n, fn);
    for (unsigned h = 0; h < helpers; ++h) submit([state] { state->drain(); });
    state->drain();  // with no helpers, the whole loop, here
    std::unique_lock<std::mutex> lock(state->mutex);
    state->cv.wait(lock, [&] { return state->finished == n; });
    // Helpers that start after this point find no items left and never touch fn.
    if (state->error) std::rethrow_exception(state->error);
}

unsigned hardware_threads() {
    // Counted once: glibc reads /sys/devices/system/cpu/online on every call (4-5 us,
    // which doubled the time of a default-threads decompress of a 12 KiB frame).
    static const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    return n;
}

ThreadPool& default_pool() {
    static ThreadPool pool(hardware_threads() > 1 ? hardware_threads() - 1 : 1);
    return pool;
}

}  // namespace kvcore
