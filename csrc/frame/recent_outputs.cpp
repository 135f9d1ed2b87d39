#include "frame/recent_outputs.h"

#include <pthread.h>

#include "cpu/cpu_features.h"

namespace kvcore::frame {

bool RecentOutputs::cold(uintptr_t lo, uintptr_t hi) const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t traffic = 0;  // bytes moved by the calls after the one looked at
    for (size_t k = 1; k <= count_; ++k) {
        const Call& c = calls_[(next_ + kCalls - k) % kCalls];
        if (c.lo < hi && lo < c.hi) return false;  // written less than a window's traffic ago
        traffic += c.bytes;
        if (traffic >= window_) return true;
    }
    return false;  // too little history to tell
}

void RecentOutputs::record(uintptr_t lo, uintptr_t hi, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_[next_] = Call{lo, hi, bytes};
    next_ = (next_ + 1) % kCalls;
    if (count_ < kCalls) ++count_;
}

RecentOutputs& recent_decode_outputs() {
    static RecentOutputs recent(cpu::streaming_store_bytes());
    static const bool fork_handlers = [] {
        const auto unlock = [] { recent_decode_outputs().after_fork(); };
        pthread_atfork([] { recent_decode_outputs().before_fork(); }, unlock, unlock);
        return true;
    }();
    (void)fork_handlers;
    return recent;
}

}  // namespace kvcore::frame
