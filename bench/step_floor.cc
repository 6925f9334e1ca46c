// The least one rank's step of the bench's MLP can take on the sim's BLAS: bench/step_floor.h.
//
// Eigen's packing of a transposed row-major operand trips GCC 12's -Wmaybe-uninitialized inside its AVX-512
// intrinsics (a false positive the library's own products share); it says nothing about this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bench/step_floor.h"
#include "reference/blas.h"

namespace ddpcheck::bench {
namespace {
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;

// Row-major C (m x n) = op(A) op(B) + beta C through the sim's BLAS, Eigen where it declines (small products).
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float beta, float* c) {
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  if (ref::BlasGemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c)) return;
  const ConstMap A(a, ta ? k : m, lda), B(b, tb ? n : k, ldb);
  Map C(c, m, n);
  if (beta == 0.0f) C.setZero();
  if (ta && tb) C.noalias() += A.transpose() * B.transpose();
  else if (ta) C.noalias() += A.transpose() * B;
  else if (tb) C.noalias() += A * B.transpose();
  else C.noalias() += A * B;
}

}  // namespace

double FloorStepSeconds(int64_t hidden, int64_t batch, int64_t warmup, int64_t steps) {
  const int64_t h = hidden, B = batch;
  constexpr int kLayers = 3;
  const float lr = 0.01f;
  std::vector<std::vector<float>> w(kLayers, std::vector<float>(static_cast<size_t>(h * h)));
  std::vector<std::vector<float>> gw(kLayers, std::vector<float>(static_cast<size_t>(h * h)));
  std::vector<std::vector<float>> bias(kLayers, std::vector<float>(static_cast<size_t>(h), 0.0f));
  std::vector<std::vector<float>> gb(kLayers, std::vector<float>(static_cast<size_t>(h)));
  // act[0] = the input, act[l + 1] = layer l's output (after its ReLU for l < 2); grad[l] = d loss / d act[l].
  std::vector<std::vector<float>> act(kLayers + 1, std::vector<float>(static_cast<size_t>(B * h)));
  std::vector<std::vector<float>> grad(kLayers + 1, std::vector<float>(static_cast<size_t>(B * h)));
  std::vector<float> target(static_cast<size_t>(B * h));
  uint32_t seed = 12345;
  auto uniform = [&] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
  };
  const float scale = 2.0f / std::sqrt(static_cast<float>(h));
  for (auto& m : w) for (float& v : m) v = uniform() * scale;
  for (float& v : act[0]) v = uniform();
  for (float& v : target) v = uniform();

  using Clock = std::chrono::steady_clock;
  Clock::time_point warm;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) warm = Clock::now();
    for (int l = 0; l < kLayers; ++l) {
      std::fill(gw[l].begin(), gw[l].end(), 0.0f);
      std::fill(gb[l].begin(), gb[l].end(), 0.0f);
    }
    for (int l = 0; l < kLayers; ++l) {
      float* y = act[l + 1].data();
      Gemm(false, true, B, h, h, act[l].data(), w[l].data(), 0.0f, y);
      for (int64_t r = 0; r < B; ++r) {
        for (int64_t j = 0; j < h; ++j) {
          float v = y[r * h + j] + bias[l][j];
          y[r * h + j] = l + 1 < kLayers ? std::max(v, 0.0f) : v;
        }
      }
    }
    const float inv = 2.0f / static_cast<float>(B * h);
    for (int64_t i = 0; i < B * h; ++i) grad[kLayers][i] = (act[kLayers][i] - target[i]) * inv;
    for (int l = kLayers - 1; l >= 0; --l) {
      const float* dy = grad[l + 1].data();
      Gemm(true, false, h, h, B, dy, act[l].data(), 1.0f, gw[l].data());
      for (int64_t r = 0; r < B; ++r) {
        for (int64_t j = 0; j < h; ++j) gb[l][j] += dy[r * h + j];
      }
      if (l == 0) break;  // the data's gradient is not needed
      float* dx = grad[l].data();
      Gemm(false, false, B, h, h, dy, w[l].data(), 0.0f, dx);
      const float* x = act[l].data();  // the ReLU's output: its gradient passes where it is positive
      for (int64_t i = 0; i < B * h; ++i) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
    }
    for (int l = 0; l < kLayers; ++l) {
      float* p = w[l].data();
      const float* g = gw[l].data();
      for (int64_t i = 0; i < h * h; ++i) p[i] -= lr * g[i];
      for (int64_t j = 0; j < h; ++j) bias[l][j] -= lr * gb[l][j];
    }
  }
  return std::chrono::duration<double>(Clock::now() - warm).count() / static_cast<double>(steps);
}

}  // namespace ddpcheck::bench
