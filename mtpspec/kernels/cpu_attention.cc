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
//
// The query rows of one kv head (t x hq / g of them: a window's tokens times the heads of the
// group) go through the keys together, one row per vector lane (8 lanes AVX2, 16 AVX-512, by the
// `isa` attribute): each key row and each value is loaded once for all of them and broadcast,
// and the softmax runs down the lanes without horizontal sums. Lane l computes exactly what a
// row alone would (its scores as one fused multiply-add chain over the head width, the softmax
// and q . V as sequential sums over the keys, in key order; slots it may not see add exact
// zeros through a mask), so a row's bits depend neither on the window length, the other rows,
// the lane, the instruction set nor the thread: a step and a window give bit-identical rows.
// Groups are shared with helper tasks on XLA's intra-op pool (`threads` in all, the caller
// included) when a call has enough work.
//
// Built with cpu_linear.cc and cpu_gdn.cc into one library; loaded by cpu_attention.py.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "isa.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One group of up to W query rows (lanes) of one kv head over keys 0 .. kend - 1: keys below kc
// are visible to every lane; key kc + j is visible to lane l where bit l of vis[j] is set.
// qrows[l] / orows[l]: lane l's query and output rows (nullptr: an unused lane). qt [d * W],
// e [kend * W] and tmp [8 * W]: scratch. NaN in a visible score makes the row NaN (as in XLA);
// invisible slots are never multiplied in, whatever they hold.
//
// Exp: e^x for x <= 0, lane-wise 2^(x log2 e) split into 2^n · e^r with |r| <= ln2 / 2, a
// degree-6 polynomial for e^r (relative error ~2e-7), lanes below -87 flushed to 0, NaN kept.
#define MTPSPEC_ATT_GROUP(NAME, ISA, VEC, W, MASK, LOAD, STORE, SET1, ZERO, ADD, SUB, MUL, DIV,    \
                          MAX, FMADD, FNMADD, ROUND, CVT, IADD, ISET1, SHL, ASFLOAT, LT, UNORD,   \
                          OR, BITS, BLEND)                                               \
  __attribute__((target(ISA))) inline VEC NAME##Exp(VEC x) {                                     \
    const VEC lo = SET1(-87.0f);                                                                 \
    const MASK under = LT(x, lo); /* false for NaN */                                            \
    x = MAX(lo, x);               /* x when x is NaN: a NaN score stays NaN */                   \
    const VEC n = ROUND(MUL(x, SET1(1.44269504088896341f)));                                     \
    VEC r = FNMADD(n, SET1(0.693359375f), x);                                                    \
    r = FNMADD(n, SET1(-2.12194440e-4f), r);                                                     \
    VEC p = SET1(1.9875691500e-4f);                                                              \
    p = FMADD(p, r, SET1(1.3981999507e-3f));                                                     \
    p = FMADD(p, r, SET1(8.3334519073e-3f));                                                     \
    p = FMADD(p, r, SET1(4.1665795894e-2f));                                                     \
    p = FMADD(p, r, SET1(1.6666665459e-1f));                                                     \
    p = FMADD(p, r, SET1(5.0000001201e-1f));                                                     \
    p = FMADD(p, MUL(r, r), ADD(r, SET1(1.0f)));                                                 \
    const VEC e = ASFLOAT(SHL(IADD(CVT(n), ISET1(127)), 23));                                   \
    return BLEND(under, ZERO(), MUL(p, e));                                                      \
  }                                                                                              \
  __attribute__((target(ISA))) void NAME(const float* const* qrows, const float* k,             \
                                         const float* vt, int64_t d, int64_t n, int64_t kc,      \
                                         int64_t kend, const uint32_t* vis, float scale,         \
                                         float* qt, float* e, float* tmp, float* const* orows) { \
    for (int64_t i = 0; i < d; ++i)                                                              \
      for (int l = 0; l < W; ++l) qt[i * W + l] = qrows[l] ? qrows[l][i] * scale : 0.0f;         \
    /* scores: eight keys at a time, each lane's score one FMA chain over i */                   \
    int64_t j = 0;                                                                               \
    for (; j + 8 <= kend; j += 8) {                                                              \
      VEC a0 = ZERO(), a1 = ZERO(), a2 = ZERO(), a3 = ZERO();                                    \
      VEC a4 = ZERO(), a5 = ZERO(), a6 = ZERO(), a7 = ZERO();                                    \
      const float* kj = k + j * d;                                                               \
      for (int64_t i = 0; i < d; ++i) {                                                          \
        const VEC qi = LOAD(qt + i * W);                                                         \
        a0 = FMADD(qi, SET1(kj[i]), a0);                                                         \
        a1 = FMADD(qi, SET1(kj[d + i]), a1);                                                     \
        a2 = FMADD(qi, SET1(kj[2 * d + i]), a2);                                                 \
        a3 = FMADD(qi, SET1(kj[3 * d + i]), a3);                                                 \
        a4 = FMADD(qi, SET1(kj[4 * d + i]), a4);                                                 \
        a5 = FMADD(qi, SET1(kj[5 * d + i]), a5);                                                 \
        a6 = FMADD(qi, SET1(kj[6 * d + i]), a6);                                                 \
        a7 = FMADD(qi, SET1(kj[7 * d + i]), a7);                                                 \
      }                                                                                          \
      STORE(e + (j + 0) * W, a0);                                                                \
      STORE(e + (j + 1) * W, a1);                                                                \
      STORE(e + (j + 2) * W, a2);                                                                \
      STORE(e + (j + 3) * W, a3);                                                                \
      STORE(e + (j + 4) * W, a4);                                                                \
      STORE(e + (j + 5) * W, a5);                                                                \
      STORE(e + (j + 6) * W, a6);                                                                \
      STORE(e + (j + 7) * W, a7);                                                                \
    }                                                                                            \
    for (; j < kend; ++j) {                                                                      \
      VEC a = ZERO();                                                                            \
      const float* kj = k + j * d;                                                               \
      for (int64_t i = 0; i < d; ++i) a = FMADD(LOAD(qt + i * W), SET1(kj[i]), a);              \
      STORE(e + j * W, a);                                                                       \
    }                                                                                            \
    /* the running max over the visible scores (invisible ones become -inf) */                   \
    const VEC ninf = SET1(-INFINITY);                                                            \
    VEC mx = ninf, nan = ZERO();                                                                 \
    for (j = 0; j < kend; ++j) {                                                                 \
      VEC s = LOAD(e + j * W);                                                                   \
      if (j >= kc) {                                                                             \
        s = BLEND(BITS(vis[j - kc]), s, ninf);                                                   \
        STORE(e + j * W, s);                                                                     \
      }                                                                                          \
      nan = OR(nan, UNORD(s));                                                                   \
      mx = MAX(mx, s);                                                                           \
    }                                                                                            \
    mx = OR(mx, nan); /* NaN lanes (all bits set) */                                             \
    VEC den = ZERO();                                                                            \
    for (j = 0; j < kend; ++j) {                                                                 \
      const VEC x = NAME##Exp(SUB(LOAD(e + j * W), mx));                                         \
      STORE(e + j * W, x);                                                                       \
      den = ADD(den, x);                                                                         \
    }                                                                                            \
    const VEC inv = DIV(SET1(1.0f), den);                                                        \
    /* o = e . V, eight output columns at a time, each one sequential sum over the keys */       \
    for (int64_t i0 = 0; i0 < d; i0 += 8) {                                                      \
      const int64_t m = d - i0 < 8 ? d - i0 : 8;                                                 \
      VEC acc[8];                                                                                \
      for (int c = 0; c < 8; ++c) acc[c] = ZERO();                                               \
      const float* v0 = vt + i0 * n;                                                             \
      if (m == 8) { /* the same loop with a constant trip count, unrolled into registers */    \
        for (j = 0; j < kc; ++j) {                                                               \
          const VEC x = LOAD(e + j * W);                                                         \
          for (int c = 0; c < 8; ++c) acc[c] = FMADD(x, SET1(v0[c * n + j]), acc[c]);            \
        }                                                                                        \
      } else {                                                                                   \
        for (j = 0; j < kc; ++j) {                                                               \
          const VEC x = LOAD(e + j * W);                                                         \
          for (int c = 0; c < m; ++c) acc[c] = FMADD(x, SET1(v0[c * n + j]), acc[c]);            \
        }                                                                                        \
      }                                                                                          \
      for (j = kc; j < kend; ++j) {                                                              \
        const VEC x = LOAD(e + j * W);                                                           \
        const MASK see = BITS(vis[j - kc]);                                                      \
        for (int c = 0; c < m; ++c)                                                              \
          acc[c] = BLEND(see, FMADD(x, SET1(v0[c * n + j]), acc[c]), acc[c]);                    \
      }                                                                                          \
      for (int c = 0; c < m; ++c) STORE(tmp + c * W, MUL(acc[c], inv));                          \
      for (int l = 0; l < W; ++l)                                                                \
        if (orows[l] != nullptr)                                                                 \
          for (int c = 0; c < m; ++c) orows[l][i0 + c] = tmp[c * W + l];                         \
    }                                                                                            \
  }

// AVX2: masks are vectors of all-ones lanes; BLEND(m, a, b) = m ? a : b.
__attribute__((target("avx2,fma"))) inline __m256 Bits256(uint32_t bits) {
  const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lane));
}
#define MTPSPEC_B256(m, a, b) _mm256_blendv_ps((b), (a), (m))
#define MTPSPEC_LT256(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define MTPSPEC_UNORD256(a) _mm256_cmp_ps((a), (a), _CMP_UNORD_Q)
#define MTPSPEC_ROUND256(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
MTPSPEC_ATT_GROUP(Group256, "avx2,fma", __m256, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps,
                  _mm256_set1_ps, _mm256_setzero_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps,
                  _mm256_div_ps, _mm256_max_ps, _mm256_fmadd_ps, _mm256_fnmadd_ps,
                  MTPSPEC_ROUND256, _mm256_cvtps_epi32, _mm256_add_epi32, _mm256_set1_epi32,
                  _mm256_slli_epi32, _mm256_castsi256_ps, MTPSPEC_LT256, MTPSPEC_UNORD256,
                  _mm256_or_ps, Bits256, MTPSPEC_B256)

// AVX-512: masks are __mmask16; NaN lanes of `nan` are all-ones vectors as above.
#define MTPSPEC_B512(m, a, b) _mm512_mask_blend_ps((m), (b), (a))
#define MTPSPEC_LT512(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define MTPSPEC_UNORD512(a)                                                                \
  _mm512_castsi512_ps(_mm512_maskz_set1_epi32(_mm512_cmp_ps_mask((a), (a), _CMP_UNORD_Q), -1))
#define MTPSPEC_ROUND512(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define MTPSPEC_OR512(a, b) \
  _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
#define MTPSPEC_BITS512(bits) static_cast<__mmask16>(bits)
MTPSPEC_ATT_GROUP(Group512, "avx512f", __m512, 16, __mmask16, _mm512_loadu_ps, _mm512_storeu_ps,
                  _mm512_set1_ps, _mm512_setzero_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps,
                  _mm512_div_ps, _mm512_max_ps, _mm512_fmadd_ps, _mm512_fnmadd_ps,
                  MTPSPEC_ROUND512, _mm512_cvtps_epi32, _mm512_add_epi32, _mm512_set1_epi32,
                  _mm512_slli_epi32, _mm512_castsi512_ps, MTPSPEC_LT512, MTPSPEC_UNORD512,
                  MTPSPEC_OR512, MTPSPEC_BITS512, MTPSPEC_B512)
#undef MTPSPEC_ATT_GROUP

// A call's rows, grouped: row r = ti * ratio + hh of kv head gi (batch bi) is query (ti, head
// gi * ratio + hh); groups of `lanes` consecutive rows (16 with AVX-512, 8 with AVX2), each run
// by the 16-lane loop when it has more than 8 rows, else the 8-lane one (same bits either way).
// A call of one group of more than 8 rows (a verify window's 16) splits them in two groups
// instead, so that both threads work: in the decode loop that took an MTP k = 3 run 5 % less
// time, while splitting a step's 4 rows made plain decoding ~8 % slower (the hand-off and a
// second cold pass over the cache cost more than 2 rows of arithmetic).
struct Layout {
  int64_t b, t, hq, d, g, n, ratio, rows, lanes, groups;
  Layout(int64_t b_, int64_t t_, int64_t hq_, int64_t d_, int64_t g_, int64_t n_, int64_t isa,
         int64_t threads)
      : b(b_), t(t_), hq(hq_), d(d_), g(g_), n(n_), ratio(hq_ / g_), rows(t_ * (hq_ / g_)) {
    lanes = isa == 1 ? 16 : 8;
    if (threads > 1 && rows > 8 && b * g * ((rows + lanes - 1) / lanes) < 2) {
      lanes = (rows + 1) / 2;
    }
    groups = (rows + lanes - 1) / lanes;
  }
  int64_t Units() const { return b * g * groups; }
  // query / output offset of row r of (bi, gi)
  int64_t Row(int64_t bi, int64_t gi, int64_t r) const {
    return ((bi * t + r / ratio) * hq + gi * ratio + r % ratio) * d;
  }
};

// Runs units [u0, u1) of `lay`. Query ti of batch bi sees slots 0 .. first - 1 and those s in
// [first, last) with span.Extra(bi, ti, s), where span.Bounds(bi, ti, &first, &last).
template <class Span>
void RunGroups(const Layout& lay, const float* qp, const float* kp, const float* vp, float* op,
               float scale, int64_t u0, int64_t u1, Span span) {
  const int64_t d = lay.d, n = lay.n;
  std::vector<float> qt(d * 16), e, tmp(8 * 16);
  std::vector<uint32_t> vis;
  int64_t first[16], last[16];
  const float* qrows[16];
  float* orows[16];
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t c = u % lay.groups, bg = u / lay.groups, bi = bg / lay.g, gi = bg % lay.g;
    const int64_t r0 = c * lay.lanes, live = std::min(lay.lanes, lay.rows - r0);
    const int64_t W = live > 8 ? 16 : 8;
    int64_t kc = n, kend = 0;
    for (int64_t l = 0; l < W; ++l) {
      const int64_t r = r0 + l;
      qrows[l] = nullptr;
      orows[l] = nullptr;
      if (l >= live) continue;
      qrows[l] = qp + lay.Row(bi, gi, r);
      orows[l] = op + lay.Row(bi, gi, r);
      span.Bounds(bi, r / lay.ratio, &first[l], &last[l]);
      kc = std::min(kc, first[l]);
      kend = std::max(kend, last[l]);
    }
    vis.assign(kend - kc, 0);
    for (int64_t l = 0; l < W; ++l) {
      if (qrows[l] == nullptr) continue;
      for (int64_t s = kc; s < last[l]; ++s)
        if (s < first[l] || span.Extra(bi, (r0 + l) / lay.ratio, s)) vis[s - kc] |= 1u << l;
    }
    if (e.size() < static_cast<size_t>(kend * W)) e.resize(kend * W);
    // the group's live keys and values into L2 first (one pass of prefetches: ~10 % off a
    // call in the decode loop, where the cache comes cold from memory)
    const float* kh = kp + (bi * lay.g + gi) * n * d;  // this kv head's k [n, d], v^T [d, n]
    const float* vh = vp + (bi * lay.g + gi) * d * n;
    const char* kb = reinterpret_cast<const char*>(kh);
    const char* vb = reinterpret_cast<const char*>(vh);
    for (int64_t o = 0; o < kend * d * 4; o += 64) _mm_prefetch(kb + o, _MM_HINT_T1);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t o = 0; o < kend * 4; o += 64) _mm_prefetch(vb + i * n * 4 + o, _MM_HINT_T1);
    (W == 16 ? Group512 : Group256)(qrows, kh, vh, d, n, kc, kend, vis.data(), scale, qt.data(),
                                    e.data(), tmp.data(), orows);
  }
}

// Below this much work (query rows x live slots x head width, at most) a call runs on the caller
// alone: a hand-off to the pool costs about a microsecond.
constexpr int64_t kMinShared = 16 * 1024;

// All of a call's groups, shared with helper tasks on XLA's pool when the call has enough work.
template <class Span>
void Run(ffi::ThreadPool& pool, int64_t threads, const Layout& lay, const float* qp,
         const float* kp, const float* vp, float* op, float scale, Span span) {
  auto units = [&](int64_t u0, int64_t u1) {
    RunGroups(lay, qp, kp, vp, op, scale, u0, u1, span);
  };
  const bool share = lay.b * lay.g * lay.rows * lay.n * lay.d >= kMinShared;
  mtpspec::ParallelFor(pool, threads, lay.Units(), share, units);
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                     ffi::Buffer<ffi::S32> positions, ffi::ResultBuffer<ffi::F32> o,
                     float scale, int64_t threads, int64_t isa) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto pd = positions.dimensions(), od = o->dimensions();
  if (const char* bad = mtpspec::BadIsa(isa)) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_attention: ") + bad);
  }
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
  const Layout lay(b, t, hq, d, g, n, isa, threads);
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const int32_t* pos = positions.typed_data();
  float* op = o->typed_data();
  // query ti of batch bi sees slots 0 .. positions[bi, ti]; a padded query past the capacity
  // reads all of it (its output is never used), a negative position reads slot 0
  struct Span {
    const int32_t* pos;
    int64_t t, n;
    void Bounds(int64_t bi, int64_t ti, int64_t* first, int64_t* last) const {
      *first = *last = std::clamp<int64_t>(int64_t{pos[bi * t + ti]} + 1, 1, n);
    }
    bool Extra(int64_t, int64_t, int64_t) const { return false; }
  } span{pos, t, n};
  Run(pool, threads, lay, qp, kp, vp, op, scale, span);
  return ffi::Error::Success();
}

// A tree window (speculative tree verification): query row r of R, at its own position, reads
// the committed prefix (slots 0 .. L - 1) and the slots L + a of its ancestors a and itself
// (ancestors[r * R + a] != 0), whose keys the window wrote there.
ffi::Error TreeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> lengths,
                         ffi::Buffer<ffi::S32> ancestors, ffi::ResultBuffer<ffi::F32> o,
                         float scale, int64_t threads, int64_t isa) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto ld = lengths.dimensions(), ad = ancestors.dimensions(), od = o->dimensions();
  if (const char* bad = mtpspec::BadIsa(isa)) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_tree_attention: ") + bad);
  }
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
  const Layout lay(b, t, hq, d, g, n, isa, threads);
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const int32_t *lp = lengths.typed_data(), *anc = ancestors.typed_data();
  float* op = o->typed_data();
  // the prefix is clamped so that the path's slots stay inside the capacity; a row that would
  // see nothing reads slot 0 (its output is unused)
  struct Span {
    const int32_t *lp, *anc;
    int64_t t, n;
    void Bounds(int64_t bi, int64_t r, int64_t* first, int64_t* last) const {
      const int64_t len = std::clamp<int64_t>(lp[bi], 0, n);
      *first = len;
      *last = len;
      for (int64_t a = 0; a < t; ++a)
        if (anc[r * t + a] != 0 && len + a < n) *last = len + a + 1;
      if (*last == 0) *first = *last = 1;
    }
    bool Extra(int64_t bi, int64_t r, int64_t s) const {
      const int64_t len = std::clamp<int64_t>(lp[bi], 0, n);
      return s >= len && anc[r * t + (s - len)] != 0;
    }
  } span{lp, anc, t, n};
  Run(pool, threads, lay, qp, kp, vp, op, scale, span);
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
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("isa"));

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
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("isa"));
