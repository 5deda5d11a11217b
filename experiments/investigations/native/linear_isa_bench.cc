// The C++ linear's inner loops side by side, outside XLA: one thread, the same packed weight,
// AVX2 against AVX-512 (the two-tile loop) for each row count. Weights of k x n floats: n = 512
// (512 KB, in L2) shows the arithmetic, n = 4096 (4 MB, from L3) the stream.
//
//   g++ -O3 -std=c++17 -w -I"$(.venv/bin/python -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
//       experiments/investigations/native/linear_isa_bench.cc -o /tmp/linear_isa_bench
//   /tmp/linear_isa_bench 512 && /tmp/linear_isa_bench 4096
//
// Needs a CPU with AVX-512F (the AVX-512 column calls its loop unconditionally).

#include "../../mtpspec/kernels/cpu_linear.cc"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (!mtpspec_cpu_linear_avx512()) {
    std::fprintf(stderr, "this CPU lacks AVX-512F\n");
    return 1;
  }
  const int64_t k = 256, n = argc > 1 ? std::atoi(argv[1]) : 512;
  const int64_t tiles = (n + kTile - 1) / kTile;
  std::vector<float> w(tiles * k * kTile, 0.01f), x(64 * k, 0.5f), y(64 * n);
  for (int rows : {1, 2, 3, 4, 5, 6, 60}) {
    double us[2];
    for (int isa = 0; isa < 2; ++isa) {
      const int reps = 20000 / rows;
      Tiles(kIsas[isa], x.data(), rows, k, w.data(), n, y.data(), 0, tiles, 64);  // warm
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r)
        Tiles(kIsas[isa], x.data(), rows, k, w.data(), n, y.data(), 0, tiles, 64);
      const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
      us[isa] = s.count() / reps * 1e6;
    }
    std::printf("rows %2d: avx2 %8.2f us  avx512 %8.2f us  (%.2fx)\n", rows, us[0], us[1],
                us[0] / us[1]);
  }
  return 0;
}
