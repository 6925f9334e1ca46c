// The reference layers' and model's backward against central finite differences in fp64.
// Shapes come from RapidCheck (batch 2..6, widths 1..6); values from a generated seed (uniform in [-2, 2]).
// Replay a failure with RC_PARAMS="seed=N".
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "reference/activations.h"
#include "reference/batchnorm.h"
#include "reference/linear.h"
#include "reference/loss.h"
#include "reference/model.h"

namespace ddpcheck::ref {
namespace {

using Mat = Matrix<double>;
constexpr double kStep = 1e-6;  // central difference step: truncation ~1e-12 * f''', round-off ~1e-10 * |f|
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-8;  // floor for gradients that are ~0

Mat Random(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  Mat m(rows, cols);
  for (Eigen::Index k = 0; k < m.size(); ++k) m.data()[k] = 4.0 * PortableUniform(rng) - 2.0;
  return m;
}
template <class Vec>
void Fill(std::mt19937_64& rng, Vec* v) {
  for (double& e : *v) e = 4.0 * PortableUniform(rng) - 2.0;
}

// (f(v + h) - f(v - h)) / 2h, restoring *v.
double CentralDifference(const std::function<double()>& f, double* v) {
  const double v0 = *v;
  *v = v0 + kStep;
  const double plus = f();
  *v = v0 - kStep;
  const double minus = f();
  *v = v0;
  return (plus - minus) / (2 * kStep);
}

// Every element of `values` (n of them): the analytic gradient grads[k] equals the finite difference of f.
void CheckAgainstFiniteDifferences(const std::string& what, double* values, const double* grads, int64_t n,
                                   const std::function<double()>& f) {
  for (int64_t k = 0; k < n; ++k) {
    const double fd = CentralDifference(f, values + k);
    const double an = grads[k];
    const double tol = kRtol * std::max(std::abs(an), std::abs(fd)) + kAtol;
    if (!(std::abs(an - fd) <= tol)) {
      RC_FAIL(what + "[" + std::to_string(k) + "]: backward " + std::to_string(an) + " vs finite difference " +
              std::to_string(fd));
    }
  }
}

// Smallest per-column biased variance: BatchNorm's curvature grows as it shrinks.
double MinColumnVariance(const Mat& x) {
  const auto centered = x.rowwise() - x.colwise().mean();
  return (centered.cwiseProduct(centered).colwise().sum() / static_cast<double>(x.rows())).minCoeff();
}

// L = sum(r .* layer(x)) for a random projection r, so dL/dy = r.
template <class L>
void CheckLayer(L& layer, std::mt19937_64& rng, int64_t batch, int64_t in, int64_t out) {
  Mat x = Random(rng, batch, in), r = Random(rng, batch, out);
  for (int s = 0; s < layer.num_params(); ++s) Fill(rng, &layer.param(s)->value);
  auto loss = [&] { return layer.Forward(x).cwiseProduct(r).sum(); };
  loss();
  Mat dx = layer.Backward(r, nullptr);
  CheckAgainstFiniteDifferences("dx", x.data(), dx.data(), x.size(), loss);
  for (int s = 0; s < layer.num_params(); ++s) {
    Param<double>& p = *layer.param(s);
    CheckAgainstFiniteDifferences(layer.param_name(s), p.value.data(), p.grad.data(), p.numel(), loss);
  }
}

RC_GTEST_PROP(LayersProp, LinearGradientsMatchFiniteDifferences, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), in = *rc::gen::inRange(1, 7), out = *rc::gen::inRange(1, 7);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  Linear<double> lin(in, out, *rc::gen::arbitrary<bool>());
  CheckLayer(lin, rng, batch, in, out);
}

RC_GTEST_PROP(LayersProp, ReluGradientMatchesFiniteDifferencesAwayFromTheKink, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), width = *rc::gen::inRange(1, 7);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 probe(seed);
  RC_PRE(Random(probe, batch, width).cwiseAbs().minCoeff() > 1e-4);
  std::mt19937_64 rng(seed);
  ReLU<double> relu;
  CheckLayer(relu, rng, batch, width, width);
}

RC_GTEST_PROP(LayersProp, TanhGradientMatchesFiniteDifferences, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), width = *rc::gen::inRange(1, 7);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  Tanh<double> t;
  CheckLayer(t, rng, batch, width, width);
}

RC_GTEST_PROP(LayersProp, BatchNormGradientsMatchFiniteDifferencesInTrainAndEvalMode, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), width = *rc::gen::inRange(1, 7);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 probe(seed);
  RC_PRE(MinColumnVariance(Random(probe, batch, width)) > 1e-2);
  BatchNormOptions o;
  o.affine = *rc::gen::arbitrary<bool>();
  BatchNorm1d<double> bn(width, o);
  const bool eval = *rc::gen::arbitrary<bool>();
  if (eval) {
    std::mt19937_64 stats(seed + 1);
    Fill(stats, &bn.buffer(0)->value);
    for (double& v : bn.buffer(1)->value) v = 0.5 + PortableUniform(stats);
    bn.SetTraining(false);
  }
  std::mt19937_64 rng(seed);
  CheckLayer(bn, rng, batch, width, width);
}

RC_GTEST_PROP(LayersProp, MseGradientMatchesFiniteDifferences, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), width = *rc::gen::inRange(1, 7);
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  Mat out = Random(rng, batch, width), target = Random(rng, batch, width);
  MseLoss<double> mse;
  auto loss = [&] { return mse.Forward(out, target); };
  loss();
  Mat d = mse.Backward(1.0);
  CheckAgainstFiniteDifferences("dout", out.data(), d.data(), out.size(), loss);
}

RC_GTEST_PROP(LayersProp, CrossEntropyGradientMatchesFiniteDifferences, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), classes = *rc::gen::inRange(1, 7);
  const auto targets = *rc::gen::container<std::vector<int64_t>>(static_cast<size_t>(batch),
                                                                  rc::gen::inRange<int64_t>(0, classes));
  std::mt19937_64 rng(*rc::gen::arbitrary<uint64_t>());
  Mat logits = Random(rng, batch, classes);
  CrossEntropyLoss<double> ce;
  auto loss = [&] { return ce.Forward(logits, targets); };
  loss();
  Mat d = ce.Backward(1.0);
  CheckAgainstFiniteDifferences("dlogits", logits.data(), d.data(), logits.size(), loss);
}

// A random chain of 1..5 layers whose input width is `in`.
std::vector<core::LayerSpec> RandomLayers(int64_t in) {
  const int n = *rc::gen::inRange(1, 6);
  std::vector<core::LayerSpec> layers;
  int64_t width = in;
  for (int i = 0; i < n; ++i) {
    core::LayerSpec s;
    s.type = *rc::gen::element<std::string>("linear", "relu", "tanh", "batchnorm1d", "dropout");
    if (s.type == "linear") {
      s.in_features = width;
      s.out_features = width = *rc::gen::inRange<int64_t>(1, 7);
      s.bias = *rc::gen::arbitrary<bool>();
    } else if (s.type == "batchnorm1d") {
      s.num_features = width;
      s.affine = *rc::gen::arbitrary<bool>();
    } else if (s.type == "dropout") {
      s.p = 0.25;
    }
    layers.push_back(s);
  }
  return layers;
}

RC_GTEST_PROP(LayersProp, ModelGradientsForParamsAndInputMatchFiniteDifferences, ()) {
  const int64_t batch = *rc::gen::inRange(2, 7), in = *rc::gen::inRange(1, 7);
  const std::vector<core::LayerSpec> layers = RandomLayers(in);
  const std::string loss_name = *rc::gen::element<std::string>("mse", "cross_entropy");
  Model<double> m;
  const core::Status st = Model<double>::Build(layers, loss_name, &m);
  RC_ASSERT(st.ok());
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  std::mt19937_64 rng(seed);
  for (int i = 0; i < m.num_params(); ++i) {
    for (int64_t k = 0; k < m.param_info(i).numel(); ++k) m.param_data(i)[k] = 2.0 * PortableUniform(rng) - 1.0;
  }
  Mat x = Random(rng, batch, in);
  const int64_t out = m.widths().out >= 0 ? m.widths().out : in;
  core::Tensor y(core::DType::kFloat64, {batch, out}, {});
  if (loss_name == "mse") {
    for (int64_t k = 0; k < batch * out; ++k) y.data.push_back(4.0 * PortableUniform(rng) - 2.0);
  } else {
    y.shape = {batch};
    for (int64_t k = 0; k < batch; ++k) y.data.push_back(static_cast<double>(rng() % static_cast<uint64_t>(out)));
  }
  auto loss = [&] {
    m.SetDropoutSeed(seed);  // the same masks on every evaluation
    return m.Forward(x, y);
  };
  loss();
  for (int l = 0; l < m.num_layers(); ++l) {
    const Mat& h = m.layer_input(l);
    if (layers[static_cast<size_t>(l)].type == "relu") RC_PRE(h.cwiseAbs().minCoeff() > 1e-4);
    if (layers[static_cast<size_t>(l)].type == "batchnorm1d") RC_PRE(MinColumnVariance(h) > 1e-2);
  }
  m.Backward(1.0, nullptr);
  const Mat dx = m.input_grad();
  CheckAgainstFiniteDifferences("input", x.data(), dx.data(), x.size(), loss);
  for (int i = 0; i < m.num_params(); ++i) {
    // A grad that no path reaches stays undefined; autograd would leave it None (never the case here).
    RC_ASSERT(m.grad_defined(i));
    CheckAgainstFiniteDifferences(m.param_info(i).name, m.param_data(i), m.grad_data(i), m.param_info(i).numel(),
                                  loss);
  }
}

}  // namespace
}  // namespace ddpcheck::ref
