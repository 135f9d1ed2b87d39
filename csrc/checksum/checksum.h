// Checksums of original bytes (frames, SSD files): XXH3-64 from libxxhash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvcore {

uint64_t checksum64(const void* data, size_t size, uint64_t seed = 0);

// The same checksum over data that arrives in pieces (so each piece can be
// hashed while it is still in cache). One per thread; not copyable.
class StreamingChecksum64 {
public:
    StreamingChecksum64();
    ~StreamingChecksum64();
    StreamingChecksum64(const StreamingChecksum64&) = delete;
    StreamingChecksum64& operator=(const StreamingChecksum64&) = delete;

    void reset(uint64_t seed);
    void update(const void* data, size_t size);
    uint64_t digest() const;

private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace kvcore
