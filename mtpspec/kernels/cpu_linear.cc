// y = x W for a few rows on CPU, streaming W once: the decode step (1 row) and the speculative
// verify window (k + 1 rows) of mtpspec's inference path, called from XLA through its typed FFI.
//
// W is packed once at load as [groups, in, 128] float32 or bfloat16 ([groups, in, 64] when packed
// under AVX2, whose registers hold 4 tiles of a row; either width runs on either instruction set
// with the same bits): group g holds output columns 128g..128g+127 (zero-padded past `out`),
// row i of a group is the 128 weights that input i feeds,
// and a group is 8 tiles of 16 columns side by side (tile j is columns 16j..16j+15, at offset
// 16 (j mod 8) of its group's rows). So a decode step's 8 tiles side by side read one contiguous
// stream (a row of a group after the other) instead of 8 streams, one per tile: a real-size
// decode step ~20 % faster on a 2-core EPYC (BUILD_NOTES 2026-12-07). Each weight is read from
// memory once per call (software-prefetched `prefetch` group rows ahead, so the stream overlaps
// the arithmetic of a multi-row window) and re-read from cache for every further pass over it
// (RowTiles). Every output is one FMA chain over the inputs in order, so a row's value does not
// depend on how many rows the call has (see TileRows). The row and tile loops are force-unrolled:
// left to GCC, the 5- and 6-row blocks kept their accumulators in memory (2-3x slower). The `isa`
// attribute picks the inner loop: 0 AVX2 (16 columns in two 8-lane halves, up to 4 tiles side by
// side), 1 AVX-512F (a tile per register, up to 8 tiles side by side, so one broadcast input
// feeds several 16-lane FMAs; see kIsas). The Python side resolves "auto" with
// `mtpspec_cpu_linear_avx512()`.
//
// Built by the package's install step (setup.py, optional); loaded with ctypes by
// mtpspec/kernels/library.py, which checks `mtpspec_cpu_linear_supported()` first (the whole library
// needs AVX2 + FMA).

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// Whether this CPU has the AVX-512 BF16 dot product (`vdpbf16ps`) the bfloat16-activation path
// (`dot`, below) needs, with the AVX-512BW/VL it is compiled with.
extern "C" int mtpspec_cpu_linear_bf16_dot() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

namespace {

constexpr int64_t kTile = 16;   // output columns a register (AVX-512) or two (AVX2) holds
constexpr int64_t kGroup = 8;   // tiles per packed row at most (AVX-512's; AVX2's 4)
constexpr int64_t kLd = kTile * kGroup;  // columns per packed row at most

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
// int8 (the opt-in per-column quantised storage): 16 weights sign-extended and converted to
// float32, exactly (every int8 is a float32), in column order.
__attribute__((target("avx2,fma"))) inline void Load16(const int8_t* w, __m256& a, __m256& b) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
  b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)));
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

__attribute__((target("avx512f"))) inline __m512 Load16x512(const int8_t* w) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}

// Every output is one FMA chain over the inputs in order (i = 0, 1, ..., in - 1), whatever the
// number of rows it is called with and on either instruction set, so a row of a verify window or
// a prefill is bit for bit the same row computed alone by a decode step (speculative greedy
// cannot flip a near-tie that plain greedy resolved the other way). The independent chains that
// hide the FMA latency come from P tiles taken side by side (P x 16 columns, each its own chain),
// not from splitting an output's inputs into several partial sums, which made a row's sum depend
// on how many rows shared its registers. (Sets and tiles hide latency alike: R rows x P tiles
// take max(4 / P, R) cycles per tile and input, as R rows x S sets did with max(4 / S, R).)
//
// R rows (x[r] = x + r * k) of P tiles over inputs [i0, i1) (input i's weights of tile p at
// w + (i - i0) * ld + 16 p: w points at input i0's) into out[r * ldo + 16 p .. + 16): from zero
// when i0 == 0, else continuing the partial sums out holds (a float32 store and load change no
// value, so a chain split into input chunks is the same chain; only the prefill's widened float32
// chunks continue, so bf16 weights always start at input 0 and Load16's lane order needs no
// undoing). pf > 0: prefetch `pfb` bytes of the weight row pf rows ahead.
template <int R, int P, typename W>
__attribute__((target("avx2,fma"))) inline void TileRows(const float* x, int64_t k, int64_t i0,
                                                         int64_t i1, const W* w, int64_t ld,
                                                         float* out, int64_t ldo, int64_t pf,
                                                         int64_t pfb) {
  __m256 acc[R][P][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      if (i0 == 0) {
        acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
      } else {
        acc[r][p][0] = _mm256_loadu_ps(out + r * ldo + p * kTile);
        acc[r][p][1] = _mm256_loadu_ps(out + r * ldo + p * kTile + 8);
      }
    }
  for (int64_t i = i0; i < i1; ++i) {
    if (pf) {
      const char* ahead = reinterpret_cast<const char*>(w + (i - i0 + pf) * ld);
      for (int64_t b = 0; b < pfb; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      // Where the accumulators, a tile's two weight vectors and R broadcast inputs kept for the
      // next tile would not fit 16 registers (3 rows x 2 tiles), GCC spilled two accumulators;
      // an empty asm with a memory clobber makes it broadcast the inputs again (a cheap load).
      if constexpr (2 * R * P + R + 2 > 16) asm volatile("" ::: "memory");
      const W* wi = w + (i - i0) * ld + p * kTile;
      __m256 w0, w1;
      Load16(wi, w0, w1);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * k + i);
        acc[r][p][0] = _mm256_fmadd_ps(xb, w0, acc[r][p][0]);
        acc[r][p][1] = _mm256_fmadd_ps(xb, w1, acc[r][p][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) Store16<W>(out + r * ldo + p * kTile, acc[r][p][0], acc[r][p][1]);
}

// R rows of P tiles, written straight to y or, for one partial last tile (P = 1, width < 16:
// called for all inputs at once), via buf.
template <int R, int P, typename W>
__attribute__((target("avx2,fma"))) inline void Block(const float* x, int64_t k, int64_t i0,
                                                      int64_t i1, const void* wv, int64_t ld,
                                                      float* y, int64_t n, int64_t c0,
                                                      int64_t width, int64_t pf, int64_t pfb) {
  const W* wt = static_cast<const W*>(wv);
  if (P > 1 || width == kTile) {
    TileRows<R, P, W>(x, k, i0, i1, wt, ld, y + c0, n, pf, pfb);
    return;
  }
  alignas(32) float buf[R * kTile];
  TileRows<R, 1, W>(x, k, 0, k, wt, ld, buf, kTile, pf, pfb);
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * n + c0 + c] = buf[r * kTile + c];
}

// The same with AVX-512 (where the CPU has it): a tile's 16 columns are one 512-bit register;
// with 32 registers more tiles go side by side (one broadcast input feeds P FMAs).
//
// bf16 tiles go in pairs: one 64-byte load holds a pair's 32 weights of an input, and two
// instructions widen them (a shift left by 16 gives the even columns, a mask the odd ones)
// where widening each tile in column order takes a zero-extension and a shift per tile. So a
// pair's accumulators hold its even and its odd columns; every column keeps its own lane and its
// own FMA chain, and PairOut puts the columns back in order once per output. (Like Load16's, the
// pairs' lane order is never continued: only the prefill's widened float32 chunks continue a
// sum, so bf16 weights always start at input 0.)
__attribute__((target("avx512f"))) inline void PairOut(float* out, __m512 even, __m512 odd) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  _mm512_storeu_ps(out, _mm512_permutex2var_ps(even, lo, odd));
  _mm512_storeu_ps(out + kTile, _mm512_permutex2var_ps(even, hi, odd));
}
// Tile p's weights of one input (w: the input's row): for bf16 pairs (Paired), tile p of the
// pair's even (p even) or odd (p odd) columns.
template <bool Paired, typename W>
__attribute__((target("avx512f"))) inline void LoadTiles512(const W* w, int p, __m512* wv) {
  if constexpr (Paired) {
    const __m512i raw = _mm512_loadu_si512(w + p * kTile);
    wv[0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    wv[1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(-65536)));
  } else {
    wv[0] = Load16x512(w + p * kTile);
  }
}

// Two loop orders, by registers (32): R P accumulators plus, loading a set's P weights first
// and broadcasting each row's input once (R P + P + 1 registers: 1-2 x 8, 1-6 x 4), or,
// where those would not fit (3 x 8), broadcasting the R inputs first and loading the weights a
// tile (pair) at a time (R P + R + 2).
template <int R, int P, typename W>
__attribute__((target("avx512f"))) inline void TileRows512(const float* x, int64_t k, int64_t i0,
                                                           int64_t i1, const W* w, int64_t ld,
                                                           float* out, int64_t ldo, int64_t pf,
                                                           int64_t pfb) {
  constexpr bool kPaired = sizeof(W) == 2 && P % 2 == 0;
  constexpr int kStep = kPaired ? 2 : 1;  // tiles a load gives
  constexpr bool kWeightsFirst = R * P + P + 1 <= 32;
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; p += kStep) {
      if (i0 == 0 || kPaired) {  // bf16 (paired) weights always start at input 0
        acc[r][p] = _mm512_setzero_ps();
        if constexpr (kPaired) acc[r][p + 1] = _mm512_setzero_ps();
      } else {
        acc[r][p] = _mm512_loadu_ps(out + r * ldo + p * kTile);
      }
    }
  for (int64_t i = i0; i < i1; ++i) {
    if (pf) {
      const char* ahead = reinterpret_cast<const char*>(w + (i - i0 + pf) * ld);
      for (int64_t b = 0; b < pfb; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    const W* wi = w + (i - i0) * ld;
    if constexpr (kWeightsFirst) {
      __m512 wv[P];
#pragma GCC unroll 8
      for (int p = 0; p < P; p += kStep) LoadTiles512<kPaired>(wi, p, wv + p);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 xb = _mm512_set1_ps(x[r * k + i]);
#pragma GCC unroll 8
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(xb, wv[p], acc[r][p]);
      }
    } else {
      __m512 xb[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) xb[r] = _mm512_set1_ps(x[r * k + i]);
#pragma GCC unroll 8
      for (int p = 0; p < P; p += kStep) {
        __m512 wv[kStep];
        LoadTiles512<kPaired>(wi, p, wv);
#pragma GCC unroll 8
        for (int q = 0; q < kStep; ++q)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][p + q] = _mm512_fmadd_ps(xb[r], wv[q], acc[r][p + q]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; p += kStep) {
      if constexpr (kPaired) {
        PairOut(out + r * ldo + p * kTile, acc[r][p], acc[r][p + 1]);
      } else {
        _mm512_storeu_ps(out + r * ldo + p * kTile, acc[r][p]);
      }
    }
}

template <int R, int P, typename W>
__attribute__((target("avx512f"))) inline void Block512(const float* x, int64_t k, int64_t i0,
                                                        int64_t i1, const void* wv, int64_t ld,
                                                        float* y, int64_t n, int64_t c0,
                                                        int64_t width, int64_t pf, int64_t pfb) {
  const W* wt = static_cast<const W*>(wv);
  if (P > 1 || width == kTile) {
    TileRows512<R, P, W>(x, k, i0, i1, wt, ld, y + c0, n, pf, pfb);
    return;
  }
  alignas(64) float buf[R * kTile];
  TileRows512<R, 1, W>(x, k, 0, k, wt, ld, buf, kTile, pf, pfb);
  for (int r = 0; r < R; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * n + c0 + c] = buf[r * kTile + c];
}

// For R = 1..6 rows, the blocks of 1, 2, 4 and 8 tiles side by side (fns[R][log2 P]; nullptr
// past most[R]), most[R] chosen so the accumulators fit the registers with at least 8 chains:
// AVX2 (16 registers, 2 per tile and row) 1 row x 4 tiles, 2-3 rows x 2, 4-6 rows x 1; AVX-512
// (32 registers, 1 per tile and row, plus P weights and a broadcast, R P + P + 1 <= 32, or R
// broadcasts and a pair's weights, R P + R + 2) 1-3 rows x 8, 4-6 rows x 4. A column's value is
// the same in any of them.
using BlockFn = void (*)(const float*, int64_t, int64_t, int64_t, const void*, int64_t, float*,
                         int64_t, int64_t, int64_t, int64_t, int64_t);
struct Isa {
  BlockFn fns[7][4];
  int most[7];  // log2 of the most tiles side by side for R rows
  int64_t block;  // rows a block of a window (up to 6 rows) takes at most
};
template <typename W>
constexpr Isa kIsas[2] = {
    {{{},
      {Block<1, 1, W>, Block<1, 2, W>, Block<1, 4, W>},
      {Block<2, 1, W>, Block<2, 2, W>},
      {Block<3, 1, W>, Block<3, 2, W>},
      {Block<4, 1, W>},
      {Block<5, 1, W>},
      {Block<6, 1, W>}},
     {0, 2, 1, 1, 0, 0, 0},
     6},
    {{{},
      {Block512<1, 1, W>, Block512<1, 2, W>, Block512<1, 4, W>, Block512<1, 8, W>},
      {Block512<2, 1, W>, Block512<2, 2, W>, Block512<2, 4, W>, Block512<2, 8, W>},
      {Block512<3, 1, W>, Block512<3, 2, W>, Block512<3, 4, W>, Block512<3, 8, W>},
      {Block512<4, 1, W>, Block512<4, 2, W>, Block512<4, 4, W>},
      {Block512<5, 1, W>, Block512<5, 2, W>, Block512<5, 4, W>},
      {Block512<6, 1, W>, Block512<6, 2, W>, Block512<6, 4, W>}},
     {0, 3, 3, 3, 2, 2, 2},
     3}};

// bf16 weights are widened once per input chunk from this many rows on (below, in the inner loop:
// a decode step or verify window streams the weights once and has no arithmetic to spare).
constexpr int64_t kWidenRows = 12;

// Inputs per chunk of a prefill's widened set of tiles (128 rows of 128 float32 weights: 64 KB,
// in L2 while every row block passes over it; with 252-row blocks, 128 inputs measured ~4 %
// faster than 64 and 32 ~7 % slower, BUILD_NOTES 2026-12-07). A decode step or verify window
// runs each pass over all inputs at once: chunking those (partial sums stored and reloaded
// between chunks) made a 3-6-row window ~25 % slower.
constexpr int64_t kChunk = 128;

// The `width` columns from w (a multiple of 16) of inputs [i0, i1), ld apart, bf16 (uint16 bit
// patterns) -> float32 rows of `width` from out, exactly.
__attribute__((target("avx2,fma"))) inline void Widen(const uint16_t* w, int64_t i0, int64_t i1,
                                                      int64_t ld, int64_t width, float* out) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < width; j += 16) {
      __m256 a, b;
      Load16InOrder(w + i * ld + j, a, b);
      _mm256_storeu_ps(out + (i - i0) * width + j, a);
      _mm256_storeu_ps(out + (i - i0) * width + j + 8, b);
    }
  }
}
inline void Widen(const float*, int64_t, int64_t, int64_t, int64_t, float*) {}  // never widened
// int8 -> float32 (the values q, exactly; the column scales come after the sums, ``Scale``).
__attribute__((target("avx2,fma"))) inline void Widen(const int8_t* w, int64_t i0, int64_t i1,
                                                      int64_t ld, int64_t width, float* out) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < width; j += 16) {
      __m256 a, b;
      Load16(w + i * ld + j, a, b);  // column order
      _mm256_storeu_ps(out + (i - i0) * width + j, a);
      _mm256_storeu_ps(out + (i - i0) * width + j + 8, b);
    }
  }
}

// Rows [r0, r0 + rows) of output columns [16 t0, 16 t1) (t0 a multiple of the 2^lg tiles of a
// packed row). Tiles go in sets of S side by side: a whole packed row (8 or 4) where the range has
// it, narrower at its end (a power of two; it only ever narrows, so a set never crosses a group)
// and 1 for the partial last tile. Rows go in blocks of 6, then one block of the 1-5 left over,
// each block taking as many of the set's tiles side by side as its registers allow (Isa::most); a
// window of up to 6 rows goes in blocks of Isa::block (AVX-512: 3, so a 4-6-row window takes 8
// tiles a pass in its 3-row blocks: a 4-row window ~14 % faster than one 4-row block of 4 tiles in
// two passes; a 512-row prefill's widened sets were ~40 % slower in 3-row blocks). One block
// covering the set (1-3 rows on AVX-512) streams it in one pass; otherwise the first pass
// prefetches the set's whole rows ahead, so the later passes (the set's other tiles, further row
// blocks) find them in L2 and a window of up to 6 rows reads every weight from memory once, in the
// order it is stored. `wide` (bf16 weights, many rows): the set is widened to float32 128 inputs at
// a time (kChunk) into `buf` and every block runs the float32 loop over that chunk, continuing its
// partial sums, instead of widening in every block's inner loop (the conversion cost the bf16
// kernel ~40 % of a 512-row prefill's products); the widening is exact and a sum split into chunks
// is the same chain, so the result is bit for bit the same.
template <typename W>
void RowTiles(const Isa& isa, const Isa* wide, float* buf, const float* x, int64_t rows, int64_t k,
              const W* w, int64_t kg, int64_t lg, int64_t n, float* y, int64_t t0, int64_t t1,
              int64_t pf) {
  const int64_t g = int64_t{1} << lg, ldw = g * kTile;  // tiles per packed row, its stride
  const int64_t full_tiles = n / kTile;
  for (int64_t t = t0; t < t1;) {
    const int64_t c0 = t * kTile;
    const int64_t full = std::min(t1, full_tiles) - t;  // full tiles from t in this range
    int ls = static_cast<int>(lg);
    while (ls > 0 && (int64_t{1} << ls) > full) --ls;
    const int64_t set = int64_t{1} << ls;
    const int64_t width = full > 0 ? set * kTile : n - c0;  // < 16: the partial last tile
    const W* wt = w + (t / g) * kg * ldw + (t % g) * kTile;
    // the partial last tile is not widened (one tile; Block runs it over all inputs at once)
    const bool widen = wide != nullptr && width >= kTile;
    const Isa& use = widen ? *wide : isa;
    const int64_t lead = rows <= 6 ? std::min<int64_t>(rows, use.block) : 6;
    const int64_t rest = rows % lead == 0 ? 0 : rows % lead;  // the last block's
    const int ll = std::min(ls, use.most[lead]);
    const int lr = std::min(ls, use.most[rest]);
    // one partial tile: one pass per row block, all inputs at once (Block's buffer holds it)
    const int64_t chunk = widen ? kChunk : k;
    const int64_t row_bytes = width * sizeof(W);  // the set's share of a weight row
    for (int64_t i0 = 0; i0 < k; i0 += chunk) {
      const int64_t i1 = std::min(k, i0 + chunk);
      const void* tile = wt + i0 * ldw;  // input i0's weights
      int64_t ld = ldw, tile_pf = pf;
      if (widen) {
        Widen(wt, i0, i1, ldw, set * kTile, buf);
        tile = buf;
        ld = set * kTile;
        tile_pf = 0;
      }
      bool first = true;  // the first pass prefetches the set's whole rows
      auto pass = [&](int64_t r, int64_t rn, int lg) {
        const int64_t step = int64_t{1} << lg;
        const int64_t step_width = width < kTile ? width : step * kTile;
        const int64_t elem = widen ? sizeof(float) : sizeof(W);
        for (int64_t s = 0; s < set; s += step) {
          const char* at = static_cast<const char*>(tile) + s * kTile * elem;
          use.fns[rn][lg](x + r * k, k, i0, i1, at, ld, y + r * n, n, c0 + s * kTile, step_width,
                          first ? tile_pf : 0, row_bytes);
          first = false;
        }
      };
      int64_t r = 0;
      for (; r + lead <= rows; r += lead) pass(r, lead, ll);
      if (rest > 0) pass(r, rest, lr);
    }
    t += set;
  }
}

// Rows are taken kRowBlock at a time (a prefill's rows stay in L2 while every tile streams past
// them; a decode step or verify window is one block). Each block widens and reads every weight
// once: 252 rows measured ~8 % faster than 60 on a 512-row prefill's products, and as fast as
// all 512 at once.
constexpr int64_t kRowBlock = 252;  // a multiple of 6
template <typename W>
void Tiles(const Isa& isa, const Isa& f32, const float* x, int64_t rows, int64_t k, const W* w,
           int64_t kg, int64_t lg, int64_t n, float* y, int64_t t0, int64_t t1, int64_t pf) {
  const bool widen = sizeof(W) < sizeof(float) && rows >= kWidenRows;  // bf16 or int8
  thread_local std::vector<float> buf;  // a chunk of a set of tiles, widened
  const size_t need = static_cast<size_t>(kChunk * kLd);
  if (widen && buf.size() < need) buf.resize(need);
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t rn = std::min(kRowBlock, rows - r0);
    const Isa* wide = widen && rn >= kWidenRows ? &f32 : nullptr;
    RowTiles(isa, wide, buf.data(), x + r0 * k, rn, k, w, kg, lg, n, y + r0 * n, t0, t1, pf);
  }
}

// ---- bfloat16 activations (opt-in: the `dot` attribute; a prefill's linears only) -------------
//
// y = bf16(x) W with float32 sums through AVX-512 BF16's `vdpbf16ps`, which multiplies pairs of
// bf16 values and adds both products to a float32 lane: twice the multiply-adds of a float32 FMA
// per instruction, what llama.cpp's bf16 matrices use. x is rounded to bf16 (to nearest, ties to
// even) once per call; W's bf16 values are used as stored. Each output is one chain over its
// inputs in pairs (i, i + 1), in order, whatever block its row is in, so a row's value does not
// depend on the call's row count — but it is not the float32 path's value (the activations lose
// their low 16 bits), so decoding uses it only where asked (KernelSettings.prefill_activations)
// and only for the prompt's forward: a decode step or verify window always runs float32.
//
// The pairs' layout: a chunk of a set of tiles is interleaved into `buf` as 32-bit lanes, lane c
// of pair j holding W[2j][c] (low half) and W[2j + 1][c] (high half), the layout `vdpbf16ps`
// reads, and x's bf16 row read two inputs at a time is the matching broadcast (little-endian:
// x[2j] in the low half). An odd input count gets a zero input and zero weights at its end.
constexpr int64_t kDotChunk = 512;  // inputs per interleaved chunk (256 pairs x 64 x 4 B: 64 KB)

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void RoundRows(
    const float* x, int64_t rows, int64_t k, int64_t kp, uint16_t* xb) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    uint16_t* out = xb + r * kp;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(xr + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<const __m256i&>(v));
    }
    if (i < k) {
      const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, xr + i));
      _mm256_mask_storeu_epi16(out + i, m, reinterpret_cast<const __m256i&>(v));
    }
    if (kp > k) out[k] = 0;
  }
}

// Inputs [i0, i1) (i0 even) of `width` columns (a multiple of 16) from w, ld apart, into pairs:
// out[(i - i0) / 2 * width + c] = W[i][c] | W[i + 1][c] << 16 (a zero past input k - 1).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void Interleave(
    const uint16_t* w, int64_t i0, int64_t i1, int64_t k, int64_t ld, int64_t width,
    uint32_t* out) {
  for (int64_t i = i0; i < i1; i += 2) {
    const uint16_t* a = w + i * ld;
    const bool odd_end = i + 1 >= k;
    uint32_t* o = out + (i - i0) / 2 * width;
    for (int64_t j = 0; j < width; j += 16) {
      const __m512i lo =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j)));
      __m512i hi = _mm512_setzero_si512();
      if (!odd_end) {
        hi = _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + ld + j))),
            16);
      }
      _mm512_storeu_si512(o + j, _mm512_or_si512(lo, hi));
    }
  }
}

// R rows x P tiles over pairs [j0, j1) of the interleaved chunk w (pair j0's row; ld lanes per
// pair), into out[r * ldo + 16 p ..]: from zero when j0 == 0, else continuing out's partial sums
// (a float32 store and load change no value). xb: the rows' bf16 inputs, kp apart.
template <int R, int P>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void DotRows(
    const uint16_t* xb, int64_t kp, int64_t j0, int64_t j1, const uint32_t* w, int64_t ld,
    float* out, int64_t ldo) {
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p)
      acc[r][p] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out + r * ldo + p * kTile);
  for (int64_t j = j0; j < j1; ++j) {
    const uint32_t* wj = w + (j - j0) * ld;
    __m512i wv[P];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_si512(wj + p * kTile);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, xb + r * kp + 2 * j, sizeof(pair));
      const __m512i xv = _mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p)
        acc[r][p] = _mm512_dpbf16_ps(acc[r][p], reinterpret_cast<const __m512bh&>(xv),
                                     reinterpret_cast<const __m512bh&>(wv[p]));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * ldo + p * kTile, acc[r][p]);
}

using DotFn = void (*)(const uint16_t*, int64_t, int64_t, int64_t, const uint32_t*, int64_t,
                       float*, int64_t);
// [R][log2 P] for R = 1..6 rows and 1, 2 or 4 tiles (6 x 4: 24 accumulators + 4 weights + 1).
constexpr DotFn kDot[7][3] = {
    {},
    {DotRows<1, 1>, DotRows<1, 2>, DotRows<1, 4>},
    {DotRows<2, 1>, DotRows<2, 2>, DotRows<2, 4>},
    {DotRows<3, 1>, DotRows<3, 2>, DotRows<3, 4>},
    {DotRows<4, 1>, DotRows<4, 2>, DotRows<4, 4>},
    {DotRows<5, 1>, DotRows<5, 2>, DotRows<5, 4>},
    {DotRows<6, 1>, DotRows<6, 2>, DotRows<6, 4>}};

// Tiles [t0, t1) of every row (xb: x rounded, rows x kp) in sets of up to 4 tiles (4, 2, 1: a set
// never crosses a packed row's group), each set's weights interleaved kDotChunk inputs at a time
// and every block of 6 rows (then the 1-5 left) run over the chunk. A set holding columns past n
// (the zero padding of the last group) is summed into `tmp` and its real columns copied out.
void DotTiles(const uint16_t* xb, int64_t rows, int64_t k, int64_t kp, const uint16_t* w,
              int64_t lg, int64_t n, float* y, int64_t t0, int64_t t1) {
  const int64_t g = int64_t{1} << lg, ldw = g * kTile;
  thread_local std::vector<uint32_t> buf;
  thread_local std::vector<float> tmp;
  const size_t need = static_cast<size_t>(kDotChunk / 2 * 4 * kTile);
  if (buf.size() < need) buf.resize(need);
  for (int64_t t = t0; t < t1;) {
    int ls = 2;
    while (ls > 0 && (t % (int64_t{1} << ls) != 0 || t + (int64_t{1} << ls) > t1)) --ls;
    const int64_t set = int64_t{1} << ls, c0 = t * kTile, width = set * kTile;
    const bool padded = c0 + width > n;
    float* dst = y + c0;
    int64_t ldo = n;
    if (padded) {
      tmp.assign(static_cast<size_t>(rows * width), 0.0f);
      dst = tmp.data();
      ldo = width;
    }
    const uint16_t* wt = w + (t / g) * k * ldw + (t % g) * kTile;
    for (int64_t i0 = 0; i0 < k; i0 += kDotChunk) {
      const int64_t i1 = std::min(k, i0 + kDotChunk);
      Interleave(wt, i0, i1, k, ldw, width, buf.data());
      const int64_t j0 = i0 / 2, j1 = (i1 + 1) / 2;
      int64_t r = 0;
      for (; r + 6 <= rows; r += 6)
        kDot[6][ls](xb + r * kp, kp, j0, j1, buf.data(), width, dst + r * ldo, ldo);
      if (r < rows) {
        kDot[rows - r][ls](xb + r * kp, kp, j0, j1, buf.data(), width, dst + r * ldo, ldo);
      }
    }
    if (padded) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < n - c0; ++c) y[r * n + c0 + c] = tmp[r * width + c];
    }
    t += set;
  }
}

// Below this many multiply-adds a call runs on the caller alone (a hand-off costs ~1 us).
constexpr int64_t kMinShared = 32 * 1024;

// int8 weights (W = int8_t) carry their per-column scales in each group's 4 rows after its `in`
// rows: row in + b, column c holds byte b (little-endian) of column c's float32 scale, so a column
// read down the rows (a tied embedding's row, a draft vocabulary's column) carries its own scale.
// Column c's output is its float32 FMA chain
// over the int8 values (exact in float32, so the chain is the float32 kernel's on those values),
// then one multiply by the column's scale: a row's value is still the same in any block.
template <typename W>
constexpr int64_t kScaleRows = sizeof(W) == 1 ? 4 : 0;

// Columns [c0, c1) (within one group) of an int8 weight's scales into sc[0 .. c1 - c0).
// 16 columns at a time: the 4 byte rows interleaved (bytes, then byte pairs) into 16 floats.
__attribute__((target("avx2,fma"))) inline void ColumnScales(const int8_t* w, int64_t kg,
                                                             int64_t k, int64_t lg, int64_t c0,
                                                             int64_t c1, float* sc) {
  const int64_t ldw = (int64_t{1} << lg) * kTile;
  const int64_t g = c0 / ldw;
  const int8_t* sb = w + g * kg * ldw + k * ldw - g * ldw;  // + c: column c's byte 0
  int64_t c = c0;
  for (; c + 16 <= c1; c += 16) {
    __m128i b[4];
    for (int i = 0; i < 4; ++i) b[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + c + i * ldw));
    const __m128i lo01 = _mm_unpacklo_epi8(b[0], b[1]), hi01 = _mm_unpackhi_epi8(b[0], b[1]);
    const __m128i lo23 = _mm_unpacklo_epi8(b[2], b[3]), hi23 = _mm_unpackhi_epi8(b[2], b[3]);
    float* out = sc + (c - c0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_unpacklo_epi16(lo01, lo23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), _mm_unpackhi_epi16(lo01, lo23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), _mm_unpacklo_epi16(hi01, hi23));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 12), _mm_unpackhi_epi16(hi01, hi23));
  }
  for (; c < c1; ++c) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= uint32_t{static_cast<uint8_t>(sb[c + b * ldw])} << (8 * b);
    std::memcpy(&sc[c - c0], &bits, sizeof(float));
  }
}

// Columns [16 t0, 16 t1) of every row times their int8 scales.
inline void Scale(const int8_t* w, int64_t kg, int64_t k, int64_t lg, int64_t rows, int64_t n,
                  float* y, int64_t t0, int64_t t1) {
  const int64_t ldw = (int64_t{1} << lg) * kTile;
  const int64_t c1 = std::min(n, t1 * kTile);
  for (int64_t c0 = t0 * kTile; c0 < c1;) {
    const int64_t g = c0 / ldw, end = std::min(c1, (g + 1) * ldw);
    float sc[kLd];
    ColumnScales(w, kg, k, lg, c0, end, sc);
    for (int64_t r = 0; r < rows; ++r) {  // row by row: a prefill's y is row-major
      float* yr = y + r * n;
      for (int64_t c = c0; c < end; ++c) yr[c] *= sc[c - c0];
    }
    c0 = end;
  }
}
inline void Scale(const void*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
                  int64_t) {}

// W: float (F32 weights), uint16_t (BF16 weights) or int8_t (S8 weights with scales, above).
// dot: 0 float32 activations (every output one FMA chain, as above), 1 bfloat16 activations
// through `vdpbf16ps` (bf16 weights only; DotTiles).
template <ffi::DataType T, typename W>
ffi::Error Linear(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                  ffi::ResultBuffer<ffi::F32> y, int64_t threads, int64_t pf, int64_t isa,
                  int64_t dot) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto yd = y->dimensions();
  if (xd.size() < 2 || wd.size() != 3 || yd.size() != 2) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_linear: expected x [rows, in] (or [rows, "
                                       "..., in] split in heads), w [groups, in, 64 or 128], "
                                       "y [rows, out]");
  }
  int64_t k = 1;  // x's trailing dimensions together are the input width
  for (size_t i = 1; i < xd.size(); ++i) k *= xd[i];
  const int64_t rows = xd[0], groups = wd[0], n = yd[1];
  const int64_t tiles = (n + kTile - 1) / kTile;  // those holding a column (the rest: padding)
  const int64_t ldw = wd[2], lg = ldw == kLd ? 3 : 2;  // 128 or 64 columns: 8 or 4 tiles
  const int64_t kg = k + kScaleRows<W>;  // a group's rows
  if (wd[1] != kg || (ldw != kLd && ldw != kLd / 2) || yd[0] != rows ||
      groups != (n + ldw - 1) / ldw) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_linear: shapes do not match");
  }
  if (const char* bad = mtpspec::BadIsa(isa)) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_linear: ") + bad);
  }
  if (dot != 0 && dot != 1) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_linear: dot must be 0 or 1");
  }
  if (dot == 1 && sizeof(W) != 2) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_linear: bfloat16 activations (dot=1) need bfloat16 weights");
  }
  if (dot == 1 && !mtpspec_cpu_linear_bf16_dot()) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_linear: bfloat16 activations (dot=1) need a CPU with AVX-512 BF16");
  }
  const Isa& set = kIsas<W>[isa];
  const Isa& f32 = kIsas<float>[isa];
  const float* xp = x.typed_data();
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  float* yp = y->typed_data();
  if (k == 0) {  // no inputs: every output is the empty sum (the blocks below never run)
    std::fill(yp, yp + rows * n, 0.0f);
    return ffi::Error::Success();
  }
  if constexpr (sizeof(W) == 2) {
    if (dot == 1) {
      const int64_t kp = k + (k & 1);
      // per call (a prompt's rows can be many; a thread_local would keep the largest forever)
      std::vector<uint16_t> xb(static_cast<size_t>(rows * kp));
      RoundRows(xp, rows, k, kp, xb.data());
      const uint16_t* xbp = xb.data();
      mtpspec::ParallelFor(pool, threads, groups, groups >= 2 && rows * k * n >= kMinShared,
                           [&](int64_t u0, int64_t u1) {
                             DotTiles(xbp, rows, k, kp, wp, lg, n, yp, (u0 << lg),
                                      std::min(tiles, u1 << lg));
                           });
      return ffi::Error::Success();
    }
  }
  // Units are packed groups (tiles side by side form within one; a column's value does not depend
  // on which).
  mtpspec::ParallelFor(pool, threads, groups, groups >= 2 && rows * k * n >= kMinShared,
                       [&](int64_t u0, int64_t u1) {
                         const int64_t t0 = u0 << lg, t1 = std::min(tiles, u1 << lg);
                         Tiles(set, f32, xp, rows, k, wp, kg, lg, n, yp, t0, t1, pf);
                         if constexpr (sizeof(W) == 1) Scale(wp, kg, k, lg, rows, n, yp, t0, t1);
                       });
  return ffi::Error::Success();
}

// ---- Greedy argmax through an int8 screen (a large vocabulary's LM head) -----------------------
//
// ids[r] = argmax_j (x W)[r, j] exactly as `Linear` above computes every column of W (float32 or
// bf16) and jnp.argmax picks (the first of the largest), while streaming W's per-column int8 copy
// (`screen`, [groups, in + 4, ld], quantised from W's values: cpu_linear.quantize) and then only
// the packed groups of W that can hold the maximum: about half the head's bytes for bf16, a
// quarter for float32.
//
// The bound. For a row x (l1 = sum |x_i|) and a column j, e_j is Linear's value (one FMA chain over
// w_ij) and a_j = s_j t_j the screen's (one FMA chain over the int8 values q_ij, then one multiply
// by the column's scale s_j, ScreenStats). With u = 2^-24 and g = k u / (1 - k u) (a k-term chain's rounding,
// relative to the sum of its absolute terms):
//   |e_j - sum x_i w_ij|        <= g l1 max_i |w_ij| <= g l1 128 s_j   (s_j = fl(max |w_ij| / 127))
//   |sum x_i (w_ij - s_j q_ij)| <= l1 s_j (1/2 + 256 u)               (q = round(fl(w / s_j)))
//   |a_j - s_j sum x_i q_ij|    <= s_j (g 127 l1 + u |t_j|) <= s_j l1 (127 g + 128 u)
// so |e_j - a_j| <= b_j = s_j l1 kappa, kappa = 1/2 + 384 u + 255 g, plus (k + 1) 2^-90 (1 + s_j)
// for inputs, products and sums flushed to zero (DAZ/FTZ; a denormal weight's products, where the
// screen was made under DAZ and the argmax is not, up to l1 ~ 1e11). b_j is taken 2^-10 larger (relative)
// so that computing it and a_j +- b_j in float32 (|a_j| <= 257 b_j) stays on the safe side. Every
// column at the row's maximum has a_j + b_j >= e_j >= max_l e_l >= L = max_l (a_l - b_l), and a
// column with a_j + b_j < L is below the maximum: the argmax is in the groups holding a column
// with a_j + b_j >= L. Those groups are computed exactly (Linear's chains on that group alone: a
// column's value does not depend on which columns share the call) and the first largest value
// among them is the answer. A row with a non-finite l1 or a_j (an overflow, a NaN input) is
// computed whole, as Linear would, and gets jnp.argmax's answer (the first NaN if any).
//
// Outputs: ids [rows] int32, top [rows] float32 (the maximum, e_ids), exact [rows] int32 (the
// columns computed exactly: what the screen did not save).
// Over m columns of one row: a = t * s (the screen's value), b = kl1 * s + tiny * (1 + s);
// *lo = max (a - b), *hi = max (a + b), *bad = whether any a is not finite (b is computed with
// an FMA here and a multiply-add in the tail: its 2^-10 margin covers either rounding).
__attribute__((target("avx2,fma"))) inline void ScreenStats(const float* t, const float* sc,
                                                            int64_t m, float kl1, float tiny,
                                                            float* lo, float* hi, char* bad) {
  __m256 l = _mm256_set1_ps(-INFINITY), h = l, nf = _mm256_setzero_ps();
  const __m256 kv = _mm256_set1_ps(kl1), tv = _mm256_set1_ps(tiny), one = _mm256_set1_ps(1.0f);
  int64_t c = 0;
  for (; c + 8 <= m; c += 8) {
    const __m256 s = _mm256_loadu_ps(sc + c);
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(t + c), s);
    const __m256 b = _mm256_fmadd_ps(kv, s, _mm256_mul_ps(tv, _mm256_add_ps(one, s)));
    const __m256 d = _mm256_sub_ps(a, a);  // NaN where a is not finite
    nf = _mm256_or_ps(nf, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
    l = _mm256_max_ps(l, _mm256_sub_ps(a, b));
    h = _mm256_max_ps(h, _mm256_add_ps(a, b));
  }
  alignas(32) float lv[8], hv[8];
  _mm256_store_ps(lv, l);
  _mm256_store_ps(hv, h);
  float lm = -INFINITY, hm = -INFINITY;
  for (int i = 0; i < 8; ++i) lm = std::max(lm, lv[i]), hm = std::max(hm, hv[i]);
  bool nonfinite = _mm256_movemask_ps(nf) != 0;
  for (; c < m; ++c) {
    const float a = t[c] * sc[c];
    const float b = kl1 * sc[c] + tiny * (1 + sc[c]);
    nonfinite |= !std::isfinite(a);
    lm = std::max(lm, a - b);
    hm = std::max(hm, a + b);
  }
  *lo = lm;
  *hi = hm;
  *bad = nonfinite;
}

template <ffi::DataType T, typename W>
ffi::Error HeadArgmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                      ffi::Buffer<ffi::S8> screen, ffi::ResultBuffer<ffi::S32> ids,
                      ffi::ResultBuffer<ffi::F32> top, ffi::ResultBuffer<ffi::S32> exact,
                      int64_t threads, int64_t pf, int64_t isa, int64_t n) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto sd = screen.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || sd.size() != 3 || ids->dimensions().size() != 1) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_head_argmax: expected x [rows, in], w [groups, in, 64 or 128], screen "
        "[groups, in + 4, 64 or 128], ids [rows]");
  }
  const int64_t rows = xd[0], k = xd[1], groups = wd[0], ldw = wd[2];
  const int64_t lg = ldw == kLd ? 3 : 2, kg = k + 4;
  if ((ldw != kLd && ldw != kLd / 2) || wd[1] != k || sd[0] != groups || sd[1] != kg ||
      sd[2] != ldw || n < 1 || groups != (n + ldw - 1) / ldw || ids->dimensions()[0] != rows ||
      top->dimensions()[0] != rows || exact->dimensions()[0] != rows) {
    return ffi::Error::InvalidArgument("mtpspec_cpu_head_argmax: shapes do not match");
  }
  if (const char* bad = mtpspec::BadIsa(isa)) {
    return ffi::Error::InvalidArgument(std::string("mtpspec_cpu_head_argmax: ") + bad);
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  const float* xp = x.typed_data();
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  const int8_t* sp = screen.typed_data();
  int32_t* idp = ids->typed_data();
  float* topp = top->typed_data();
  int32_t* exp = exact->typed_data();
  if (rows == 0) return ffi::Error::Success();
  if (k == 0) {  // every column is the empty sum: the first is the argmax
    for (int64_t r = 0; r < rows; ++r) idp[r] = 0, topp[r] = 0.0f, exp[r] = 0;
    return ffi::Error::Success();
  }
  const double u = std::ldexp(1.0, -24), gk = k * u / (1 - k * u);
  const float kappa = static_cast<float>((0.5 + 384 * u + 255 * gk) * (1 + std::ldexp(1.0, -10)));
  const float tiny = static_cast<float>((k + 1) * std::ldexp(1.0, -90));
  std::vector<float> l1(rows);
  std::vector<char> whole(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += std::fabs(static_cast<double>(xp[r * k + i]));
    const float up = static_cast<float>(sum * (1 + std::ldexp(1.0, -30)));
    l1[r] = up;
    whole[r] = !std::isfinite(up);
  }
  // The screen: a_j for every column, and per (row, group) the largest a_j - b_j and a_j + b_j.
  // A decode step's or window's rows reuse a thread's buffers; a call of many rows (beyond 32 MB
  // of logits) gets its own, so that a thread never keeps the largest forever.
  const size_t need = static_cast<size_t>(rows * n);
  thread_local std::vector<float> approx_kept, exact_kept;
  std::vector<float> approx_own, exact_own;
  const bool keep = need <= (size_t{8} << 20);
  std::vector<float>& approx = keep ? approx_kept : approx_own;
  std::vector<float>& exact_y = keep ? exact_kept : exact_own;
  if (approx.size() < need) approx.resize(need);
  if (exact_y.size() < need) exact_y.resize(need);
  float* ap = approx.data();
  float* ep = exact_y.data();
  std::vector<float> lo(rows * groups), hi(rows * groups);
  std::vector<char> bad(rows * groups, 0);
  const Isa& s8 = kIsas<int8_t>[isa];
  const Isa& f32 = kIsas<float>[isa];
  const Isa& wset = kIsas<W>[isa];
  mtpspec::ParallelFor(pool, threads, groups, groups >= 2 && rows * k * n >= kMinShared,
                       [&](int64_t u0, int64_t u1) {
                         const int64_t t0 = u0 << lg, t1 = std::min(tiles, u1 << lg);
                         Tiles(s8, f32, xp, rows, k, sp, kg, lg, n, ap, t0, t1, pf);
                         float sc[kLd];
                         for (int64_t g = u0; g < u1; ++g) {
                           const int64_t c0 = g * ldw, c1 = std::min(n, c0 + ldw);
                           ColumnScales(sp, kg, k, lg, c0, c1, sc);
                           for (int64_t r = 0; r < rows; ++r) {
                             ScreenStats(ap + r * n + c0, sc, c1 - c0, kappa * l1[r], tiny,
                                         &lo[r * groups + g], &hi[r * groups + g],
                                         &bad[r * groups + g]);
                           }
                         }
                       });
  // The candidate groups of every row (all of a row's groups when it is computed whole).
  std::vector<int64_t> units;  // r * groups + g
  for (int64_t r = 0; r < rows; ++r) {
    float bound = -INFINITY;
    for (int64_t g = 0; g < groups; ++g) {
      whole[r] |= bad[r * groups + g];
      bound = std::max(bound, lo[r * groups + g]);
    }
    for (int64_t g = 0; g < groups; ++g) {
      if (whole[r] || hi[r * groups + g] >= bound) units.push_back(r * groups + g);
    }
  }
  const int64_t nu = static_cast<int64_t>(units.size());
  mtpspec::ParallelFor(pool, threads, nu, nu >= 2 && nu * k * ldw >= kMinShared,
                       [&](int64_t u0, int64_t u1) {
                         for (int64_t q = u0; q < u1; ++q) {
                           const int64_t r = units[q] / groups, g = units[q] % groups;
                           const int64_t t0 = g << lg, t1 = std::min(tiles, (g + 1) << lg);
                           Tiles(wset, f32, xp + r * k, 1, k, wp, k, lg, n, ep + r * n, t0, t1,
                                 pf);
                         }
                       });
  // The first largest value (a NaN wins at once, as in jnp.argmax), over the groups in order.
  for (int64_t r = 0; r < rows; ++r) idp[r] = -1, topp[r] = -INFINITY, exp[r] = 0;
  for (int64_t q = 0; q < nu; ++q) {
    const int64_t r = units[q] / groups, g = units[q] % groups;
    const int64_t c0 = g * ldw, c1 = std::min(n, c0 + ldw);
    exp[r] += static_cast<int32_t>(c1 - c0);
    if (idp[r] >= 0 && std::isnan(topp[r])) continue;
    for (int64_t c = c0; c < c1; ++c) {
      const float e = ep[r * n + c];
      if (idp[r] < 0 || std::isnan(e) || e > topp[r]) {
        idp[r] = static_cast<int32_t>(c);
        topp[r] = e;
        if (std::isnan(e)) break;
      }
    }
  }
  return ffi::Error::Success();
}

// The screen of a packed float32 / bf16 weight, group by group, into XLA's output buffer (no
// temporary: a whole-array XLA form widened a 248k-column head to float32 first): column c's
// scale s = max(fl(max_i |w_ic| fl(1 / 127)), FLT_MIN) (FLT_MIN, a power of two, for a column of
// denormals, whose scale would round to 0; 0 for an all-zero column), q_ic = round-half-even(
// fl(w_ic / s)) (an IEEE division) clipped to [-127, 127]. So max |w_ic| <= 128 s and
// |w_ic / s - q_ic| <= 1/2 + 128 u, inside HeadArgmax's bound. (cpu_linear.quantize's XLA
// arithmetic can differ from it by a rounding in a few values: the screen is its own.)
inline float WidenOne(float v) { return v; }
inline float WidenOne(uint16_t v) {
  const uint32_t bits = uint32_t{v} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
template <ffi::DataType T, typename W>
ffi::Error MakeScreen(ffi::ThreadPool pool, ffi::Buffer<T> w, ffi::ResultBuffer<ffi::S8> out,
                      int64_t threads) {
  auto wd = w.dimensions();
  auto od = out->dimensions();
  if (wd.size() != 3 || od.size() != 3 || od[0] != wd[0] || od[1] != wd[1] + 4 ||
      od[2] != wd[2]) {
    return ffi::Error::InvalidArgument(
        "mtpspec_cpu_screen: expected w [groups, in, ld] and out [groups, in + 4, ld]");
  }
  const int64_t groups = wd[0], k = wd[1], ldw = wd[2];
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  int8_t* op = out->typed_data();
  mtpspec::ParallelFor(pool, threads, groups, groups >= 2, [&](int64_t u0, int64_t u1) {
    std::vector<float> scale(ldw);
    for (int64_t g = u0; g < u1; ++g) {
      const W* wg = wp + g * k * ldw;
      int8_t* og = op + g * (k + 4) * ldw;
      std::fill(scale.begin(), scale.end(), 0.0f);
      for (int64_t i = 0; i < k; ++i)
        for (int64_t c = 0; c < ldw; ++c)
          scale[c] = std::max(scale[c], std::fabs(WidenOne(wg[i * ldw + c])));
      // at least the smallest normal float (a column of denormals keeps a scale that bounds it);
      // 0 for an all-zero column, whose value is exactly 0 (so its bound is, too)
      for (int64_t c = 0; c < ldw; ++c) {
        scale[c] = scale[c] > 0 ? std::max(scale[c] * (1.0f / 127), FLT_MIN) : 0.0f;
      }
      for (int64_t i = 0; i < k; ++i)
        for (int64_t c = 0; c < ldw; ++c) {
          if (scale[c] == 0) {
            og[i * ldw + c] = 0;
            continue;
          }
          const float q = std::nearbyint(WidenOne(wg[i * ldw + c]) / scale[c]);
          og[i * ldw + c] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
        }
      for (int64_t c = 0; c < ldw; ++c) {
        uint32_t bits;
        std::memcpy(&bits, &scale[c], sizeof(bits));
        for (int b = 0; b < 4; ++b) og[(k + b) * ldw + c] = static_cast<int8_t>(bits >> (8 * b));
      }
    }
  });
  return ffi::Error::Success();
}

template <ffi::DataType T>
auto ScreenBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .template Arg<ffi::Buffer<T>>()
      .template Ret<ffi::Buffer<ffi::S8>>()
      .template Attr<int64_t>("threads");
}

template <ffi::DataType T>
auto HeadArgmaxBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<T>>()
      .template Arg<ffi::Buffer<ffi::S8>>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::Buffer<ffi::S32>>()
      .template Attr<int64_t>("threads")
      .template Attr<int64_t>("prefetch")
      .template Attr<int64_t>("isa")
      .template Attr<int64_t>("n");
}

// The three targets' signature: x, the packed weight of element type T, y and the attributes.
template <ffi::DataType T>
auto LinearBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<T>>()
      .template Ret<ffi::Buffer<ffi::F32>>()  // from here the binding's type depends on T
      .template Attr<int64_t>("threads")
      .template Attr<int64_t>("prefetch")
      .template Attr<int64_t>("isa")
      .template Attr<int64_t>("dot");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuLinear, (Linear<ffi::F32, float>),
                              LinearBinding<ffi::F32>());

// The same over bfloat16 weights packed the same way ([groups, in, 128] bf16), held as uint16 bit
// patterns (XLA:CPU widens a whole bf16 operand to f32 for a gather; see cpu_linear.py).
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuLinearBf16, (Linear<ffi::U16, uint16_t>),
                              LinearBinding<ffi::U16>());

// The same over int8 weights with per-column float32 scales ([groups, in + 4, 128] int8: the
// opt-in quantised storage, DecodingWeights' weights="int8").
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuLinearS8, (Linear<ffi::S8, int8_t>),
                              LinearBinding<ffi::S8>());

// Greedy argmax over a float32 or bf16 LM head through its int8 screen (HeadArgmax, above).
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuHeadArgmax, (HeadArgmax<ffi::F32, float>),
                              HeadArgmaxBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuHeadArgmaxBf16, (HeadArgmax<ffi::U16, uint16_t>),
                              HeadArgmaxBinding<ffi::U16>());

// The int8 screen of a float32 or bf16 packed weight (MakeScreen, above).
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuScreen, (MakeScreen<ffi::F32, float>),
                              ScreenBinding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(MtpspecCpuScreenBf16, (MakeScreen<ffi::U16, uint16_t>),
                              ScreenBinding<ffi::U16>());

extern "C" int mtpspec_cpu_linear_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The interface version of the whole library (its FFI targets' arguments and attributes):
// library.py refuses a library built from other sources (a stale build after the sources
// changed) instead of failing at the first call. Bump with any target's signature.
extern "C" int mtpspec_cpu_kernels_abi() { return 11; }
