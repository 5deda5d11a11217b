// The gated delta rule over a short window (the decode step and the speculative verify window) on
// CPU, token by token, called from XLA through its typed FFI: one call per GDN layer in place of
// the few dozen small XLA ops a JAX form of the same recurrence compiles to.
//
// Per batch row and value head h (reading key head h / (hv / hk)), with S in R^{k x v}:
//     S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (scale q_t)
// Outputs: o and u [b, t, hv, dv], the final state [b, hv, dk, dv] and, when `states` is not
// empty, every per-position state [b, t, hv, dk, dv]. A token's arithmetic does not depend on the
// window length, so a step and a window produce bit-identical rows for the same inputs. Heads are
// shared with helper tasks on XLA's intra-op pool (`threads` in all, the caller included;
// parallel.h) when a call has enough work.
//
// A token is one of three loops with the same arithmetic lane by lane (so the same bits): for a
// value width in whole vectors, blocks of up to 64 columns whose part of S^T k, u and o stays in
// registers across the dk rows of S (AVX-512 where the `isa` attribute says 1, else AVX2); any
// other width, a plain loop the compiler vectorises, which keeps them in memory (BUILD_NOTES.md
// has the timings; experiments/investigations/native/gdn_token_bench.cc measures them).
//
// Built with cpu_linear.cc into one library; loaded by mtpspec/kernels/cpu_gdn.py.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "isa.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;


namespace {

// One token of one (batch row, value head): s = exp(g) prev, u = beta (v - s^T k), s += k u^T,
// o = s^T (scale q). InPlace: `prev` is `s` itself (a chain advances in place; said statically so
// that the decay loop vectorises without a run-time overlap check falling back to scalar code);
// else another state (a tree node starts from its parent's).
template <bool InPlace>
__attribute__((target("avx2,fma"))) inline void Token(int64_t dk, int64_t dv, const float* prev,
                                                      float* s, const float* __restrict qt,
                                                      const float* __restrict kt,
                                                      const float* __restrict vt, float decay,
                                                      float b, float scale, float* __restrict ut,
                                                      float* __restrict ot,
                                                      float* __restrict kv) {
  for (int64_t j = 0; j < dv; ++j) kv[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {  // decay, and kv = S^T k with the decayed S
    float* row = s + i * dv;
    const float* from = InPlace ? row : prev + i * dv;
    const float ki = kt[i];
    for (int64_t j = 0; j < dv; ++j) {
      row[j] = from[j] * decay;
      kv[j] += row[j] * ki;
    }
  }
  for (int64_t j = 0; j < dv; ++j) {
    ut[j] = b * (vt[j] - kv[j]);
    ot[j] = 0.0f;
  }
  for (int64_t i = 0; i < dk; ++i) {  // S += k u^T, and o = S^T (scale q) with the new S
    float* row = s + i * dv;
    const float ki = kt[i];
    const float qi = qt[i] * scale;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] += ki * ut[j];
      ot[j] += row[j] * qi;
    }
  }
}

// The same token, column block by column block: every column of S, u and o depends only on its
// own column (and on q, k, v, g, beta), so a block of NV vectors of W lanes holds its part of
// S^T k, then of u and o, in registers across the dk rows of S. Lane j computes exactly what the
// plain loop above computes for column j (a multiply, then fused multiply-adds in the same order).
#define MTPSPEC_GDN_BLOCK(NAME, ISA, VEC, W, LOAD, STORE, SET1, ZERO, MUL, SUB, FMADD)            \
  template <int NV, bool InPlace>                                                                \
  __attribute__((target(ISA))) inline void NAME(int64_t dk, int64_t dv, const float* prev,      \
                                                float* s, const float* __restrict qt,            \
                                                const float* __restrict kt,                      \
                                                const float* __restrict vt, float decay, float b, \
                                                float scale, float* __restrict ut,               \
                                                float* __restrict ot) {                          \
    VEC acc[NV], uu[NV], oo[NV];                                                                 \
    for (int c = 0; c < NV; ++c) acc[c] = ZERO();                                                \
    const VEC d = SET1(decay);                                                                   \
    for (int64_t i = 0; i < dk; ++i) {                                                           \
      float* row = s + i * dv;                                                                   \
      const float* from = InPlace ? row : prev + i * dv;                                         \
      const VEC ki = SET1(kt[i]);                                                                \
      for (int c = 0; c < NV; ++c) {                                                             \
        const VEC r = MUL(LOAD(from + W * c), d);                                                \
        STORE(row + W * c, r);                                                                   \
        acc[c] = FMADD(r, ki, acc[c]);                                                           \
      }                                                                                          \
    }                                                                                            \
    const VEC bb = SET1(b);                                                                      \
    for (int c = 0; c < NV; ++c) {                                                               \
      uu[c] = MUL(bb, SUB(LOAD(vt + W * c), acc[c]));                                            \
      STORE(ut + W * c, uu[c]);                                                                  \
      oo[c] = ZERO();                                                                            \
    }                                                                                            \
    for (int64_t i = 0; i < dk; ++i) {                                                           \
      float* row = s + i * dv;                                                                   \
      const VEC ki = SET1(kt[i]), qi = SET1(qt[i] * scale);                                      \
      for (int c = 0; c < NV; ++c) {                                                             \
        const VEC r = FMADD(ki, uu[c], LOAD(row + W * c));                                       \
        STORE(row + W * c, r);                                                                   \
        oo[c] = FMADD(r, qi, oo[c]);                                                             \
      }                                                                                          \
    }                                                                                            \
    for (int c = 0; c < NV; ++c) STORE(ot + W * c, oo[c]);                                       \
  }

MTPSPEC_GDN_BLOCK(Block256, "avx2,fma", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                  _mm256_set1_ps, _mm256_setzero_ps, _mm256_mul_ps, _mm256_sub_ps,
                  _mm256_fmadd_ps)
MTPSPEC_GDN_BLOCK(Block512, "avx512f", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                  _mm512_set1_ps, _mm512_setzero_ps, _mm512_mul_ps, _mm512_sub_ps,
                  _mm512_fmadd_ps)
#undef MTPSPEC_GDN_BLOCK

// A token through blocks of up to 64 columns (kMax vectors; 8 AVX2 or 4 AVX-512 registers per
// row of S^T k, u and o), the last block narrower when dv is not a multiple of 64. dv: a
// multiple of the vector width W.
#define MTPSPEC_GDN_TOKEN(NAME, BLOCK, W)                                                        \
  template <bool InPlace>                                                                        \
  void NAME(int64_t dk, int64_t dv, const float* prev, float* s, const float* qt,                \
            const float* kt, const float* vt, float decay, float b, float scale, float* ut,     \
            float* ot, float*) {                                                                 \
    constexpr int64_t kMax = 64 / W;                                                             \
    for (int64_t j = 0; j < dv; j += 64) {                                                       \
      const float* p = InPlace ? nullptr : prev + j;                                             \
      float *sj = s + j, *uj = ut + j, *oj = ot + j;                                             \
      switch (std::min<int64_t>(kMax, (dv - j) / W)) {                                           \
        case 1: BLOCK<1, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 2: BLOCK<2, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 3: BLOCK<3, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 4: BLOCK<4, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 5: BLOCK<5, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 6: BLOCK<6, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        case 7: BLOCK<7, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj); break;\
        default: BLOCK<kMax, InPlace>(dk, dv, p, sj, qt, kt, vt + j, decay, b, scale, uj, oj);   \
      }                                                                                          \
    }                                                                                            \
  }

MTPSPEC_GDN_TOKEN(Token256, Block256, 8)
MTPSPEC_GDN_TOKEN(Token512, Block512, 16)
#undef MTPSPEC_GDN_TOKEN

// One token's loop: Token's arguments; `kv` is its scratch row (the plain loop's only).
using TokenFn = void (*)(int64_t dk, int64_t dv, const float* prev, float* s, const float* qt,
                         const float* kt, const float* vt, float decay, float b, float scale,
                         float* ut, float* ot, float* kv);

// The loop for value width dv: in registers where dv is a multiple of the vector width (16 for
// AVX-512, isa 1; 8 for AVX2, isa 0), else the plain loop.
template <bool InPlace>
TokenFn Pick(int64_t dv, int64_t isa) {
  if (isa == 1 && dv % 16 == 0) return Token512<InPlace>;
  if (dv % 8 == 0) return Token256<InPlace>;
  return Token<InPlace>;
}

// One (batch row, value head) over t tokens: a chain (parent null: the first token reads s0 and
// writes S, the rest advance S in place, every state copied out when `states` is not null) or a
// tree (parent[r] < 0: node r starts from s0, else from node parent[r]'s state; every node's state
// kept in `states`, S unused). `from` and `in_place`: Pick's loops for this head width.
void Head(int64_t t, const int32_t* parent, int64_t dk, int64_t dv, int64_t q_stride,
          int64_t v_stride, int64_t gb_stride, int64_t s_stride, const float* q, const float* k,
          const float* v, const float* g, const float* beta, float scale, const float* s0,
          float* s, float* o, float* u, float* states, float* kv, TokenFn from,
          TokenFn in_place) {
  for (int64_t r = 0; r < t; ++r) {
    const float decay = std::exp(g[r * gb_stride]), b = beta[r * gb_stride];
    const float *qt = q + r * q_stride, *kt = k + r * q_stride, *vt = v + r * v_stride;
    float *ut = u + r * v_stride, *ot = o + r * v_stride, *node = states + r * s_stride;
    if (parent != nullptr) {
      const float* prev = parent[r] < 0 ? s0 : states + parent[r] * s_stride;
      from(dk, dv, prev, node, qt, kt, vt, decay, b, scale, ut, ot, kv);
      continue;
    }
    (r == 0 ? from : in_place)(dk, dv, r == 0 ? s0 : s, s, qt, kt, vt, decay, b, scale, ut, ot,
                               kv);
    if (states != nullptr) std::memcpy(node, s, sizeof(float) * dk * dv);
  }
  if (parent == nullptr && t == 0) std::memcpy(s, s0, sizeof(float) * dk * dv);
}

bool Dims(const ffi::Span<const int64_t>& d, std::initializer_list<int64_t> want) {
  if (d.size() != want.size()) return false;
  int64_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

// Below this much work per (batch row, head) (tokens x state size) a call runs on the caller
// alone: sharing a 4-token window of 4 x 64 x 64 heads measured no faster (28 vs 31 us), a
// 160-token prefill 1.7x faster.
constexpr int64_t kMinShared = 64 * 1024;

// The inputs both window kernels take: q, k [b, t, hk, dk], v [b, t, hv, dv], g and beta
// [b, t, hv], the state before the window [b, hv, dk, dv], and the outputs o and u [b, t, hv, dv].
struct Window {
  int64_t b, t, hk, dk, hv, dv;
  const float *q, *k, *v, *g, *beta, *s0;
  float *o, *u;
};

// The window's shapes: nullptr, or what is wrong with them.
const char* Check(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k, ffi::Buffer<ffi::F32>& v,
           ffi::Buffer<ffi::F32>& g, ffi::Buffer<ffi::F32>& beta, ffi::Buffer<ffi::F32>& state0,
           ffi::ResultBuffer<ffi::F32>& o, ffi::ResultBuffer<ffi::F32>& u, Window* w) {
  auto qd = q.dimensions();
  auto vd = v.dimensions();
  if (qd.size() != 4 || vd.size() != 4) return "q, k, v must have rank 4";
  const int64_t b = qd[0], t = qd[1], hk = qd[2], dk = qd[3], hv = vd[2], dv = vd[3];
  if (hk <= 0 || hv % hk != 0 || !Dims(k.dimensions(), {b, t, hk, dk}) ||
      !Dims(vd, {b, t, hv, dv}) || !Dims(g.dimensions(), {b, t, hv}) ||
      !Dims(beta.dimensions(), {b, t, hv}) || !Dims(state0.dimensions(), {b, hv, dk, dv}) ||
      !Dims(o->dimensions(), {b, t, hv, dv}) || !Dims(u->dimensions(), {b, t, hv, dv})) {
    return "shapes do not match";
  }
  *w = {b,           t,           hk,
        dk,          hv,          dv,
        q.typed_data(), k.typed_data(), v.typed_data(),
        g.typed_data(), beta.typed_data(), state0.typed_data(),
        o->typed_data(), u->typed_data()};
  return nullptr;
}

// Every (batch row, value head) of the window through Head, shared with helper threads when the
// window is long: a chain (parent null) advancing `final` [b, hv, dk, dv] from the initial state
// (copying each state out when `states` is not null), or a tree keeping every node's state.
void Run(ffi::ThreadPool& pool, int64_t threads, int64_t isa, const Window& w,
         const int32_t* parent, float scale, float* final, float* states) {
  const int64_t ratio = w.hv / w.hk, hs = w.dk * w.dv, t = w.t, hv = w.hv, dk = w.dk, dv = w.dv;
  const TokenFn from = Pick<false>(dv, isa), in_place = Pick<true>(dv, isa);
  auto heads = [=](int64_t u0, int64_t u1) {
    std::vector<float> kv(dv > 0 ? dv : 1);
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t bi = unit / hv, h = unit % hv, kh = h / ratio;
      const int64_t qk0 = (bi * t * w.hk + kh) * dk, v0 = (bi * t * hv + h) * dv;
      const int64_t gb0 = bi * t * hv + h, s0 = (bi * hv + h) * hs;
      float* s = final == nullptr ? nullptr : final + s0;
      Head(t, parent, dk, dv, w.hk * dk, hv * dv, hv, hv * hs, w.q + qk0, w.k + qk0, w.v + v0,
           w.g + gb0, w.beta + gb0, scale, w.s0 + s0, s, w.o + v0, w.u + v0,
           states == nullptr ? nullptr : states + (bi * t * hv + h) * hs, kv.data(), from,
           in_place);
    }
  };
  mtpspec::ParallelFor(pool, threads, w.b * hv, t * hs >= kMinShared, heads);
}

using mtpspec::BadIsa;

ffi::Error GdnWindow(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> g,
                     ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> state0,
                     ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> final_state,
                     ffi::ResultBuffer<ffi::F32> u, ffi::ResultBuffer<ffi::F32> states,
                     float scale, int64_t threads, int64_t isa) {
  Window w;
  const bool keep = states->element_count() != 0;
  const char* bad = BadIsa(isa);
  if (bad != nullptr || (bad = Check(q, k, v, g, beta, state0, o, u, &w)) != nullptr) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_gdn: ") + bad);
  }
  if (!Dims(final_state->dimensions(), {w.b, w.hv, w.dk, w.dv}) ||
      (keep && !Dims(states->dimensions(), {w.b, w.t, w.hv, w.dk, w.dv}))) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_gdn: shapes do not match");
  }
  Run(pool, threads, isa, w, nullptr, scale, final_state->typed_data(),
      keep ? states->typed_data() : nullptr);
  return ffi::Error::Success();
}

// A tree window (speculative tree verification): node r advances from its parent's state
// (parent[r] < 0: the state before the window) with a chain token's arithmetic, and every node's
// state is kept (the commit selects the accepted path's). Nodes come breadth first, parents first.
ffi::Error GdnTree(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta,
                   ffi::Buffer<ffi::F32> state0, ffi::Buffer<ffi::S32> parent,
                   ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> u,
                   ffi::ResultBuffer<ffi::F32> states, float scale, int64_t threads,
                   int64_t isa) {
  Window w;
  const char* bad = BadIsa(isa);
  if (bad != nullptr || (bad = Check(q, k, v, g, beta, state0, o, u, &w)) != nullptr) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_gdn_tree: ") + bad);
  }
  if (!Dims(parent.dimensions(), {w.t}) ||
      !Dims(states->dimensions(), {w.b, w.t, w.hv, w.dk, w.dv})) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_gdn_tree: shapes do not match");
  }
  const int32_t* par = parent.typed_data();
  for (int64_t r = 0; r < w.t; ++r) {
    if (par[r] >= r || (r == 0) != (par[r] < 0)) {
      return ffi::Error::InvalidArgument(
          "mtpspec_cpu_gdn_tree: parents must precede their children, the root (row 0) alone "
          "has none");
    }
  }
  Run(pool, threads, isa, w, par, scale, nullptr, states->typed_data());
  return ffi::Error::Success();
}

// The "replay" commit of a verified window: the state after its first n positions, in closed
// form from what the window kept (k expanded to value heads, u, cumulative log-decays G):
//     S_n = e^{G_n} S_0 + sum_{i < n} e^{G_n - G_i} k_i u_i^T      (G_n = 0 when n = 0)
// one row of S (dv wide) at a time: a scale and n fused multiply-adds. In place of the masked
// batched matmul, its transposes and exp fusions that XLA:CPU compiles the same formula to.
// Given the state the window ended in (`final_state`, not empty), a row that keeps all t
// positions copies it instead: the recurrence's own state, as a plain step would hold it, and
// no arithmetic (a fully accepted draft is the commonest case).
__attribute__((target("avx2,fma"))) void CommitHead(int64_t nn, int64_t dk, int64_t dv,
                                                    int64_t k_stride, int64_t u_stride,
                                                    int64_t g_stride, const float* s0,
                                                    const float* k, const float* u,
                                                    const float* gc, float* out) {
  const float gn = nn > 0 ? gc[(nn - 1) * g_stride] : 0.0f;
  const float decay = std::exp(gn);
  float w[64];
  for (int64_t i = 0; i < nn; ++i) w[i] = std::exp(gn - gc[i * g_stride]);
  for (int64_t r = 0; r < dk; ++r) {
    const float* sr = s0 + r * dv;
    float* o = out + r * dv;
    float c[64];
    for (int64_t i = 0; i < nn; ++i) c[i] = w[i] * k[i * k_stride + r];
    int64_t j = 0;
    const __m256 dec = _mm256_set1_ps(decay);
    for (; j + 8 <= dv; j += 8) {
      __m256 acc = _mm256_mul_ps(dec, _mm256_loadu_ps(sr + j));
      for (int64_t i = 0; i < nn; ++i)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(c[i]), _mm256_loadu_ps(u + i * u_stride + j), acc);
      _mm256_storeu_ps(o + j, acc);
    }
    for (; j < dv; ++j) {
      float acc = decay * sr[j];
      for (int64_t i = 0; i < nn; ++i) acc = std::fma(c[i], u[i * u_stride + j], acc);
      o[j] = acc;
    }
  }
}

ffi::Error GdnCommit(ffi::Buffer<ffi::F32> state0, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::F32> g_cum,
                     ffi::Buffer<ffi::S32> n, ffi::Buffer<ffi::F32> final_state,
                     ffi::ResultBuffer<ffi::F32> out) {
  auto sd = state0.dimensions(), kd = k.dimensions();
  if (sd.size() != 4 || kd.size() != 4) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_gdn_commit: expected state0 [b, h, dk, dv], k [b, t, h, dk]");
  }
  const int64_t b = sd[0], h = sd[1], dk = sd[2], dv = sd[3], t = kd[1];
  const bool has_final = final_state.element_count() != 0;
  if (!Dims(kd, {b, t, h, dk}) || !Dims(u.dimensions(), {b, t, h, dv}) ||
      !Dims(g_cum.dimensions(), {b, t, h}) || !Dims(n.dimensions(), {b}) ||
      !Dims(out->dimensions(), {b, h, dk, dv}) || t > 64 ||
      (has_final && !Dims(final_state.dimensions(), {b, h, dk, dv}))) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_gdn_commit: shapes do not match");
  }
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t nn = std::clamp<int64_t>(n.typed_data()[bi], 0, t);
    const int64_t row = bi * h * dk * dv;
    if (has_final && nn == t) {  // the whole window kept: the state the window ended in
      std::memcpy(out->typed_data() + row, final_state.typed_data() + row,
                  sizeof(float) * h * dk * dv);
      continue;
    }
    for (int64_t hi = 0; hi < h; ++hi) {
      const int64_t hs = (bi * h + hi) * dk * dv;
      CommitHead(nn, dk, dv, h * dk, h * dv, h, state0.typed_data() + hs,
                 k.typed_data() + (bi * t * h + hi) * dk, u.typed_data() + (bi * t * h + hi) * dv,
                 g_cum.typed_data() + bi * t * h + hi, out->typed_data() + hs);
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuGdn, GdnWindow,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // initial state
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o
                                  .Ret<ffi::Buffer<ffi::F32>>()  // final state
                                  .Ret<ffi::Buffer<ffi::F32>>()  // u
                                  .Ret<ffi::Buffer<ffi::F32>>()  // states, or empty
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("isa"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuGdnCommit, GdnCommit,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state before the window
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k, expanded to value heads
                                  .Arg<ffi::Buffer<ffi::F32>>()  // u
                                  .Arg<ffi::Buffer<ffi::F32>>()  // cumulative log-decays
                                  .Arg<ffi::Buffer<ffi::S32>>()  // positions kept
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state after all, or empty
                                  .Ret<ffi::Buffer<ffi::F32>>());  // state after them

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuGdnTree, GdnTree,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state before the root
                                  .Arg<ffi::Buffer<ffi::S32>>()  // parent of every node
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o
                                  .Ret<ffi::Buffer<ffi::F32>>()  // u
                                  .Ret<ffi::Buffer<ffi::F32>>()  // every node's state
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("isa"));
