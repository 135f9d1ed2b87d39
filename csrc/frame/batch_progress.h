// Which frames of a decompress_many batch have settled, for a caller that
// takes them one by one while later frames still decode (a restore that hands
// each layer to the engine as soon as it is complete). Pool threads settle
// frames; any thread waits for them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace kvcore::frame {

class BatchProgress {
public:
    explicit BatchProgress(size_t frames);

    // Records frame's outcome (decompress_many's on_frame); later calls for the same frame are ignored.
    void settle(size_t frame, const Status& status);
    // Settles every frame not yet settled with status (a batch that stopped before decoding).
    void settle_rest(const Status& status);

    size_t size() const { return settled_.size(); }
    // Waits up to timeout_ms (< 0: no limit) for frame; true once it has settled.
    bool wait(size_t frame, int64_t timeout_ms) const;
    // A settled frame's outcome (kInvalidArgument for one out of range or not yet settled).
    Status status(size_t frame) const;

private:
    mutable std::mutex mutex_;
    mutable std::condition_variable cv_;
    std::vector<uint8_t> settled_;
    std::vector<Status> status_;
};

}  // namespace kvcore::frame
