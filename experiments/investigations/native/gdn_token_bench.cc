// The C++ GDN kernel's token loops side by side, outside XLA: one thread, one layer's heads
// (hv = 4 value heads over hk = 2 key heads, dk = dv), a chain window of t tokens, the plain
// loop (values kept in memory) against the AVX2 and AVX-512 loops that hold a value row in
// registers (cpu_gdn.cc, Pick). Also checks that the three give the same bits.
//
//   g++ -O3 -std=c++17 -w -I"$(.venv/bin/python -c 'import jax.ffi; print(jax.ffi.include_dir())')" \
//       experiments/investigations/native/gdn_token_bench.cc -o /tmp/gdn_token_bench
//   /tmp/gdn_token_bench 64 && /tmp/gdn_token_bench 128
//
// Needs a CPU with AVX-512F (the AVX-512 column calls its loop unconditionally).

#include "../../mtpspec/kernels/cpu_gdn.cc"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" int mtpspec_cpu_linear_avx512() {  // cpu_linear.cc's, which this harness leaves out
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

int main(int argc, char** argv) {
  if (!mtpspec_cpu_linear_avx512()) {
    std::fprintf(stderr, "this CPU lacks AVX-512F\n");
    return 1;
  }
  const int64_t hk = 2, hv = 4, dk = argc > 1 ? std::atoi(argv[1]) : 64, dv = dk, hs = dk * dv;
  const TokenFn loops[3][2] = {{Token<false>, Token<true>},
                               {Pick<false>(dv, 0), Pick<true>(dv, 0)},
                               {Pick<false>(dv, 1), Pick<true>(dv, 1)}};
  const char* names[3] = {"plain", "avx2", "avx512"};
  for (int t : {1, 2, 4, 8}) {
    std::vector<float> q(t * hk * dk), k(t * hk * dk), v(t * hv * dv), g(t * hv), beta(t * hv),
        s0(hv * hs), kv(dv);
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * (i % 7), k[i] = 0.02f * (i % 5) - 0.03f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * (i % 3) - 0.1f;
    for (size_t i = 0; i < g.size(); ++i) g[i] = -0.05f * (i % 4), beta[i] = 0.3f + 0.1f * (i % 3);
    for (size_t i = 0; i < s0.size(); ++i) s0[i] = 0.001f * (i % 11) - 0.005f;
    std::vector<float> out[3];
    double us[3];
    for (int l = 0; l < 3; ++l) {
      std::vector<float> fin(hv * hs), o(t * hv * dv), u(t * hv * dv);
      auto layer = [&] {
        for (int64_t h = 0; h < hv; ++h) {
          const int64_t kh = h / (hv / hk);
          Head(t, nullptr, dk, dv, hk * dk, hv * dv, hv, hv * hs, q.data() + kh * dk,
               k.data() + kh * dk, v.data() + h * dv, g.data() + h, beta.data() + h, 0.125f,
               s0.data() + h * hs, fin.data() + h * hs, o.data() + h * dv, u.data() + h * dv,
               nullptr, kv.data(), loops[l][0], loops[l][1]);
        }
      };
      const int reps = 20000 / t;
      layer();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) layer();
      const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
      us[l] = s.count() / reps * 1e6;
      out[l] = fin;
      out[l].insert(out[l].end(), o.begin(), o.end());
      out[l].insert(out[l].end(), u.begin(), u.end());
    }
    const bool same = out[0] == out[1] && out[0] == out[2];
    std::printf("t %d, dk = dv = %ld: %s %7.2f us  %s %7.2f us  %s %7.2f us  (%.2fx, %.2fx)  %s\n",
                t, dv, names[0], us[0], names[1], us[1], names[2], us[2], us[0] / us[1],
                us[0] / us[2], same ? "same bits" : "BITS DIFFER");
  }
  return 0;
}
