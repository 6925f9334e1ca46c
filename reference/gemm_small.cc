#include "reference/gemm_small.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DDPCHECK_SMALL_GEMM 1
#else
#define DDPCHECK_SMALL_GEMM 0
#endif

namespace ddpcheck::ref {

#if DDPCHECK_SMALL_GEMM

namespace {

#define DDPCHECK_AVX512 __attribute__((target("avx512f")))

// The lanes of the three 16-float vectors of a strip of `width` (<= 48) columns.
struct StripMasks {
  __mmask16 m[3];
  explicit StripMasks(int64_t width) {
    for (int v = 0; v < 3; ++v) {
      const int64_t w = std::clamp<int64_t>(width - 16 * v, 0, 16);
      m[v] = static_cast<__mmask16>(w == 16 ? 0xFFFF : (1u << w) - 1);
    }
  }
};

constexpr int64_t kStrip = 48;  // C columns per tile: three vectors
constexpr int64_t kRows = 8;    // C rows per tile: 24 accumulators
constexpr int64_t kBlock = 32;  // B rows per block of C = A B

// ---- C = A B^T: C's rows along the lanes (A^T packed, 32 rows per pass), T rows of B per tile ----

// at: k x 32 (A^T, lanes past the pass's rows zero); b: T rows of B (ldb apart); c: the pass's rows of C at the
// tile's first column.
template <int T>
DDPCHECK_AVX512 void NtTile(int64_t k, const float* at, const float* b, int64_t ldb, float* c, int64_t ldc,
                            int64_t rows) {
  __m512 acc0[T], acc1[T];
  #pragma GCC unroll 12
  for (int y = 0; y < T; ++y) acc0[y] = acc1[y] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    const __m512 x0 = _mm512_loadu_ps(at + p * 32), x1 = _mm512_loadu_ps(at + p * 32 + 16);
    #pragma GCC unroll 12
    for (int y = 0; y < T; ++y) {
      const __m512 w = _mm512_set1_ps(b[y * ldb + p]);
      acc0[y] = _mm512_fmadd_ps(w, x0, acc0[y]);
      acc1[y] = _mm512_fmadd_ps(w, x1, acc1[y]);
    }
  }
  alignas(64) float out[T][32];
  #pragma GCC unroll 12
  for (int y = 0; y < T; ++y) {
    _mm512_store_ps(out[y], acc0[y]);
    _mm512_store_ps(out[y] + 16, acc1[y]);
  }
  for (int64_t i = 0; i < rows; ++i) {
    #pragma GCC unroll 12
    for (int y = 0; y < T; ++y) c[i * ldc + y] = out[y][i];
  }
}

DDPCHECK_AVX512 void GemmNt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c) {
  constexpr int T = 12;
  thread_local std::vector<float> at;
  at.resize(static_cast<size_t>(k) * 32);
  for (int64_t r0 = 0; r0 < m; r0 += 32) {
    const int64_t rows = std::min<int64_t>(32, m - r0);
    if (rows < 32) std::fill(at.begin(), at.end(), 0.0f);
    // A^T written in order (each of the pass's rows read as its own stream): strided writes were 4 % of a step.
    const float* rows_at = a + r0 * lda;
    for (int64_t p = 0; p < k; ++p) {
      float* col = at.data() + p * 32;
      for (int64_t i = 0; i < rows; ++i) col[i] = rows_at[i * lda + p];
    }
    float* cp = c + r0 * n;
    int64_t j = 0;
    for (; j + T <= n; j += T) NtTile<T>(k, at.data(), b + j * ldb, ldb, cp + j, n, rows);
    for (; j < n; ++j) NtTile<1>(k, at.data(), b + j * ldb, ldb, cp + j, n, rows);
  }
}

// ---- An MR x 48 tile of C in 3 MR registers, for C = A B and C = A^T B ----

#define DDPCHECK_TILE_INLINE __attribute__((always_inline, target("avx512f"))) inline

// How a finished tile goes into C (Tile48::Store).
enum class Into { kStore, kAdd, kAddToZeros };

template <int MR>
struct Tile48 {
  __m512 v0[MR], v1[MR], v2[MR];
  __mmask16 m0, m1, m2;

  DDPCHECK_TILE_INLINE explicit Tile48(const StripMasks& mk) : m0(mk.m[0]), m1(mk.m[1]), m2(mk.m[2]) {}
  DDPCHECK_TILE_INLINE void Zero() {
#pragma GCC unroll 8
    for (int x = 0; x < MR; ++x) v0[x] = v1[x] = v2[x] = _mm512_setzero_ps();
  }
  DDPCHECK_TILE_INLINE void Load(const float* c, int64_t ldc) {
#pragma GCC unroll 8
    for (int x = 0; x < MR; ++x) {
      v0[x] = _mm512_maskz_loadu_ps(m0, c + x * ldc);
      v1[x] = _mm512_maskz_loadu_ps(m1, c + x * ldc + 16);
      v2[x] = _mm512_maskz_loadu_ps(m2, c + x * ldc + 32);
    }
  }
  // Row x += a[x * a_step] * (the 48 floats at bp): one fused multiply-add per element.
  DDPCHECK_TILE_INLINE void Update(const float* a, int64_t a_step, const float* bp) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bp), b1 = _mm512_maskz_loadu_ps(m1, bp + 16),
                 b2 = _mm512_maskz_loadu_ps(m2, bp + 32);
#pragma GCC unroll 8
    for (int x = 0; x < MR; ++x) {
      const __m512 av = _mm512_set1_ps(a[x * a_step]);
      v0[x] = _mm512_fmadd_ps(av, b0, v0[x]);
      v1[x] = _mm512_fmadd_ps(av, b1, v1[x]);
      v2[x] = _mm512_fmadd_ps(av, b2, v2[x]);
    }
  }
  // Stores the tile into C (kStore), C + the tile (kAdd), or +0 + the tile without reading C (kAddToZeros: C's
  // zeros never written; the same bits as kAdd over a C of +0, a -0 of the tile becoming +0 either way).
  DDPCHECK_TILE_INLINE void Store(float* c, int64_t ldc, Into into) {
#pragma GCC unroll 8
    for (int x = 0; x < MR; ++x) {
      float* cp = c + x * ldc;
      if (into == Into::kAdd) {
        v0[x] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cp), v0[x]);
        v1[x] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cp + 16), v1[x]);
        v2[x] = _mm512_add_ps(_mm512_maskz_loadu_ps(m2, cp + 32), v2[x]);
      } else if (into == Into::kAddToZeros) {
        const __m512 zero = _mm512_setzero_ps();
        v0[x] = _mm512_add_ps(zero, v0[x]);
        v1[x] = _mm512_add_ps(zero, v1[x]);
        v2[x] = _mm512_add_ps(zero, v2[x]);
      }
      _mm512_mask_storeu_ps(cp, m0, v0[x]);
      _mm512_mask_storeu_ps(cp + 16, m1, v1[x]);
      _mm512_mask_storeu_ps(cp + 32, m2, v2[x]);
    }
  }
};

// ---- C = A B: 8 x 48 tiles, B in blocks of 32 rows, C accumulated in place between blocks ----

template <int MR>
struct Nn {
  DDPCHECK_AVX512 static void Run(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                                  int64_t p0, int64_t pe, const StripMasks* mk) {
    Tile48<MR> t(*mk);
    if (p0 == 0) {
      t.Zero();
    } else {
      t.Load(c, ldc);
    }
    for (int64_t p = p0; p < pe; ++p) t.Update(a + p, lda, b + p * ldb);
    t.Store(c, ldc, Into::kStore);
  }
};

template <template <int> class Tile, typename... Args>
DDPCHECK_AVX512 void ByRows(int64_t mr, Args... args) {
  switch (mr) {
    case 8: Tile<8>::Run(args...); break;
    case 7: Tile<7>::Run(args...); break;
    case 6: Tile<6>::Run(args...); break;
    case 5: Tile<5>::Run(args...); break;
    case 4: Tile<4>::Run(args...); break;
    case 3: Tile<3>::Run(args...); break;
    case 2: Tile<2>::Run(args...); break;
    default: Tile<1>::Run(args...); break;
  }
}

DDPCHECK_AVX512 void GemmNn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c) {
  const int64_t tiles = ((n + kStrip - 1) / kStrip) * ((m + kRows - 1) / kRows);
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    const int64_t pe = std::min(k, p0 + kBlock);
    // The next block of B, prefetched a share per tile while this one is used (its rows are ldb apart: the
    // block is one stretch of memory).
    const char* next = reinterpret_cast<const char*>(b + pe * ldb);
    const int64_t next_lines = pe < k ? ((std::min(k, pe + kBlock) - pe) * ldb * 4 + 63) / 64 : 0;
    const int64_t per_tile = (next_lines + tiles - 1) / tiles;
    int64_t line = 0;
    for (int64_t j = 0; j < n; j += kStrip) {
      const StripMasks mk(n - j);
      for (int64_t i = 0; i < m; i += kRows) {
        for (int64_t q = 0; q < per_tile && line < next_lines; ++q, ++line) {
          _mm_prefetch(next + line * 64, _MM_HINT_T1);
        }
        ByRows<Nn>(std::min(kRows, m - i), a + i * lda, lda, b + j, ldb, c + i * n + j, n, p0, pe, &mk);
      }
    }
  }
}

// ---- C = A^T B (k small): 8 x 48 tiles summed in registers, then stored or added to C ----

template <int MR>
struct Tn {
  DDPCHECK_AVX512 static void Run(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                                  int64_t ldc, Into into, const StripMasks* mk) {
    Tile48<MR> t(*mk);
    t.Zero();
    for (int64_t p = 0; p < k; ++p) t.Update(a + p * lda, 1, b + p * ldb);
    t.Store(c, ldc, into);
  }
};

DDPCHECK_AVX512 void GemmTn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                            Into into, float* c) {
  for (int64_t i = 0; i < m; i += kRows) {
    const int64_t mr = std::min(kRows, m - i);
    for (int64_t j = 0; j < n; j += kStrip) {
      // C's tile two strips on, fetched while this one is summed (C is read and written once: memory-bound).
      if (j + 3 * kStrip <= n) {
        for (int64_t x = 0; x < mr; ++x) {
          const char* ahead = reinterpret_cast<const char*>(c + (i + x) * n + j + 2 * kStrip);
          _mm_prefetch(ahead, _MM_HINT_T0);
          _mm_prefetch(ahead + 64, _MM_HINT_T0);
          _mm_prefetch(ahead + 128, _MM_HINT_T0);
        }
      }
      const StripMasks mk(n - j);
      ByRows<Tn>(mr, k, a + i, lda, b + j, ldb, c + i * n + j, n, into, &mk);
    }
  }
}

// The A^T B kernel: the weight gradient's product, k (the batch) at most 64.
bool TakesTn(bool trans_a, bool trans_b, int64_t k) { return trans_a && !trans_b && k <= 64; }

bool Enabled() {
  static const bool on = [] {
    const char* env = std::getenv("DDPCHECK_SMALL_GEMM");
    if (env && std::strcmp(env, "0") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return on;
}

}  // namespace

bool SmallGemmAvailable() { return Enabled(); }

bool SmallGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c) {
  if (!Enabled() || m <= 0 || n <= 0 || k <= 0) return false;
  if (!trans_a && trans_b && m <= 64 && beta == 0.0f) {
    GemmNt(m, n, k, a, lda, b, ldb, c);
    return true;
  }
  if (!trans_a && !trans_b && m <= 64 && beta == 0.0f) {
    GemmNn(m, n, k, a, lda, b, ldb, c);
    return true;
  }
  if (TakesTn(trans_a, trans_b, k) && (beta == 0.0f || beta == 1.0f)) {
    GemmTn(m, n, k, a, lda, b, ldb, beta == 1.0f ? Into::kAdd : Into::kStore, c);
    return true;
  }
  return false;
}

bool SmallGemmOverZeros(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                        const float* b, int64_t ldb, float* c) {
  if (!Enabled() || m <= 0 || n <= 0 || k <= 0 || !TakesTn(trans_a, trans_b, k)) return false;
  GemmTn(m, n, k, a, lda, b, ldb, Into::kAddToZeros, c);
  return true;
}

#else

bool SmallGemmAvailable() { return false; }

bool SmallGemm(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float, float*) {
  return false;
}

bool SmallGemmOverZeros(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*) {
  return false;
}

#endif

}  // namespace ddpcheck::ref
