// Thread-sanitizer harness for the mover's asynchronous operations: several
// threads submit copies, gathers and failing tasks at once (each task spreads
// its copy over the shared pool), ask for a notification token before or after
// the operation finishes, and wait with and without timeouts (half of them
// submitted as helpable, and waiters racing the dispatch threads to run those
// themselves, Completion::run_here), while one thread
// collects tokens with poll_notifications and another wakes it now and then.
// Every copy must arrive intact, every status be the task's, every token come
// back exactly once; ThreadSanitizer reports any race.
// Usage: mover_threads SEED ROUNDS
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "copy/async_ops.h"
#include "copy/copy_engine.h"

namespace mv = kvcore::mover;
namespace cp = kvcore::copy;

namespace {

constexpr int kSubmitters = 3;
constexpr int kOpsPerRound = 12;

struct Op {
    std::vector<uint8_t> src, dst;
    std::shared_ptr<mv::Completion> done;
    int kind = 0;  // 0 copy, 1 gather, 2 error status, 3 exception
    uint64_t token = 0;
};

std::atomic<int> failures{0};

void fail(const char* what, uint64_t token) {
    std::printf("%s (token %llu)\n", what, static_cast<unsigned long long>(token));
    failures.fetch_add(1);
}

void submit(Op& op, std::mt19937_64& rng) {
    const size_t n = 1 + rng() % (1 << 20);
    op.src.resize(n);
    for (size_t i = 0; i < n; i += 97) op.src[i] = uint8_t(rng());
    op.dst.assign(n, 0);
    op.kind = int(rng() % 4);
    cp::CopyOptions options;
    options.slice_bytes = 32 << 10;  // many slices: the pool's workers take part
    Op* o = &op;
    const bool helpable = rng() % 2;  // a waiter may run it (Completion::run_here)
    op.done = mv::submit([o, options](mv::Completion& c) -> kvcore::Status {
        switch (o->kind) {
            case 0:
                c.set_result_size(o->src.size());
                return cp::copy(o->dst.data(), o->src.data(), o->src.size(), options);
            case 1: {
                const size_t block = 4096, count = o->src.size() / block;
                std::vector<const uint8_t*> srcs(count);
                for (size_t i = 0; i < count; ++i) srcs[i] = o->src.data() + (count - 1 - i) * block;
                c.payload().assign(o->src.begin(), o->src.begin() + std::min<size_t>(o->src.size(), 64));
                return cp::gather(o->dst.data(), srcs.data(), count, block, options);
            }
            case 2: return kvcore::make_status(kvcore::Code::kInvalidArgument, "refused");
            default: throw std::runtime_error("boom");
        }
    }, helpable);
}

void check(const Op& op) {
    const kvcore::Status st = op.done->status();
    switch (op.kind) {
        case 0:
            if (!st.is_ok() || op.dst != op.src || op.done->result_size() != op.src.size()) fail("copy", op.token);
            break;
        case 1: {
            const size_t block = 4096, count = op.src.size() / block;
            bool same = st.is_ok();
            for (size_t i = 0; same && i < count; ++i)
                same = std::memcmp(op.dst.data() + i * block, op.src.data() + (count - 1 - i) * block, block) == 0;
            const size_t head = std::min<size_t>(op.src.size(), 64);
            same = same && op.done->payload().size() == head && std::memcmp(op.done->payload().data(), op.src.data(), head) == 0;
            if (!same) fail("gather", op.token);
            break;
        }
        case 2:
            if (st.code != kvcore::Code::kInvalidArgument) fail("error status", op.token);
            break;
        default:
            if (st.code != kvcore::Code::kBackendError || st.message.find("boom") == std::string::npos)
                fail("exception", op.token);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) return 64;
    const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
    const int rounds = std::atoi(argv[2]);
    const uint64_t expected = uint64_t(rounds) * kSubmitters * kOpsPerRound;
    std::vector<uint32_t> seen(expected + 1, 0);
    std::atomic<bool> stop{false};
    std::thread poller([&] {
        uint64_t got = 0;
        while (got < expected) {
            for (uint64_t t : mv::poll_notifications(5)) {
                if (t == 0 || t > expected) fail("unknown token", t);
                else if (seen[t]++) fail("token twice", t);
                ++got;
            }
        }
    });
    std::thread waker([&] {
        while (!stop.load()) {
            mv::wake_notifications();
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
    });
    std::vector<std::thread> submitters;
    for (int s = 0; s < kSubmitters; ++s) {
        submitters.emplace_back([&, s] {
            std::mt19937_64 rng(seed * 31 + s);
            for (int r = 0; r < rounds; ++r) {
                std::vector<Op> ops(kOpsPerRound);
                std::vector<bool> early(kOpsPerRound);
                for (int i = 0; i < kOpsPerRound; ++i) {
                    ops[i].token = 1 + (uint64_t(r) * kSubmitters + s) * kOpsPerRound + i;
                    submit(ops[i], rng);
                    early[i] = rng() % 2;
                    if (early[i]) ops[i].done->notify_with(ops[i].token);  // usually before it finishes
                }
                for (int i = 0; i < kOpsPerRound; ++i) {
                    Op& op = ops[i];
                    if (rng() % 3 == 0) {
                        while (!op.done->done()) std::this_thread::yield();  // polled, as Python's done()
                    } else if (rng() % 2) {
                        op.done->wait(int64_t(rng() % 3));  // may time out
                    }
                    if (rng() % 2) op.done->run_here();  // races the dispatch threads for it
                    if (!op.done->wait(-1) || !op.done->done()) fail("wait", op.token);
                    if (!early[i]) op.done->notify_with(op.token);  // after the end: queued at once
                    check(op);
                }
            }
        });
    }
    for (auto& t : submitters) t.join();
    stop.store(true);
    waker.join();
    poller.join();
    if (failures.load()) return 1;
    std::printf("ok: %llu operations\n", static_cast<unsigned long long>(expected));
    return 0;
}
