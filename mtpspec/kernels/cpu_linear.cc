// y = x W for a few rows on CPU, streaming W once: the decode step (1 row) and the speculative
// verify window (k + 1 rows) of mtpspec's inference path, called from XLA through its typed FFI.
//
// W is packed once at load as [tiles, in, 16] float32 or bfloat16: tile j holds output columns 16j..16j+15
// (zero-padded past `out`), row i of a tile is the 16 weights that input i feeds. Each tile is
// read from memory once per call (software-prefetched `prefetch` rows ahead, so the stream
// overlaps the arithmetic of a multi-row window) and re-read from L1/L2 for every further block
// of rows. The row and accumulator-set loops are force-unrolled: left to GCC, the 5- and 6-row
// blocks kept their accumulators in memory (2-3x slower). The `isa` attribute picks the inner
// loop: 0 AVX2 (one tile, two 8-lane halves), 1 AVX-512F (two tiles per pass, so one broadcast
// input feeds two 16-lane FMAs: 1.4-1.7x faster at 4-6 rows with the weights in L2; BUILD_NOTES,
// 2026-12-03). The Python side resolves "auto" with `mtpspec_cpu_linear_avx512()`.
//
// Built by the package's install step (setup.py, optional); loaded with ctypes by
// mtpspec/kernels/library.py, which checks `mtpspec_cpu_linear_supported()` first (the whole library
// needs AVX2 + FMA).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "isa.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" int mtpspec_cpu_linear_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

namespace {

constexpr int64_t kTile = 16;

// Weights are float32 or bfloat16 (uint16: the top half of a float32). A bf16 weight is widened
// exactly (moved into the top half) in registers, so a bf16 tile gives bit for bit what the
// float32 kernel gives on the same weights widened, at half the bytes streamed.
//
// Load16 gives a tile row's 16 weights in two registers. For bf16 it interleaves them with zeros
// (one unpack per 8 weights; unpacking works within 128-bit lanes), so the registers hold
// columns {0-3, 8-11} and {4-7, 12-15}: every column still gets its own lane and the same
// sequence of FMAs, and Store16 puts the lanes back in column order once per output. Widening
// in column order (zero-extend, then shift: 5 instructions per 16 weights instead of 2) left a
// 4-row bf16 window compute-bound, at 0.75 of the 1-row stream rate.
__attribute__((target("avx2,fma"))) inline void Load16(const float* w, __m256& a, __m256& b) {
  a = _mm256_loadu_ps(w);
  b = _mm256_loadu_ps(w + 8);
}
__attribute__((target("avx2,fma"))) inline void Load16(const uint16_t* w, __m256& a, __m256& b) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i zero = _mm256_setzero_si256();
  a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw));  // columns 0-3, 8-11
  b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw));  // columns 4-7, 12-15
}
// The 16 sums of a tile row in column order (Load16's lane order undone for bf16).
template <typename W>
__attribute__((target("avx2,fma"))) inline void Store16(float* out, __m256 a, __m256 b) {
  if constexpr (sizeof(W) == 2) {
    const __m256 lo = _mm256_permute2f128_ps(a, b, 0x20);
    b = _mm256_permute2f128_ps(a, b, 0x31);
    a = lo;
  }
  _mm256_storeu_ps(out, a);
  _mm256_storeu_ps(out + 8, b);
}
// bf16 -> float32 in column order (the prefill's tile widening, ``Widen``).
__attribute__((target("avx2,fma"))) inline void Load16InOrder(const uint16_t* w, __m256& a,
                                                              __m256& b) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
  b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
}
__attribute__((target("avx512f"))) inline __m512 Load16x512(const float* w) {
  return _mm512_loadu_ps(w);
}
__attribute__((target("avx512f"))) inline __m512 Load16x512(const uint16_t* w) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Every output is summed in one order, whatever the number of rows called with it: input i goes
// into accumulator set i mod 4 (four independent FMA chains per column), the last k mod 4 inputs
// into set 0, and the sets are added ((s0 + s1) + s2) + s3. A row's result therefore does not
// depend on the window it is in (a decode step's row equals the same row of a verify window or a
// prefill, bit for bit: speculative greedy cannot flip a near-tie that plain greedy resolved).
// AVX2 has 16 registers: one row keeps all 4 sets in registers (8 accumulators); 2-3 rows take 2
// sets at a time, 4-6 rows one, over chunks of kChunk inputs small enough to stay in L1 while
// every set passes over them, the other sets' sums waiting in a small buffer (loading and storing
// a sum changes no bit).
constexpr int kSets = 4;
constexpr int64_t kChunk = 64;  // inputs per chunk (a multiple of kSets): 1-2 KB of a tile

// Inputs [i0, i1) (multiples of 4 apart) of sets [s0, s0 + G) of R rows (x[r] = x + r * k) of
// one 16-column tile into acc. pf: prefetch that many rows ahead, the G rows this set takes
// (over the 4 / G passes of a chunk, every row).
template <int R, int G, typename W>
__attribute__((target("avx2,fma"), always_inline)) inline void Steps(const float* x, int64_t k,
                                                                      const W* w, int64_t i0,
                                                                      int64_t i1, int s0,
                                                                      __m256 (&acc)[G][R][2],
                                                                      int64_t pf) {
  for (int64_t i = i0; i < i1; i += kSets) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const int64_t at = i + s0 + g;
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(w + (at + pf) * kTile), _MM_HINT_T0);
      __m256 w0, w1;
      Load16(w + at * kTile, w0, w1);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * k + at);
        acc[g][r][0] = _mm256_fmadd_ps(xb, w0, acc[g][r][0]);
        acc[g][r][1] = _mm256_fmadd_ps(xb, w1, acc[g][r][1]);
      }
    }
  }
}

// The last k mod 4 inputs into set 0 (acc[0]).
template <int R, int G, typename W>
__attribute__((target("avx2,fma"), always_inline)) inline void Tail(const float* x, int64_t k,
                                                                     const W* w,
                                                                     __m256 (&acc)[G][R][2]) {
  for (int64_t i = k - k % kSets; i < k; ++i) {
    __m256 w0, w1;
    Load16(w + i * kTile, w0, w1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * k + i);
      acc[0][r][0] = _mm256_fmadd_ps(xb, w0, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(xb, w1, acc[0][r][1]);
    }
  }
}

// R rows of one 16-column tile into out[r * ldo .. + 16), G sets at a time.
template <int R, int G, typename W>
__attribute__((target("avx2,fma"))) inline void TileRows(const float* x, int64_t k, const W* w,
                                                         float* out, int64_t ldo, int64_t pf) {
  static_assert(kSets % G == 0, "G must divide the number of sets");
  const int64_t k4 = k - k % kSets;
  __m256 acc[G][R][2];
  if constexpr (G == kSets) {  // every set in registers: one pass
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[g][r][0] = acc[g][r][1] = _mm256_setzero_ps();
    Steps<R, G, W>(x, k, w, 0, k4, 0, acc, pf);
    Tail<R, G, W>(x, k, w, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 y0 = acc[0][r][0], y1 = acc[0][r][1];
      for (int s = 1; s < kSets; ++s) {
        y0 = _mm256_add_ps(y0, acc[s][r][0]);
        y1 = _mm256_add_ps(y1, acc[s][r][1]);
      }
      Store16<W>(out + r * ldo, y0, y1);
    }
  } else {
    alignas(32) float part[kSets][R][kTile];  // each set's sums (in Load16's lane order)
    const __m256 zero = _mm256_setzero_ps();
    for (int s = 0; s < kSets; ++s)
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(part[s][r], zero);
        _mm256_store_ps(part[s][r] + 8, zero);
      }
    // prefetch two chunks ahead: a chunk's passes take about one memory latency
    const int64_t ahead = pf ? 2 * kChunk : 0;
    for (int64_t c0 = 0; c0 < k4; c0 += kChunk) {
      const int64_t c1 = std::min(c0 + kChunk, k4);
      for (int s0 = 0; s0 < kSets; s0 += G) {
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            acc[g][r][0] = _mm256_load_ps(part[s0 + g][r]);
            acc[g][r][1] = _mm256_load_ps(part[s0 + g][r] + 8);
          }
        Steps<R, G, W>(x, k, w, c0, c1, s0, acc, ahead);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            _mm256_store_ps(part[s0 + g][r], acc[g][r][0]);
            _mm256_store_ps(part[s0 + g][r] + 8, acc[g][r][1]);
          }
      }
    }
    if (k4 < k) {  // the last k mod 4 inputs, into set 0 after all of its others
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[0][r][0] = _mm256_load_ps(part[0][r]);
        acc[0][r][1] = _mm256_load_ps(part[0][r] + 8);
      }
      Tail<R, G, W>(x, k, w, acc);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(part[0][r], acc[0][r][0]);
        _mm256_store_ps(part[0][r] + 8, acc[0][r][1]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256 y0 = _mm256_load_ps(part[0][r]), y1 = _mm256_load_ps(part[0][r] + 8);
      for (int s = 1; s < kSets; ++s) {
        y0 = _mm256_add_ps(y0, _mm256_load_ps(part[s][r]));
        y1 = _mm256_add_ps(y1, _mm256_load_ps(part[s][r] + 8));
      }
      Store16<W>(out + r * ldo, y0, y1);
    }
  }
}

// A block of R rows of one tile, written straight to y or, for the last partial tile, via buf.
template <int R, int S, typename W>
__attribute__((target("avx2,fma"))) inline void Block(const float* x, int64_t k, const void* wv,
                                                      float* y, int64_t n, int64_t c0,
                                                      int64_t width, int64_t pf) {
  const W* wt = static_cast<const W*>(wv);
  if (width == kTile) {
    TileRows<R, S, W>(x, k, wt, y + c0, n, pf);
    return;
  }
  alignas(32) float buf[R * kTile];
  TileRows<R, S, W>(x, k, wt, buf, kTile, pf);
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * n + c0 + c] = buf[r * kTile + c];
}

// The same with AVX-512 (where the CPU has it): a tile's 16 columns are one 512-bit register, and
// P = 2 tiles are taken side by side, so one broadcast input feeds two FMAs (with 32 registers
// the accumulators of 6 rows x 2 tiles still fit). A column's sums are the same whether its tile
// is taken alone or in a pair (same S, same order), so how tiles are paired (by the thread
// chunks) never changes a result.
template <int R, int S, int P, typename W>
__attribute__((target("avx512f"))) inline void TileRows512(const float* x, int64_t k, const W* w,
                                                           float* out, int64_t ldo, int64_t pf) {
  const int64_t stride = k * kTile;  // from one tile to the next
  __m512 acc[S][R][P];
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) acc[s][r][p] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + S <= k; i += S) {
#pragma GCC unroll 8
    for (int s = 0; s < S; ++s) {
      __m512 wv[P];
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) {
        const W* wi = w + p * stride + (i + s) * kTile;
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(wi + pf * kTile), _MM_HINT_T0);
        wv[p] = Load16x512(wi);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * k + i + s]);
#pragma GCC unroll 2
        for (int p = 0; p < P; ++p) acc[s][r][p] = _mm512_fmadd_ps(xb, wv[p], acc[s][r][p]);
      }
    }
  }
  for (; i < k; ++i) {  // the last k mod S inputs, into set 0
    __m512 wv[P];
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) wv[p] = Load16x512(w + p * stride + i * kTile);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * k + i]);
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) acc[0][r][p] = _mm512_fmadd_ps(xb, wv[p], acc[0][r][p]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      __m512 y = acc[0][r][p];
      for (int s = 1; s < S; ++s) y = _mm512_add_ps(y, acc[s][r][p]);
      _mm512_storeu_ps(out + r * ldo + p * kTile, y);
    }
}

// One tile (possibly the partial last one), as Block.
template <int R, int S, typename W>
__attribute__((target("avx512f"))) inline void Block512(const float* x, int64_t k, const void* wv,
                                                        float* y, int64_t n, int64_t c0,
                                                        int64_t width, int64_t pf) {
  const W* wt = static_cast<const W*>(wv);
  if (width == kTile) {
    TileRows512<R, S, 1, W>(x, k, wt, y + c0, n, pf);
    return;
  }
  alignas(64) float buf[R * kTile];
  TileRows512<R, S, 1, W>(x, k, wt, buf, kTile, pf);
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * n + c0 + c] = buf[r * kTile + c];
}

// Two full tiles side by side (same arguments; width is 2 * 16).
template <int R, int S, typename W>
__attribute__((target("avx512f"))) inline void Pair512(const float* x, int64_t k, const void* wv,
                                                       float* y, int64_t n, int64_t c0, int64_t,
                                                       int64_t pf) {
  TileRows512<R, S, 2, W>(x, k, static_cast<const W*>(wv), y + c0, n, pf);
}

// Two full tiles one after the other, for row counts whose accumulators of a pair would not fit
// AVX-512's 32 registers at 4 sets (4-6 rows).
template <int R, typename W>
__attribute__((target("avx512f"))) inline void TwoTiles512(const float* x, int64_t k,
                                                           const void* wv, float* y, int64_t n,
                                                           int64_t c0, int64_t, int64_t pf) {
  const W* wt = static_cast<const W*>(wv);
  TileRows512<R, kSets, 1, W>(x, k, wt, y + c0, n, pf);
  TileRows512<R, kSets, 1, W>(x, k, wt + k * kTile, y + c0 + kTile, n, pf);
}

// The block for each row count 1..6. AVX2: 4 sets in 1, 2 or 4 passes (TileRows); AVX-512: the 4
// sets in registers (4 x 6 rows = 24 of its 32), two tiles side by side up to 3 rows. Every row
// count and both instruction sets sum each output in the same order.
using BlockFn = void (*)(const float*, int64_t, const void*, float*, int64_t, int64_t, int64_t,
                         int64_t);
struct Isa {
  BlockFn blocks[7];  // one tile
  BlockFn pairs[7];   // two full tiles (nullptr: one at a time)
};
template <typename W>
constexpr Isa kIsas[2] = {
    {{nullptr, Block<1, 4, W>, Block<2, 2, W>, Block<3, 2, W>, Block<4, 1, W>, Block<5, 1, W>,
      Block<6, 1, W>},
     {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}},
    {{nullptr, Block512<1, kSets, W>, Block512<2, kSets, W>, Block512<3, kSets, W>,
      Block512<4, kSets, W>, Block512<5, kSets, W>, Block512<6, kSets, W>},
     {nullptr, Pair512<1, kSets, W>, Pair512<2, kSets, W>, Pair512<3, kSets, W>,
      TwoTiles512<4, W>, TwoTiles512<5, W>, TwoTiles512<6, W>}}};

// bf16 tiles are widened once per row block from this many rows on (below, in the inner loop:
// a decode step or verify window streams the weights once and has no arithmetic to spare).
constexpr int64_t kWidenRows = 12;

// count bf16 values (uint16 bit patterns) -> float32, exactly; count is a multiple of 16.
__attribute__((target("avx2,fma"))) inline void Widen(const uint16_t* w, int64_t count,
                                                      float* out) {
  for (int64_t i = 0; i < count; i += 16) {
    __m256 a, b;
    Load16InOrder(w + i, a, b);
    _mm256_storeu_ps(out + i, a);
    _mm256_storeu_ps(out + i + 8, b);
  }
}
inline void Widen(const float*, int64_t, float*) {}  // float32 weights are never widened

// Rows [r0, r0 + rows) of output columns [16 t0, 16 t1): rows in blocks of 6, then one block of
// the 1-5 left over, so a window of up to 6 rows reads each tile once. A row's accumulation order
// depends on the size of the block it falls in (as in any blocked GEMM). Only the first block of a
// tile prefetches (the later ones find the tile in L1). With AVX-512, full tiles go two at a time.
// `wide` (bf16 weights, many rows): each tile is widened to float32 once into `buf` and every
// block runs the float32 loop on it, instead of widening in every block's inner loop (the
// conversion cost the bf16 kernel ~40 % of a 512-row prefill's products); the widening is exact,
// so the result is bit for bit the same.
template <typename W>
void RowTiles(const Isa& isa, const Isa* wide, float* buf, const float* x, int64_t rows, int64_t k,
              const W* w, int64_t n, float* y, int64_t t0, int64_t t1, int64_t pf) {
  for (int64_t t = t0; t < t1;) {
    const W* wt = w + t * k * kTile;
    const int64_t c0 = t * kTile;
    const int64_t width = n - c0 < kTile ? n - c0 : kTile;
    const bool pair = isa.pairs[1] != nullptr && t + 1 < t1 && c0 + 2 * kTile <= n;
    const Isa& use = wide != nullptr ? *wide : isa;
    const BlockFn* fns = pair ? use.pairs : use.blocks;
    const void* tile = wt;
    int64_t tile_pf = pf;
    if (wide != nullptr) {
      Widen(wt, (pair ? 2 : 1) * k * kTile, buf);
      tile = buf;
      tile_pf = 0;
    }
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) {
      fns[6](x + r * k, k, tile, y + r * n, n, c0, width, r == 0 ? tile_pf : 0);
    }
    if (r < rows) fns[rows - r](x + r * k, k, tile, y + r * n, n, c0, width, r == 0 ? tile_pf : 0);
    t += pair ? 2 : 1;
  }
}

// Rows are taken kRowBlock at a time (a prefill's rows stay in L2 while every tile streams past
// them; a decode step or verify window is one block).
constexpr int64_t kRowBlock = 60;  // a multiple of 6
template <typename W>
void Tiles(const Isa& isa, const Isa& f32, const float* x, int64_t rows, int64_t k, const W* w,
           int64_t n, float* y, int64_t t0, int64_t t1, int64_t pf) {
  const bool widen = sizeof(W) == 2 && rows >= kWidenRows;
  thread_local std::vector<float> buf;
  if (widen && buf.size() < static_cast<size_t>(2 * k * kTile)) buf.resize(2 * k * kTile);
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t rn = std::min(kRowBlock, rows - r0);
    const Isa* wide = widen && rn >= kWidenRows ? &f32 : nullptr;
    RowTiles(isa, wide, buf.data(), x + r0 * k, rn, k, w, n, y + r0 * n, t0, t1, pf);
  }
}

// Below this many multiply-adds a call runs on the caller alone (a hand-off costs ~1 us).
constexpr int64_t kMinShared = 32 * 1024;

// W: float (F32 weights) or uint16_t (BF16 weights).
template <ffi::DataType T, typename W>
ffi::Error Linear(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                  ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t pf, int64_t isa) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto yd = y->dimensions();
  if (xd.size() < 2 || wd.size() != 3 || yd.size() != 2) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_linear: expected x [rows, in] (or [rows, "
                                       "..., in] split in heads), w [tiles, in, 16], y [rows, out]");
  }
  int64_t k = 1;  // x's trailing dimensions together are the input width
  for (size_t i = 1; i < xd.size(); ++i) k *= xd[i];
  const int64_t rows = xd[0], tiles = wd[0], n = yd[1];
  if (wd[1] != k || wd[2] != kTile || yd[0] != rows || tiles != (n + kTile - 1) / kTile) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_linear: shapes do not match");
  }
  if (const char* bad = mtpspec::BadIsa(isa)) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_linear: ") + bad);
  }
  const Isa& set = kIsas<W>[isa];
  const Isa& f32 = kIsas<float>[isa];
  const float* xp = x.typed_data();
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  float* yp = y->typed_data();
  // Units are pairs of tiles, so AVX-512's pairs stay whole in every chunk; 4 chunks a thread.
  mtpspec::ParallelFor(pool, threads, (tiles + 1) / 2, tiles >= 2 && rows * k * n >= kMinShared,
                       4, [&](int64_t u0, int64_t u1) {
                         Tiles(set, f32, xp, rows, k, wp, n, yp, 2 * u0, std::min(tiles, 2 * u1),
                               pf);
                       });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuLinear, (Linear<ffi::F32, float>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("prefetch")
                                  .Attr<int64_t>("isa"));

// The same over bfloat16 weights packed the same way ([tiles, in, 16] bf16), held as uint16 bit
// patterns (XLA:CPU widens a whole bf16 operand to f32 for a gather; see cpu_linear.py).
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuLinearBf16, (Linear<ffi::U16, uint16_t>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads")
                                  .Attr<int64_t>("prefetch")
                                  .Attr<int64_t>("isa"));

extern "C" int mtpspec_cpu_linear_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The interface version of the whole library (its FFI targets' arguments and attributes):
// library.py refuses a library built from other sources (a stale build after the sources
// changed) instead of failing at the first call. Bump with any target's signature.
extern "C" int mtpspec_cpu_kernels_abi() { return 7; }
