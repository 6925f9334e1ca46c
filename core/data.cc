#include "core/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/lanes.h"
#include "core/model_spec.h"
#include "core/parallel.h"

namespace ddpcheck::core {

namespace {

// The portable draws documented in core/data.h.
class Draws {
 public:
  explicit Draws(uint64_t seed) : gen_(seed) {}
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1p-53; }
  double Normal() {
    double s = 0;
    for (int i = 0; i < 12; ++i) s += Uniform();
    return s - 6.0;
  }
  // An integer uniform in [lo, hi] (modulo reduction; the bias is below 2^-60).
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(gen_() % static_cast<uint64_t>(hi - lo + 1)); }

 private:
  std::mt19937_64 gen_;
};

// Rounds a value to what the precision holds (float32 rounding to nearest; float64 unchanged).
double ToPrecision(double v, DType precision) {
  return precision == DType::kFloat32 ? static_cast<double>(static_cast<float>(v)) : v;
}

Tensor Rounded(const Tensor& t, DType precision) {
  if (!IsFloating(t.dtype) && t.shape.size() == 1) return t;  // class ids
  Tensor r(precision, t.shape, t.data);
  for (double& v : r.data) v = ToPrecision(v, precision);
  return r;
}

// (rows, cols) of draws: normal, or k/4 with k in [-4, 4] when exact.
std::vector<double> Matrix(Draws& d, int64_t rows, int64_t cols, bool exact, double scale) {
  std::vector<double> m(static_cast<size_t>(rows * cols));
  for (double& v : m) v = exact ? static_cast<double>(d.Int(-4, 4)) / 4.0 : d.Normal() * scale;
  return m;
}

}  // namespace

namespace {

// Rows [r0, r1) of xs (n, in) times w (in, out) into acc ((r1 - r0) rows of out), each sum over k in ascending
// order (the dataset's definition): k runs outermost so that w is read row by row, the same additions in the
// same order as a dot product per column; a block of rows shares each pass over w (for a wide model w is tens of
// MB: one pass per row made the dataset of the bench's 10M-parameter MLP take 0.8 s).
// Rows [rt, rt + R) by columns [c0, c0 + 32) of xs times w into acc (row r0 first), held in 4R eight-lane
// registers over the whole k loop: each lane is one element's sum, its additions in ascending k.
template <int R>
void RowsTimesTile(const std::vector<double>& xs, const std::vector<double>& w, int64_t r0, int64_t rt, int64_t c0,
                   int64_t in, int64_t out, std::vector<double>* acc) {
  constexpr int kVecs = 4;
  lanes::V8d sum[R][kVecs] = {};
  for (int64_t k = 0; k < in; ++k) {
    const double* wk = w.data() + k * out + c0;
    lanes::V8d wv[kVecs];
    for (int v = 0; v < kVecs; ++v) wv[v] = lanes::Load(wk + 8 * v);
    for (int i = 0; i < R; ++i) {
      const lanes::V8d xk = lanes::Splat(xs[static_cast<size_t>((rt + i) * in + k)]);
      for (int v = 0; v < kVecs; ++v) sum[i][v] += xk * wv[v];
    }
  }
  for (int i = 0; i < R; ++i) {
    double* row = acc->data() + (rt + i - r0) * out + c0;
    for (int v = 0; v < kVecs; ++v) std::memcpy(row + 8 * v, &sum[i][v], sizeof sum[i][v]);
  }
}

void RowsTimes(const std::vector<double>& xs, const std::vector<double>& w, int64_t r0, int64_t r1, int64_t in,
               int64_t out, std::vector<double>* acc) {
  acc->assign(static_cast<size_t>((r1 - r0) * out), 0.0);
  // Tiles of up to 4 rows x 32 columns (RowsTimesTile: the bits of the scalar loop below); a strip of w's columns
  // stays in cache while the block's rows pass over it. The columns past the last whole strip by the scalar loop.
  constexpr int64_t kTileCols = 32;
  const int64_t tiled_cols = out / kTileCols * kTileCols;
  for (int64_t c0 = 0; c0 < tiled_cols; c0 += kTileCols) {
    int64_t rt = r0;
    for (; rt + 4 <= r1; rt += 4) RowsTimesTile<4>(xs, w, r0, rt, c0, in, out, acc);
    for (; rt < r1; ++rt) RowsTimesTile<1>(xs, w, r0, rt, c0, in, out, acc);
  }
  if (tiled_cols == out) return;
  for (int64_t k = 0; k < in; ++k) {
    const double* wk = w.data() + k * out;
    for (int64_t r = r0; r < r1; ++r) {
      const double xk = xs[static_cast<size_t>(r * in + k)];
      double* row = acc->data() + (r - r0) * out;
      for (int64_t c = tiled_cols; c < out; ++c) row[c] += xk * wk[c];
    }
  }
}

constexpr int64_t kRowBlock = 16;

}  // namespace

Status MakeDataset(const Scenario& s, Tensor* x, Tensor* y) {
  const DataSpec& spec = s.data;
  if (spec.kind == "npy" || spec.kind == "inline") {
    Tensor yy = spec.y;
    if (yy.shape.size() == 1) yy.dtype = DType::kInt64;
    *x = Rounded(spec.x, s.precision);
    *y = Rounded(yy, s.precision);
    return Status::Ok();
  }
  int64_t n = spec.samples;
  int64_t in = spec.in_features > 0 ? spec.in_features : ModelInFeatures(s.model);
  int64_t out = spec.out_features > 0 ? spec.out_features : ModelOutFeatures(s.model);
  if (n < 1 || in < 1 || out < 1) return Status::Invalid("data: samples, in_features and out_features must be >= 1");
  Draws d(spec.seed);
  if (spec.kind == "regression") {
    std::vector<double> a = Matrix(d, in, out, spec.exact, 1.0 / std::sqrt(static_cast<double>(in)));
    std::vector<double> xs = Matrix(d, n, in, spec.exact, 1.0);
    std::vector<double> ys(static_cast<size_t>(n * out));
    core::ParallelFor((n + kRowBlock - 1) / kRowBlock, [&](int64_t b) {  // blocks of rows on every core
      const int64_t r = b * kRowBlock, end = std::min(n, r + kRowBlock);
      std::vector<double> acc;
      RowsTimes(xs, a, r, end, in, out, &acc);
      std::copy(acc.begin(), acc.end(), ys.begin() + r * out);
    });
    for (double& v : ys) v = spec.exact ? static_cast<double>(d.Int(-4, 4)) / 4.0 : v + 0.1 * d.Normal();
    *x = Rounded(Tensor(DType::kFloat64, {n, in}, std::move(xs)), s.precision);
    *y = Rounded(Tensor(DType::kFloat64, {n, out}, std::move(ys)), s.precision);
    return Status::Ok();
  }
  if (spec.kind == "classification") {
    std::vector<double> w(static_cast<size_t>(in * out));
    for (double& v : w) v = spec.exact ? static_cast<double>(d.Int(-2, 2)) : d.Normal();
    std::vector<double> xs = Matrix(d, n, in, spec.exact, 1.0);
    std::vector<double> labels(static_cast<size_t>(n));
    core::ParallelFor((n + kRowBlock - 1) / kRowBlock, [&](int64_t b) {  // blocks of rows on every core
      const int64_t r0 = b * kRowBlock, end = std::min(n, r0 + kRowBlock);
      std::vector<double> acc;
      RowsTimes(xs, w, r0, end, in, out, &acc);
      for (int64_t r = r0; r < end; ++r) {
        const double* row = acc.data() + (r - r0) * out;
        double best = 0;
        for (int64_t c = 0; c < out; ++c) {
          if (c == 0 || row[c] > best) {
            best = row[c];
            labels[static_cast<size_t>(r)] = static_cast<double>(c);
          }
        }
      }
    });
    *x = Rounded(Tensor(DType::kFloat64, {n, in}, std::move(xs)), s.precision);
    *y = Tensor(DType::kInt64, {n}, std::move(labels));
    return Status::Ok();
  }
  return Status::Invalid("data: unknown kind '" + spec.kind + "'");
}

}  // namespace ddpcheck::core
