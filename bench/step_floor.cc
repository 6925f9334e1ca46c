// ddpcheck_bench_floor: the least one rank's step of the bench's MLP can take on the sim's BLAS.
//
// The same step as ddpcheck_bench_sim's at W = 1 (Linear(h,h) -> ReLU -> Linear(h,h) -> ReLU -> Linear(h,h), MSE,
// plain SGD, fp32, batch B), written as a bare loop over flat arrays with nothing of the sim's: no DDP, no
// buckets, no fingerprints, no model classes. Each step: zero_grad (a fill of the gradients, as torch 1.13's
// zero_grad() does), the forward's three products through ref::BlasGemm (the sim's BLAS, one thread) with bias
// and ReLU, the MSE gradient, the backward's three weight-gradient products accumulated into the zeroed
// gradients (as the sim's are) and two input-gradient products, the bias gradients, and the SGD update
// p -= lr g. bench/compare.py prints it beside the sim's step: what is left between them is the sim's own
// cost; what is left between it and the compute limit is the BLAS's and the memory's.
//
//   ddpcheck_bench_floor --hidden 1824 --batch 32 --warmup 3 --steps 20 --reps 3
// prints one JSON line: {"impl": "floor", "hidden": 1824, ..., "blas": "openblas ...", "step_ms": 30.1}
// Eigen's packing of a transposed row-major operand trips GCC 12's -Wmaybe-uninitialized inside its AVX-512
// intrinsics (a false positive the library's own products share); it says nothing about this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "reference/blas.h"

namespace {

using namespace ddpcheck;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;

struct Args {
  int64_t hidden = 1824;
  int64_t batch = 32;
  int64_t warmup = 3;
  int64_t steps = 20;
  int reps = 3;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "ddpcheck_bench_floor: %s\nusage: ddpcheck_bench_floor [--hidden H] [--batch B] [--warmup N] "
               "[--steps N] [--reps N]\n",
               why);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) Usage(("missing value after " + k).c_str());
    const long long v = std::atoll(argv[++i]);
    if (v < 1) Usage((k + " must be >= 1").c_str());
    if (k == "--hidden") a.hidden = v;
    else if (k == "--batch") a.batch = v;
    else if (k == "--warmup") a.warmup = v;
    else if (k == "--steps") a.steps = v;
    else if (k == "--reps") a.reps = static_cast<int>(v);
    else Usage(("unknown flag " + k).c_str());
  }
  return a;
}

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

// Steady-state seconds per step of `warmup + steps` steps on one fresh model and batch.
double StepSeconds(const Args& a) {
  const int64_t h = a.hidden, B = a.batch;
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
  for (int64_t step = 0; step < a.warmup + a.steps; ++step) {
    if (step == a.warmup) warm = Clock::now();
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
  return std::chrono::duration<double>(Clock::now() - warm).count() / static_cast<double>(a.steps);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = ParseArgs(argc, argv);
  std::vector<double> per_step;
  for (int r = 0; r < a.reps; ++r) per_step.push_back(StepSeconds(a));
  std::sort(per_step.begin(), per_step.end());
  const double median = per_step[per_step.size() / 2];
  std::printf(
      "{\"impl\": \"floor\", \"hidden\": %lld, \"params\": %lld, \"batch\": %lld, \"steps\": %lld, \"reps\": %d, "
      "\"blas\": \"%s\", \"step_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f}\n",
      static_cast<long long>(a.hidden), static_cast<long long>(3 * (a.hidden * a.hidden + a.hidden)),
      static_cast<long long>(a.batch), static_cast<long long>(a.steps), a.reps, ref::BlasBackend().c_str(),
      median * 1e3, per_step.front() * 1e3, per_step.back() * 1e3);
  return 0;
}
