// Causal grouped-query attention of a decode step or a short verify window over its KV cache, on
// CPU, called from XLA through its typed FFI: one call per attention layer in place of the
// YNNPACK dots XLA:CPU emits for a few query rows (which re-pack the whole cache on every call)
// and the softmax fusions around them.
//
//   q [b, t, hq, d]; k cache [b, g, n, d]; v cache [b, g, d, n] (transposed, as the decode state
//   keeps it); positions [b, t] int32 -> o [b, t, hq, d]
//
// Query row (ti, h) reads kv head h / (hq / g) at cache slots 0 .. positions[b, ti] (the cache
// already holds the window's own keys): only the live prefix is read, not the whole capacity.
// Each row's arithmetic is independent of the others and of the window length (a step and a
// window give bit-identical rows for the same inputs). Rows are shared with helper tasks on XLA's
// intra-op pool (`threads` in all, the caller included) when a call has enough work.
//
// Built with cpu_linear.cc and cpu_gdn.cc into one library; loaded by cpu_attention.py.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// e^x for x <= 0, 8 lanes: 2^(x log2 e) split into 2^n · e^r with |r| <= ln2 / 2, a degree-6
// polynomial for e^r (relative error ~2e-7), lanes below -87 flushed to 0, NaN kept.
__attribute__((target("avx2,fma"))) inline __m256 Exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // false for NaN
  x = _mm256_max_ps(lo, x);  // returns x when x is NaN: a NaN score stays NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

__attribute__((target("avx2,fma"))) inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Dot product of two float vectors of length m: 8-lane partial sums in a fixed order, then the
// scalar tail.
__attribute__((target("avx2,fma"))) inline float Dot(const float* a, const float* b, int64_t m) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= m; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = Sum(_mm256_add_ps(acc0, acc1));
  for (; i < m; ++i) s += a[i] * b[i];
  return s;
}

// One query row: o = softmax(scale q · K[slots]) V[slots], with K [n, d] rows and V^T [d, n], over
// the slots 0 .. len - 1 and then the m gathered slots path[0 .. m) (a tree row's own path; m = 0
// for a decode step or a chain window). A row's arithmetic depends only on its own slots.
__attribute__((target("avx2,fma"))) void Row(const float* q, const float* k, const float* vt,
                                             int64_t d, int64_t n, int64_t len,
                                             const int64_t* path, int64_t m, float scale,
                                             float* p, float* qs, float* o) {
  for (int64_t i = 0; i < d; ++i) qs[i] = q[i] * scale;
  float mx = -INFINITY;
  for (int64_t j = 0; j < len; ++j) {
    p[j] = Dot(qs, k + j * d, d);
    if (!(p[j] <= mx)) mx = p[j];  // a NaN score makes mx NaN: the row comes out NaN, as in XLA
  }
  for (int64_t a = 0; a < m; ++a) {
    p[len + a] = Dot(qs, k + path[a] * d, d);
    if (!(p[len + a] <= mx)) mx = p[len + a];
  }
  const int64_t all = len + m;
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 den8 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= all; j += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(p + j), mv));
    _mm256_storeu_ps(p + j, e);
    den8 = _mm256_add_ps(den8, e);
  }
  float den = Sum(den8);
  if (j < all) {  // the tail through one padded vector (lanes beyond it are not stored)
    float tail[8] = {0};
    for (int64_t i = j; i < all; ++i) tail[i - j] = p[i] - mx;
    for (int64_t i = all - j; i < 8; ++i) tail[i] = -INFINITY;
    float e[8];
    _mm256_storeu_ps(e, Exp(_mm256_loadu_ps(tail)));
    for (int64_t i = j; i < all; ++i) {
      p[i] = e[i - j];
      den += e[i - j];
    }
  }
  const float inv = 1.0f / den;
  for (int64_t i = 0; i < d; ++i) {
    const float* vi = vt + i * n;
    float acc = Dot(p, vi, len);
    for (int64_t a = 0; a < m; ++a) acc += p[len + a] * vi[path[a]];
    o[i] = acc * inv;
  }
}

// Below this much work (query rows x live slots x head width, at most) a call runs on the caller
// alone: a hand-off to the pool costs about a microsecond.
constexpr int64_t kMinShared = 16 * 1024;

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                     ffi::Buffer<ffi::S32> positions, ffi::ResultBuffer<ffi::F32> o,
                     float scale, int64_t threads) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto pd = positions.dimensions(), od = o->dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || pd.size() != 2 || od.size() != 4) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_attention: expected q [b, t, hq, d], k [b, g, n, d], v [b, g, d, n], "
        "positions [b, t], o [b, t, hq, d]");
  }
  const int64_t b = qd[0], t = qd[1], hq = qd[2], d = qd[3], g = kd[1], n = kd[2];
  if (g <= 0 || hq % g != 0 || kd[0] != b || kd[3] != d || vd[0] != b || vd[1] != g ||
      vd[2] != d || vd[3] != n || pd[0] != b || pd[1] != t || od[0] != b || od[1] != t ||
      od[2] != hq || od[3] != d || n <= 0) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_attention: shapes do not match");
  }
  const int64_t ratio = hq / g, units = b * t * hq;
  const float* qp = q.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const int32_t* pos = positions.typed_data();
  float* op = o->typed_data();
  // query rows [u0, u1) of the flattened (batch, query, head) order
  auto rows = [=](int64_t u0, int64_t u1) {
    std::vector<float> p(n), qs(d);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u % hq, bt = u / hq, bi = bt / t;
      // slots 0..pos visible; a padded query past the capacity reads all of it (its output is
      // never used), a negative position reads slot 0
      const int64_t len = std::clamp<int64_t>(int64_t{pos[bt]} + 1, 1, n);
      const int64_t gi = h / ratio;
      Row(qp + u * d, kp + (bi * g + gi) * n * d, vp + (bi * g + gi) * d * n, d, n, len,
          nullptr, 0, scale, p.data(), qs.data(), op + u * d);
    }
  };
  mtpspec::ParallelFor(pool, threads, units, units * n * d >= kMinShared, 8, rows);
  return ffi::Error::Success();
}

// A tree window (speculative tree verification): query row r of R, at its own position, reads
// the committed prefix (slots 0 .. L - 1) and the slots L + a of its ancestors a and itself
// (ancestors[r * R + a] != 0), whose keys the window wrote there: Row with the path gathered.
ffi::Error TreeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> lengths,
                         ffi::Buffer<ffi::S32> ancestors, ffi::ResultBuffer<ffi::F32> o,
                         float scale, int64_t threads) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto ld = lengths.dimensions(), ad = ancestors.dimensions(), od = o->dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || ld.size() != 1 || ad.size() != 2 ||
      od.size() != 4) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_tree_attention: expected q [b, R, hq, d], k [b, g, n, d], v [b, g, d, n], "
        "lengths [b], ancestors [R, R], o [b, R, hq, d]");
  }
  const int64_t b = qd[0], t = qd[1], hq = qd[2], d = qd[3], g = kd[1], n = kd[2];
  if (g <= 0 || hq % g != 0 || kd[0] != b || kd[3] != d || vd[0] != b || vd[1] != g ||
      vd[2] != d || vd[3] != n || ld[0] != b || ad[0] != t || ad[1] != t || od[0] != b ||
      od[1] != t || od[2] != hq || od[3] != d || n <= 0) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_tree_attention: shapes do not match");
  }
  const int64_t ratio = hq / g, units = b * t * hq;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const int32_t *lp = lengths.typed_data(), *anc = ancestors.typed_data();
  float* op = o->typed_data();
  auto rows = [=](int64_t u0, int64_t u1) {
    std::vector<float> p(n + t), qs(d);
    std::vector<int64_t> path(t);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u % hq, bt = u / hq, bi = bt / t, r = bt % t, gi = h / ratio;
      // the prefix, clamped so that the path's slots stay inside the capacity
      const int64_t len = std::clamp<int64_t>(lp[bi], 0, n);
      int64_t m = 0;
      for (int64_t a = 0; a < t; ++a)
        if (anc[r * t + a] != 0 && len + a < n) path[m++] = len + a;
      if (len + m == 0) path[m++] = 0;  // nothing visible: read slot 0 (its output is unused)
      Row(qp + u * d, kp + (bi * g + gi) * n * d, vp + (bi * g + gi) * d * n, d, n, len,
              path.data(), m, scale, p.data(), qs.data(), op + u * d);
    }
  };
  mtpspec::ParallelFor(pool, threads, units, units * n * d >= kMinShared, 8, rows);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuAttention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k cache
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v cache (transposed)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // positions
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuTreeAttention, TreeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k cache
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v cache (transposed)
                                  .Arg<ffi::Buffer<ffi::S32>>()  // committed lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()  // ancestor-or-self mask
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));
