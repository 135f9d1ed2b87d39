#include "frame/batch_progress.h"

#include <chrono>

namespace kvcore::frame {

BatchProgress::BatchProgress(size_t frames) : settled_(frames, 0), status_(frames) {}

void BatchProgress::settle(size_t frame, const Status& status) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (frame >= settled_.size() || settled_[frame]) return;
        settled_[frame] = 1;
        status_[frame] = status;
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
    }
    cv_.notify_all();
}

bool BatchProgress::wait(size_t frame, int64_t timeout_ms) const {
    if (frame >= settled_.size()) return true;  // status() reports it
    std::unique_lock<std::mutex> lock(mutex_);
    const auto ready = [&] { return settled_[frame] != 0; };
    if (timeout_ms < 0) {
        cv_.wait(lock, ready);
        return true;
    }
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
}

Status BatchProgress::status(size_t frame) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (frame >= settled_.size()) return invalid("frame number out of range");
    if (!settled_[frame]) return invalid("frame not settled yet");
    return status_[frame];
}

}  // namespace kvcore::frame
