#include "frame/batch_progress.h"

#include <chrono>

namespace kvcore::frame {

BatchProgress::BatchProgress(size_t frames) : settled_(frames, 0), status_(frames), unsettled_(frames) {}

void BatchProgress::settle(size_t frame, const Status& status) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (frame >= settled_.size() || settled_[frame]) return;
        settled_[frame] = 1;
        status_[frame] = status;
        --unsettled_;
    }
    cv_.notify_all();
}

void BatchProgress::settle_rest(const Status& status) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i = 0; i < settled_.size(); ++i) {
            if (settled_[i]) continue;
            settled_[i] = 1;
            status_[i] = status;
        }
        unsettled_ = 0;
    }
    cv_.notify_all();
}

template <class Ready>
bool BatchProgress::wait_for(int64_t timeout_ms, Ready ready) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout_ms < 0) {
        cv_.wait(lock, ready);
        return true;
    }
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
}

bool BatchProgress::wait(size_t frame, int64_t timeout_ms) const {
    if (frame >= settled_.size()) return true;  // status() reports it
    return wait_for(timeout_ms, [&] { return settled_[frame] != 0; });
}

bool BatchProgress::wait_all(int64_t timeout_ms) const {
    return wait_for(timeout_ms, [&] { return unsettled_ == 0; });
}

Status BatchProgress::status(size_t frame) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (frame >= settled_.size()) return invalid("frame number out of range");
    if (!settled_[frame]) return invalid("frame not settled yet");
    return status_[frame];
}

}  // namespace kvcore::frame
