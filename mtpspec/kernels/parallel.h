// Sharing one FFI call's independent units (query rows, heads) between the calling thread and
// helper tasks on XLA's intra-op pool, as cpu_linear.cc shares its weight tiles: every thread
// claims chunks of units from an atomic counter until none are left; the caller then waits for
// all chunks to be done. The work is held by shared_ptr because a helper may start only after
// the caller has returned (when the caller claimed everything itself), and then finds nothing.
// Which thread runs a unit never changes its arithmetic.

#ifndef MTPSPEC_KERNELS_PARALLEL_H_
#define MTPSPEC_KERNELS_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace mtpspec {

// fn(u0, u1) runs units [u0, u1). `threads` in all (the caller included, capped by the pool);
// `share` false (too little work for a hand-off, which costs about a microsecond) runs
// everything on the caller. Each thread gets about `per_thread` chunks.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t threads, int64_t units, bool share,
                        int64_t per_thread, std::function<void(int64_t, int64_t)> fn) {
  const int64_t helpers =
      threads > 1 ? std::min<int64_t>(threads, pool.num_threads()) - 1 : 0;
  if (!share || helpers <= 0 || units < 2) {
    fn(0, units);
    return;
  }
  struct Work {
    std::function<void(int64_t, int64_t)> fn;
    int64_t units, chunks;
    std::atomic<int64_t> next{0}, done{0};
    void Run() {
      for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
        fn(c * units / chunks, (c + 1) * units / chunks);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto work = std::make_shared<Work>();
  work->fn = std::move(fn);
  work->units = units;
  work->chunks = std::min<int64_t>(units, per_thread * (helpers + 1));
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load(std::memory_order_acquire) < work->chunks) _mm_pause();
}

}  // namespace mtpspec

#endif  // MTPSPEC_KERNELS_PARALLEL_H_
