// Sharing one FFI call's independent units (query rows, heads, weight tiles) between the calling
// thread and helper tasks on XLA's intra-op pool: every thread claims chunks of units from an
// atomic counter until none are left, so the caller runs every chunk that no helper has started
// (a helper that was never scheduled costs nothing). Chunks shrink as the work runs out (guided
// self-scheduling: a claim takes the remaining units / (2 x threads), at least one), so a helper
// that starts late still finds work and the last chunks are small: the caller's wait for a
// helper's last chunk fell from ~26-29 us to ~8 us per call over a real-size decode, where fixed
// chunks of 1/8 of the work had a helper that started ~13-25 us late finish its last one after the
// caller (~100 calls a token; BUILD_NOTES 2026-12-07). The caller then waits only for chunks a
// helper has claimed: it spins for at most kSpinMicros, then blocks on a condition variable, so
// a helper that the OS descheduled mid-chunk (another process on the core) gets the caller's
// core instead of a spinning caller burning it. The work is held by shared_ptr because a helper
// may start only after the caller has returned (when the caller claimed everything itself), and
// then finds nothing. Which thread runs a unit never changes its arithmetic.

#ifndef MTPSPEC_KERNELS_PARALLEL_H_
#define MTPSPEC_KERNELS_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace mtpspec {

// How long the caller spins for helpers' chunks before it blocks. A chunk of a decode step's
// work takes a few to tens of microseconds and a helper woken on a core that a nice-19 process
// holds starts within about a hundred; a helper descheduled mid-chunk costs a time slice
// (milliseconds), which is what the blocking wait is for. 50 us blocked too often (a wake-up
// each time) and measured ~10 % slower beside a nice-19 busy loop; 200 us did not.
constexpr int64_t kSpinMicros = 200;

// fn(u0, u1) runs units [u0, u1). `threads` in all (the caller included, capped by the pool);
// `share` false (too little work for a hand-off, which costs about a microsecond) runs
// everything on the caller.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t threads, int64_t units, bool share,
                        std::function<void(int64_t, int64_t)> fn) {
  const int64_t helpers =
      threads > 1 ? std::min<int64_t>(threads, pool.num_threads()) - 1 : 0;
  if (!share || helpers <= 0 || units < 2) {
    fn(0, units);
    return;
  }
  struct Work {
    std::function<void(int64_t, int64_t)> fn;
    int64_t units, threads;
    std::atomic<int64_t> next{0}, done{0};  // the first unclaimed unit; units finished
    std::mutex mu;
    std::condition_variable finished;
    void Run() {
      int64_t cur = next.load(std::memory_order_relaxed);
      while (cur < units) {
        const int64_t take = std::max<int64_t>(1, (units - cur) / (2 * threads));
        const int64_t end = std::min(units, cur + take);
        // a failed exchange reloads cur (another thread claimed first)
        if (!next.compare_exchange_weak(cur, end, std::memory_order_acq_rel)) continue;
        fn(cur, end);
        if (done.fetch_add(end - cur, std::memory_order_acq_rel) + (end - cur) == units) {
          std::lock_guard<std::mutex> lock(mu);  // a waiter checks `done` under the lock
          finished.notify_all();
        }
        cur = next.load(std::memory_order_relaxed);
      }
    }
    bool Done() const { return done.load(std::memory_order_acquire) >= units; }
    void Wait() {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      for (int i = 1; !Done(); ++i) {
        _mm_pause();
        if (i % 64 == 0 && std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lock(mu);
          finished.wait(lock, [this] { return Done(); });
          return;
        }
      }
    }
  };
  auto work = std::make_shared<Work>();
  work->fn = std::move(fn);
  work->units = units;
  work->threads = helpers + 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([work] { work->Run(); });
  work->Run();
  work->Wait();
}

}  // namespace mtpspec

#endif  // MTPSPEC_KERNELS_PARALLEL_H_
