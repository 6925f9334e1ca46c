// Forward, loss and backward rules of the running error analysis (reference/error_bounds.h). Each layer's
// values are recomputed here in double from its input (Model::layer_input) and the model's parameters; each
// value v carries e(v) >= |v_run - v_exact| for a run in unit roundoff u that starts from the same state.
#include "reference/error_bounds.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <variant>

#include "reference/blas.h"

namespace ddpcheck::ref {

namespace {

using M = Matrix<double>;
using MF = Matrix<float>;
using RV = RowVector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// What the backward rules need of each layer's forward.
struct LayerCache {
  M in, ein;    // the layer's input and its bound
  M out, eout;  // its output and bound
  // Linear: |W| of the weight its product used (the backward's too): rounded up to float (UpFloat) where its
  // bound products go through the BLAS in float (BoundProduct), else float64 in absW.
  M absW;
  MF absW_up;
  // BatchNorm1d: xhat and the inverse standard deviation (with bounds), and whether batch stats were used.
  M xhat, exhat;
  RV invstd, einv;
  bool batch_stats = false;
  bool in_low = false;  // autocast: the input held low-precision values (a Linear's `in` is its cast input)
};

M Abs(const M& a) { return a.cwiseAbs(); }

// Autocast (reference/model.h SetAutocast). A value autocast holds in `low` is a float the run computed,
// within e of v, rounded once to low: as the rounding R (float, then low) is monotone, the run's result lies
// in [R(v - e), R(v + e)], and so does the replay's own rounding y of a value within e of v. The bound on
// their distance is y's distance to the farther end: 0 where the whole interval rounds to one value (almost
// every element: the float error is far below low's spacing), one spacing of low where it straddles a
// rounding boundary. *y: the replay's rounded values (nullptr: R(v)). Sets v to y and e to the bound.
void RoundedToLow(core::DType low, const M* y, M* v, M* e) {
  M out = y ? *y : RoundToLow(*v, low);
  for (Eigen::Index k = 0; k < v->size(); ++k) {
    const double vk = v->data()[k], ek = e->data()[k], yk = out.data()[k];
    const double hi = RoundToLow(vk + ek, low), lo = RoundToLow(vk - ek, low);
    e->data()[k] = std::isnan(hi) || std::isnan(lo) ? kInf : std::max(hi - yk, yk - lo);
  }
  *v = std::move(out);
}

// Half the spacing of the low type's subnormals: a rounding's absolute error where its relative one fails
// (gradients underflow in float16: what loss scaling is for).
double LowUnderflow(core::DType low) { return std::ldexp(1.0, low == core::DType::kFloat16 ? -25 : -134); }

// A gradient autocast rounds to `low` in backward (the cast's backward, a low-precision layer's output): the
// run rounds its value (within e of v), the replay its own, each by at most u_low of its magnitude (or the
// underflow's absolute error).
void GradRoundedToLow(core::DType low, M* v, M* e) {
  const double ul = core::UnitRoundoff(low);
  RoundInPlace(v, low);
  *e += 2 * ul * (Abs(*v) + *e);
  e->array() += 2 * LowUnderflow(low);
}

// op(a) op(b) for row-major a, b: through the BLAS for large products (reference/blas.h), else Eigen. Bounds
// and values here are float64 sums of non-negative terms or the replay's own values: any summation order will do.
// An operand that is an expression is evaluated into a temporary by Ref; a matrix or a whole Map is used as is.
// c = op(a) op(b) + beta c (beta 0 or 1), c already sized.
void MulInto(const Eigen::Ref<const M>& a, bool ta, const Eigen::Ref<const M>& b, bool tb, double beta, Eigen::Map<M> c) {
  const Eigen::Index m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols(), n = tb ? b.rows() : b.cols();
  if (BlasGemm(ta, tb, m, n, k, a.data(), a.outerStride(), b.data(), b.outerStride(), beta, c.data())) return;
  M p(m, n);
  if (ta && tb) p.noalias() = a.transpose() * b.transpose();
  if (ta && !tb) p.noalias() = a.transpose() * b;
  if (!ta && tb) p.noalias() = a * b.transpose();
  if (!ta && !tb) p.noalias() = a * b;
  if (beta == 0) {
    c = p;
  } else {
    c += p;
  }
}

M Mul(const Eigen::Ref<const M>& a, bool ta, const Eigen::Ref<const M>& b, bool tb) {
  const Eigen::Index m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols(), n = tb ? b.rows() : b.cols();
  M c(m, n);
  if (BlasGemm(ta, tb, m, n, k, a.data(), a.outerStride(), b.data(), b.outerStride(), 0.0, c.data())) return c;
  if (ta && tb) c.noalias() = a.transpose() * b.transpose();
  if (ta && !tb) c.noalias() = a.transpose() * b;
  if (!ta && tb) c.noalias() = a * b.transpose();
  if (!ta && !tb) c.noalias() = a * b;
  return c;
}

// Each element of a (non-negative, or NaN) rounded up to float: an upper bound of it (+inf above float's range).
MF UpFloat(const Eigen::Ref<const M>& a) {
  MF f(a.rows(), a.cols());
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    const double* src = a.row(i).data();
    float* dst = f.row(i).data();
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const float r = static_cast<float>(src[j]);  // to nearest: one step up where that fell below
      uint32_t bits;
      std::memcpy(&bits, &r, sizeof bits);
      bits += static_cast<double>(r) < src[j];
      std::memcpy(&dst[j], &bits, sizeof bits);
    }
  }
  return f;
}

// Whether a bound product of this shape is taken in float (BoundProduct): where the BLAS computes it, and its
// k-term float sums have a finite gamma.
std::atomic<bool> float_bound_products{true};

bool FloatBoundProduct(Eigen::Index m, Eigen::Index n, Eigen::Index k) {
  return float_bound_products.load(std::memory_order_relaxed) && BlasTakes(m, n, k) &&
         static_cast<double>(k) * 0x1p-24 < 0.25;
}

// c = an upper bound of op(a) op(b) for a, b of non-negative elements already rounded up to float (UpFloat; their
// exact products bound those of the float64 values). The float BLAS's sums of k non-negative products (any order,
// with or without FMA) are at least (1 - g32(k)) times the exact sum, less k times half the smallest subnormal
// for products that underflowed, so (sum + k 2^-149) (1 + 2 g32(k)) bounds it from above. A bound is then a few
// parts in 10^4 looser (k = 1824) than in float64, on twice the BLAS's float64 speed and half the memory.
void BoundProduct(const MF& a, bool ta, const MF& b, bool tb, Eigen::Map<M> c) {
  const Eigen::Index m = ta ? a.cols() : a.rows(), k = ta ? a.rows() : a.cols(), n = tb ? b.rows() : b.cols();
  MF p(m, n);
  if (!BlasGemm(ta, tb, m, n, k, a.data(), a.cols(), b.data(), b.cols(), 0.0f, p.data())) {
    // (FloatBoundProduct said the BLAS takes it: only a BLAS refusing a leading dimension gets here)
    if (ta && tb) p.noalias() = a.transpose() * b.transpose();
    if (ta && !tb) p.noalias() = a.transpose() * b;
    if (!ta && tb) p.noalias() = a * b.transpose();
    if (!ta && !tb) p.noalias() = a * b;
  }
  const double kd = static_cast<double>(k), g = kd * 0x1p-24 / (1 - kd * 0x1p-24);
  const double grow = kd * 0x1p-24 < 0.5 ? 1 + 2 * g : kInf, floor = kd * 0x1p-149;
  const float* src = p.data();
  double* dst = c.data();
  for (Eigen::Index i = 0; i < p.size(); ++i) dst[i] = (static_cast<double>(src[i]) + floor) * grow;
}

M BoundProduct(const MF& a, bool ta, const MF& b, bool tb) {
  M c(ta ? a.cols() : a.rows(), tb ? b.rows() : b.cols());
  BoundProduct(a, ta, b, tb, Eigen::Map<M>(c.data(), c.rows(), c.cols()));
  return c;
}

// e of 1/sqrt(s) given e of s: |1/sqrt(s') - 1/sqrt(s)| <= es / (2 (s - es)^(3/2)) for es < s, plus the
// roundings of sqrt and the division (3u relative).
double InvSqrtBound(double s, double es, double u) {
  if (es >= s) return kInf;
  return es / (2.0 * std::pow(s - es, 1.5)) + 3.0 * u / std::sqrt(s);
}

// The statistics one BatchNorm forward normalises with, per channel, and their bounds.
struct BnStats {
  RV mean, emean;  // the mean
  RV var, evar;    // the biased variance
  RV unb, eunb;    // the unbiased variance (running_var's update)
};

// Two-pass statistics of h (bound e) over its rows, as torch's CPU kernel and batch_norm_stats compute them:
// a mean off by d changes sum((x - mean - d)^2) = sum(c^2) + n d^2 (sum(c) = 0), so the mean's error enters
// only squared, and the inputs' errors as 2 |c| e.
BnStats TwoPassStats(const M& h, const M& e, double u) {
  const auto n = static_cast<double>(h.rows());
  BnStats st;
  st.mean = h.colwise().sum() / n;
  st.emean = e.colwise().sum() / n + Gamma(n + 1, u) * Abs(h).colwise().sum() / n;
  const M cen = h.rowwise() - st.mean;
  const RV sumsq = cen.cwiseProduct(cen).colwise().sum();
  st.var = sumsq / n;
  const M ec_own = e + u * Abs(cen);
  st.evar = (2.0 * Abs(cen).cwiseProduct(ec_own) + ec_own.cwiseProduct(ec_own)).colwise().sum() / n +
            st.emean.cwiseProduct(st.emean) + Gamma(n + 2, u) * sumsq / n;
  st.unb = sumsq / (n - 1);
  st.eunb = st.evar * n / (n - 1);
  return st;
}

// SyncBatchNorm's statistics over every member's rows (core/sync_bn_merge.h): each rank's two-pass mean and
// invstd = 1/sqrt(var + eps), all-gathered, then Chan's merge in rank order,
//   v = (1/invstd_j)^2 - eps;  v *= n_j;  f = 1/(n + n_j);
//   var_n += v + (avg - mean_j)^2 n n_j f;  avg = n f avg + n_j f mean_j;  n += n_j.
// Recovering v from invstd costs the invstd's bound twice (squared) and 3u of var + eps; the merge is a
// convex combination of the means (their bounds weighted, g(5W) of the largest) and a sum of 2W terms
// (g(2W + 6) of their magnitudes); a mean off by d moves (avg - mean_j)^2 by 2 |avg - mean_j| d to first order.
BnStats MergedStats(const std::vector<M>& hs, const std::vector<M>& es, double eps, double u) {
  const int64_t ch = hs.front().cols();
  const auto W = static_cast<double>(hs.size());
  BnStats st;
  st.mean = RV::Zero(ch);   // the merge's running average
  st.emean = RV::Zero(ch);  // and its bound
  RV var_n = RV::Zero(ch), evar_n = RV::Zero(ch), mag = RV::Zero(ch), mean_max = RV::Zero(ch);
  double n = 0;
  for (size_t j = 0; j < hs.size(); ++j) {
    const auto nj = static_cast<double>(hs[j].rows());
    if (nj < 1) continue;
    const BnStats l = TwoPassStats(hs[j], es[j], u);
    const double f = 1.0 / (n + nj);
    for (int64_t k = 0; k < ch; ++k) {
      const double s = l.var(k) + eps;
      const double einv = InvSqrtBound(s, l.evar(k) + u * s, u);
      const double invstd = 1.0 / std::sqrt(s);
      // 1/invstd = sqrt(s) (1 + r), |r| <= einv sqrt(s) + u; squared: 2|r| + r^2 + u; minus eps: u |var|.
      const double r = std::isfinite(einv) ? einv / invstd + u : kInf;
      const double ev = (s * (2 * r + r * r + u) + u * std::abs(l.var(k))) * nj + u * nj * std::abs(l.var(k));
      const double d = st.mean(k) - l.mean(k);
      const double ed = st.emean(k) + l.emean(k) + u * std::abs(d);
      const double wgt = n * nj * f;
      evar_n(k) += ev + (2 * std::abs(d) * ed + ed * ed) * wgt;
      var_n(k) += nj * l.var(k) + d * d * wgt;
      mag(k) += nj * std::abs(l.var(k)) + nj * s + d * d * wgt;
      st.emean(k) = n * f * st.emean(k) + nj * f * l.emean(k);
      st.mean(k) = n * f * st.mean(k) + nj * f * l.mean(k);
      mean_max(k) = std::max(mean_max(k), std::abs(l.mean(k)));
      st.emean(k) += Gamma(5, u) * mean_max(k);
    }
    n += nj;
  }
  evar_n += Gamma(2 * W + 6, u) * mag;
  st.var = var_n / n;
  st.evar = evar_n / n + u * st.var.cwiseAbs();
  st.unb = var_n / (n - 1);
  st.eunb = evar_n / (n - 1) + u * st.unb.cwiseAbs();
  return st;
}

// The running statistics after a forward in training: r' = (1 - f) r + f stat, f and 1 - f rounded to the
// run's type. running_mean/var hold the updated values: |(1 - f) r_old| <= |r_new| + f |stat|.
void RunningStatBounds(const BatchNormOptions& o, const BnStats& st, const double* running_mean,
                       const double* running_var, double u, std::vector<double>* erm, std::vector<double>* erv) {
  const auto ch = static_cast<size_t>(st.mean.size());
  const double f = o.momentum_none ? kInf : o.momentum;
  erm->assign(ch, 0.0);
  erv->assign(ch, 0.0);
  for (size_t kk = 0; kk < ch; ++kk) {
    const auto k = static_cast<Eigen::Index>(kk);
    if (!std::isfinite(f)) {  // momentum=None: f = 1/num_batches_tracked, the new stat's own share
      (*erm)[kk] = st.emean(k) + 4 * u * (std::abs(running_mean[kk]) + std::abs(st.mean(k)));
      (*erv)[kk] = st.eunb(k) + 5 * u * (std::abs(running_var[kk]) + std::abs(st.unb(k)));
      continue;
    }
    (*erm)[kk] = f * st.emean(k) + 4 * u * (std::abs(running_mean[kk]) + 2 * f * std::abs(st.mean(k)));
    (*erv)[kk] = f * st.eunb(k) + 5 * u * (std::abs(running_var[kk]) + 2 * f * std::abs(st.unb(k)));
  }
}

// Normalises c->in (bound c->ein) with the given statistics and applies weight and bias (w, b may be null).
void Normalize(const RV& mean, const RV& emean, const RV& var, const RV& evar, double eps, const double* w,
               const double* b, double u, LayerCache* c) {
  const M& h = c->in;
  const M& e = c->ein;
  const int64_t ch = h.cols();
  const M cen = h.rowwise() - mean;
  const M ecen = (e.rowwise() + emean) + u * Abs(cen);
  c->invstd.resize(ch);
  c->einv.resize(ch);
  for (int64_t k = 0; k < ch; ++k) {
    const double s = var(k) + eps;
    c->invstd(k) = 1.0 / std::sqrt(s);
    c->einv(k) = InvSqrtBound(s, evar(k) + u * s, u);
  }
  c->xhat = cen.array().rowwise() * c->invstd.array();
  c->exhat = (ecen.array().rowwise() * c->invstd.array()).matrix() +
             (Abs(cen).array().rowwise() * c->einv.array()).matrix() +
             (ecen.array().rowwise() * c->einv.array()).matrix() + u * Abs(c->xhat);
  if (!w) {
    c->out = c->xhat;
    c->eout = c->exhat;
    return;
  }
  const RV wr = Eigen::Map<const RV>(w, ch), br = Eigen::Map<const RV>(b, ch);
  c->out = (c->xhat.array().rowwise() * wr.array()).matrix();
  c->out.rowwise() += br;
  // torch may fold it as x * (invstd w) + (b - mean invstd w): its roundings are those of the larger terms.
  const M folded = ((Abs(h).rowwise() + mean.cwiseAbs()).array().rowwise() * (c->invstd.cwiseProduct(wr.cwiseAbs())).array())
                       .matrix();
  c->eout = (c->exhat.array().rowwise() * wr.cwiseAbs().array()).matrix() +
            3 * u * (folded.rowwise() + br.cwiseAbs()) + 2 * u * Abs(c->out);
}

void BatchNormForward(const BatchNormOptions& o, bool batch_stats, const double* w, const double* b,
                      const double* running_mean, const double* running_var, double u, LayerCache* c,
                      std::vector<std::vector<double>>* ebuf, int buffer_base) {
  const int64_t ch = c->in.cols();
  c->batch_stats = batch_stats;
  if (batch_stats) {
    const BnStats st = TwoPassStats(c->in, c->ein, u);
    if (o.track_running_stats && ebuf) {
      RunningStatBounds(o, st, running_mean, running_var, u, &(*ebuf)[static_cast<size_t>(buffer_base)],
                        &(*ebuf)[static_cast<size_t>(buffer_base + 1)]);
    }
    Normalize(st.mean, st.emean, st.var, st.evar, o.eps, w, b, u, c);
  } else {
    Normalize(Eigen::Map<const RV>(running_mean, ch), RV::Zero(ch), Eigen::Map<const RV>(running_var, ch),
              RV::Zero(ch), o.eps, w, b, u, c);
  }
}

// The column sums BatchNorm's input gradient needs, over one or several members' rows, with their bounds:
// sg = sum g, sgx = sum g xhat (g = dy * weight). Bounds are gathered raw (`abs_*`) and finished by Finish
// once the number of terms is known (a sum of n terms in any order, local sums then an all-reduce: g(n + W)).
struct BnGradSums {
  RV sg, esg, abs_g, sgx, esgx, abs_gx;
  void Add(const M& g, const M& eg, const LayerCache& c) {
    const M gx = g.cwiseProduct(c.xhat);
    const RV esgx_j = (eg.cwiseProduct(Abs(c.xhat)) + Abs(g).cwiseProduct(c.exhat) + eg.cwiseProduct(c.exhat)).colwise().sum();
    if (sg.size() == 0) {
      sg = RV::Zero(g.cols());
      esg = abs_g = sgx = esgx = abs_gx = sg;
    }
    sg += g.colwise().sum();
    esg += eg.colwise().sum();
    abs_g += Abs(g).colwise().sum();
    sgx += gx.colwise().sum();
    esgx += esgx_j;
    abs_gx += Abs(gx).colwise().sum();
  }
  void Finish(double n, double extra, double u) {
    esg += Gamma(n + extra, u) * abs_g;
    esgx += Gamma(n + 1 + extra, u) * abs_gx;
  }
};

// BatchNorm's weight and bias gradients of one member's rows (local, as torch and SyncBatchNorm compute them)
// and g = dy * weight with its bound.
void BatchNormAffineGrads(const double* w, const LayerCache& c, const M& d, const M& ed, double u, M* g, M* eg,
                          std::vector<double>* ew, std::vector<double>* eb) {
  const auto n = static_cast<double>(d.rows());
  const int64_t ch = d.cols();
  *g = d;
  *eg = ed;
  if (!w) return;
  const RV wr = Eigen::Map<const RV>(w, ch);
  const RV edw = (ed.cwiseProduct(Abs(c.xhat)) + Abs(d).cwiseProduct(c.exhat) + ed.cwiseProduct(c.exhat)).colwise().sum() +
                 Gamma(n + 1, u) * Abs(d.cwiseProduct(c.xhat)).colwise().sum();
  const RV edb = ed.colwise().sum() + Gamma(n, u) * Abs(d).colwise().sum();
  ew->assign(edw.data(), edw.data() + ch);
  eb->assign(edb.data(), edb.data() + ch);
  *g = d.array().rowwise() * wr.array();
  *eg = (ed.array().rowwise() * wr.cwiseAbs().array()).matrix() + u * Abs(*g);
}

// BatchNorm's input gradient dx = invstd / n (n g - sg - xhat sgx) of one member's rows, n the rows the
// statistics were taken over (every rank's for SyncBatchNorm), with `rounds` roundings relative to each term
// (4 for BatchNorm1d's kernel; SyncBatchNorm's mean_dy, factor_1 = invstd^2 sum_dy_xmu / n and factor_2 take 8).
void BatchNormInputGrad(const LayerCache& c, const M& g, const M& eg, const BnGradSums& s, double n, double rounds,
                        double u, M* dx, M* edx) {
  if (!c.batch_stats) {
    *dx = g.array().rowwise() * c.invstd.array();
    *edx = (eg.array().rowwise() * c.invstd.array()).matrix() + (Abs(g).array().rowwise() * c.einv.array()).matrix() +
           2 * u * Abs(*dx);
    return;
  }
  M inner = (g * n).rowwise() - s.sg;
  inner -= (c.xhat.array().rowwise() * s.sgx.array()).matrix();
  const M ax_sgx = Abs(c.xhat).array().rowwise() * s.sgx.cwiseAbs().array();
  M ein = n * eg;
  ein.rowwise() += s.esg;
  ein += (c.exhat.array().rowwise() * s.sgx.cwiseAbs().array()).matrix() +
         (Abs(c.xhat).array().rowwise() * s.esgx.array()).matrix() +
         (c.exhat.array().rowwise() * s.esgx.array()).matrix();
  M mag = n * Abs(g) + ax_sgx;
  mag.rowwise() += s.sg.cwiseAbs();
  ein += rounds * u * mag;
  *dx = inner.array().rowwise() * (c.invstd.array() / n);
  *edx = ((ein.array().rowwise() * c.invstd.array()) + (Abs(inner).array().rowwise() * c.einv.array()) +
          (ein.array().rowwise() * c.einv.array()))
             .matrix() / n +
         3 * u * Abs(*dx);
}

}  // namespace

void SetFloatBoundProducts(bool on) { float_bound_products.store(on); }

double Gamma(double n, double u) {
  const double nu = n * u;
  return nu >= 1 ? kInf : nu / (1 - nu);
}

void NanToInf(std::vector<double>* bound) {
  for (double& b : *bound) {
    if (std::isnan(b)) b = kInf;
  }
}

namespace {

// One rank's micro-batch in a group analysis: its model (parameters shared, buffers, masks and bypasses its
// own) and batch.
struct Member {
  const Model<double>* m;
  const M* x;
  const core::Tensor* y;
};

// BatchNormForward of a BatchNorm1d layer (or a SyncBatchNorm1d that does not synchronise) of model m whose
// parameters start at pb and buffers at bb.
template <class BN>
void BatchNormLayerForward(const BN& bn, const Model<double>& m, int pb, int bb, double u, LayerCache* c,
                           MicroBatchBounds* r) {
  const BatchNormOptions& o = bn.options();
  BatchNormForward(o, bn.UsesBatchStats(), o.affine ? m.param_data(pb) : nullptr,
                   o.affine ? m.param_data(pb + 1) : nullptr, o.track_running_stats ? m.buffer_data(bb) : nullptr,
                   o.track_running_stats ? m.buffer_data(bb + 1) : nullptr, u, c, &r->buffer, bb);
}

// A Linear's weight as its forward and backward use it: under autocast cast to the low type (exact: the
// recorded float weight rounds the same way in the run).
// A Linear's weight as its product uses it: the parameter itself, or under autocast its rounding to the low
// type (made in *low).
Eigen::Map<const M> LinearWeight(const Model<double>& m, const Linear<double>& lin, int pb, M* low) {
  const Eigen::Map<const M> W(m.param_data(pb), lin.out_features(), lin.in_features());
  if (!m.autocast()) return W;
  *low = W;
  RoundInPlace(low, *m.autocast());
  return Eigen::Map<const M>(low->data(), low->rows(), low->cols());
}

// Under autocast, layer i's output rounded to the low type (RoundedToLow) against the replay's own rounding of
// it: the next layer's input, or the model's output.
void RoundLayerOutput(const Model<double>& m, int i, LayerCache* c) {
  RoundedToLow(*m.autocast(), i + 1 < m.num_layers() ? &m.layer_input(i + 1) : &m.output(), &c->out, &c->eout);
}

// Forward of layer i of one member (any layer but a synchronising SyncBatchNorm). False: no rules.
bool ForwardLayer(const Model<double>& m, int i, int pb, int bb, double u, LayerCache* c, MicroBatchBounds* r) {
  const auto& layer = m.layer(i);
  if (const auto* lin = std::get_if<Linear<double>>(&layer)) {
    // Under autocast x, W and b are cast to the low type (x rounded unless it already holds low values) and
    // the product accumulates in float32: cuBLAS's compute type 32F, and torch's CPU kernels for the forward
    // (mkldnn's and the fallback's, checked against torch 1.13); the output's rounding is the caller's.
    if (m.autocast() && !c->in_low) RoundedToLow(*m.autocast(), nullptr, &c->in, &c->ein);
    const M& h = c->in;
    const M& e = c->ein;
    M low;
    const Eigen::Map<const M> W = LinearWeight(m, *lin, pb, &low);
    const bool up = FloatBoundProduct(h.rows(), lin->out_features(), lin->in_features());
    if (up) {
      c->absW_up = UpFloat(W.cwiseAbs());
      c->absW = M();
    } else {
      c->absW = W.cwiseAbs();
      c->absW_up = MF();
    }
    // The value is the replay's own forward's (the next layer's input, or the model's output: h W^T + b,
    // computed by the model just before), not computed a second time; under autocast, where the bound's chain
    // rounds its values as the run did, and for a bypassed layer, it is computed here.
    const M* kept = nullptr;
    if (!m.autocast() && !m.layer_bypassed(i)) {
      kept = i + 1 < m.num_layers() ? &m.layer_input(i + 1) : &m.output();
      if (kept->rows() != h.rows() || kept->cols() != lin->out_features()) kept = nullptr;
    }
    if (kept) {
      c->out = *kept;
    } else {
      c->out = Mul(h, false, W, true);
    }
    // e |W|^T + g |h| |W|^T as one product.
    const double gIn = Gamma(static_cast<double>(lin->in_features() + 1), u);
    c->eout = up ? BoundProduct(UpFloat(e + gIn * Abs(h)), false, c->absW_up, true)
                 : Mul(M(e + gIn * Abs(h)), false, c->absW, true);
    if (lin->has_bias()) {
      RV b = Eigen::Map<const RV>(m.param_data(pb + 1), lin->out_features());
      if (m.autocast()) b = RoundToLow(b, *m.autocast());
      if (!kept) c->out.rowwise() += b;
      c->eout.rowwise() += Gamma(static_cast<double>(lin->in_features() + 1), u) * b.cwiseAbs();
    }
    return true;
  }
  const M& h = c->in;
  const M& e = c->ein;
  if (std::holds_alternative<ReLU<double>>(layer)) {
    c->out = h.cwiseMax(0.0);
    c->eout = e;
  } else if (std::holds_alternative<Tanh<double>>(layer)) {
    c->out = h.array().tanh().matrix();
    c->eout = e + 2 * u * Abs(c->out);  // tanh is 1-Lipschitz; libm's tanh within 1 ulp, plus the rounding
  } else if (const auto* dr = std::get_if<Dropout<double>>(&layer)) {
    // Under autocast torch scales by 1/(1-p) rounded to the low type, which the replay's mask does not.
    if (c->in_low && dr->mask().size() != 0) return false;
    if (dr->mask().size() == 0) {
      c->out = h;
      c->eout = e;
    } else {
      c->out = h.cwiseProduct(dr->mask());
      c->eout = e.cwiseProduct(dr->mask().cwiseAbs()) + 2 * u * Abs(c->out);
    }
  } else if (const auto* bn = std::get_if<BatchNorm1d<double>>(&layer)) {
    BatchNormLayerForward(*bn, m, pb, bb, u, c, r);
  } else if (const auto* sbn = std::get_if<SyncBatchNorm1d<double>>(&layer)) {  // not synchronising: BatchNorm1d
    BatchNormLayerForward(*sbn, m, pb, bb, u, c, r);
  } else {
    return false;
  }
  return true;
}

// The loss of one member's output (bound e) and d(loss * loss_scale)/d(out) with its bound.
void LossBounds(const Model<double>& m, const M& h, const M& e, const core::Tensor& y, double loss_scale, double u,
                double* loss, M* d, M* ed) {
  const auto N = static_cast<double>(h.size());
  if (m.loss() == "mse") {
    M target(h.rows(), h.cols());
    for (Eigen::Index k = 0; k < target.size(); ++k) target.data()[k] = y.data[static_cast<size_t>(k)];
    const M diff = h - target;
    const M ediff = e + u * Abs(diff);
    *loss = (2 * Abs(diff).cwiseProduct(ediff) + ediff.cwiseProduct(ediff)).sum() / N +
            Gamma(N + 1, u) * diff.squaredNorm() / N;
    *d = diff * (2.0 / N * loss_scale);
    *ed = ediff * (2.0 / N * std::abs(loss_scale)) + 3 * u * Abs(*d);
    return;
  }
  const auto B = static_cast<double>(h.rows());
  const auto C = static_cast<double>(h.cols());
  const double gscale = std::abs(loss_scale) / B;
  d->resize(h.rows(), h.cols());
  ed->resize(h.rows(), h.cols());
  double loss_sum = 0;
  *loss = 0;
  for (Eigen::Index i = 0; i < h.rows(); ++i) {
    const double mx = h.row(i).maxCoeff();
    const double lse = std::log((h.row(i).array() - mx).exp().sum());
    const double emax = e.row(i).maxCoeff();
    const auto t = static_cast<Eigen::Index>(y.data[static_cast<size_t>(i)]);
    for (Eigen::Index j = 0; j < h.cols(); ++j) {
      const double logp = h(i, j) - mx - lse;
      // log_softmax: 1-Lipschitz in each input plus the max-norm of all (logsumexp), and the roundings of
      // the exps, their sum (C terms), the log and the two subtractions.
      const double elogp = e(i, j) + emax + (C + 3) * u + 3 * u * (std::abs(h(i, j) - mx) + std::abs(lse));
      const double p = std::exp(logp);
      const double ep = p * std::expm1(elogp) + 2 * u * p;
      (*d)(i, j) = (p - (j == t ? 1.0 : 0.0)) * loss_scale / B;
      (*ed)(i, j) = gscale * ep + 3 * u * std::abs((*d)(i, j)) + u * gscale;
      if (j == t) {
        *loss += elogp / B;
        loss_sum += std::abs(logp);
      }
    }
  }
  *loss += Gamma(B + 1, u) * loss_sum / B;
}

// Backward of layer i of one member (any layer but a synchronising SyncBatchNorm): d, ed become dx, edx.
void BackwardLayer(const Model<double>& m, int i, int pb, const LayerCache& c, double u, M* d, M* ed,
                   MicroBatchBounds* r) {
  const auto& layer = m.layer(i);
  M dx, edx;
  if (const auto* lin = std::get_if<Linear<double>>(&layer)) {
    M low_w;
    const Eigen::Map<const M> W = LinearWeight(m, *lin, pb, &low_w);
    const double B = static_cast<double>(d->rows());
    // Under autocast dY, dX and dW are products of low-valued operands rounded to the low type. Their
    // accumulation is bounded as if it ran in the low type itself (torch 1.13's CPU fallback accumulates dX
    // and dW in bfloat16, each product rounded), g_low(n + 2) covering the sums, the products' and the
    // replay's own rounding; the forward's float32 accumulation does not hold here.
    const auto low = m.autocast();
    const double ul = low ? core::UnitRoundoff(*low) : 0.0;
    const double gB = low ? Gamma(B + 2, ul) : Gamma(B, u);
    const double gOut = low ? Gamma(static_cast<double>(lin->out_features()) + 2, ul)
                            : Gamma(static_cast<double>(lin->out_features()), u);
    // Each of the n products and sums in the low type may underflow: n + 2 times its absolute error.
    const double eta = low ? LowUnderflow(*low) : 0.0;
    // e(dy)^T |x| + |dy|^T e(x) + e(dy)^T e(x) + g(B) |dy|^T |x| as two products.
    // (written straight into the gradient's bound: a weight's size each)
    auto& gw = r->grad[static_cast<size_t>(pb)];
    gw.resize(static_cast<size_t>(lin->out_features() * lin->in_features()));
    Eigen::Map<M> edW(gw.data(), lin->out_features(), lin->in_features());
    // [ed + g|dy|, |dy| + ed]^T [|x|; e(x)]: the two products as one over 2B rows (the weight's bound written
    // once, not written, read back and added to).
    const Eigen::Index rows = d->rows();
    M left(2 * rows, d->cols()), right(2 * rows, c.in.cols());
    left.topRows(rows) = *ed + gB * Abs(*d);
    left.bottomRows(rows) = Abs(*d) + *ed;
    right.topRows(rows) = Abs(c.in);
    right.bottomRows(rows) = c.ein;
    if (FloatBoundProduct(lin->out_features(), lin->in_features(), 2 * rows)) {
      BoundProduct(UpFloat(left), true, UpFloat(right), false, edW);
    } else {
      MulInto(left, true, right, false, 0.0, edW);
    }
    if (eta != 0) edW.array() += (B + 2) * eta;
    if (lin->has_bias()) {
      RV edb = ed->colwise().sum() + gB * Abs(*d).colwise().sum();
      edb.array() += (B + 2) * eta;
      r->grad[static_cast<size_t>(pb + 1)].assign(edb.data(), edb.data() + edb.size());
    }
    if (i == 0) {  // the model's input has no gradient to bound
      *d = M();
      *ed = M();
      return;
    }
    // dx is the replay's own backward's (Model::SetKeepLayerInputGrads), not computed a second time, but under
    // autocast (the chain rounds as the run did) or where the model kept none.
    const M& kept = m.layer_input_grad(i);
    if (!low && !m.layer_bypassed(i) && kept.rows() == d->rows() && kept.cols() == lin->in_features()) {
      dx = kept;
    } else {
      dx = Mul(*d, false, W, false);
    }
    // |W| as ForwardLayer kept it
    edx = c.absW_up.size() != 0 ? BoundProduct(UpFloat(*ed + gOut * Abs(*d)), false, c.absW_up, false)
                                : Mul(M(*ed + gOut * Abs(*d)), false, c.absW, false);
    if (low) {
      RoundInPlace(&dx, *low);
      edx.array() += (static_cast<double>(lin->out_features()) + 2) * eta;
    }
  } else if (std::holds_alternative<ReLU<double>>(layer)) {
    // Where the input's sign is uncertain (|x| <= e(x)) the run may have passed or blocked dy.
    const auto pass = (c.in.array() > 0).cast<double>();
    const auto unsure = (c.in.array().abs() <= c.ein.array()).cast<double>();
    dx = (d->array() * pass).matrix();
    edx = (ed->array() * pass + unsure * (Abs(*d).array() + ed->array())).matrix();
  } else if (std::holds_alternative<Tanh<double>>(layer)) {
    const auto y2 = c.out.array().square();
    dx = (d->array() * (1 - y2)).matrix();
    edx = (ed->array() * (1 - y2) + (Abs(*d).array() + ed->array()) * 2 * c.out.array().abs() * c.eout.array() +
           c.eout.array().square() * (Abs(*d).array() + ed->array()) + 3 * u * Abs(*d).array() * (1 + y2))
              .matrix();
  } else if (const auto* dr = std::get_if<Dropout<double>>(&layer)) {
    dx = dr->mask().size() == 0 ? *d : M(d->cwiseProduct(dr->mask()));
    edx = dr->mask().size() == 0 ? *ed : M(ed->cwiseProduct(dr->mask().cwiseAbs()) + 2 * u * Abs(dx));
  } else {  // BatchNorm1d, or a SyncBatchNorm1d that does not synchronise
    const bool affine = std::visit([](const auto& l) { return l.num_params() > 0; }, layer);
    std::vector<double> ew, eb;
    M g, eg;
    BatchNormAffineGrads(affine ? m.param_data(pb) : nullptr, c, *d, *ed, u, &g, &eg, &ew, &eb);
    BnGradSums sums;
    sums.Add(g, eg, c);
    const auto n = static_cast<double>(d->rows());
    sums.Finish(n, 0, u);
    BatchNormInputGrad(c, g, eg, sums, n, 4, u, &dx, &edx);
    if (affine) {
      r->grad[static_cast<size_t>(pb)] = std::move(ew);
      r->grad[static_cast<size_t>(pb + 1)] = std::move(eb);
    }
  }
  // Autocast: the gradient of a low-valued input is rounded to the low type (ReLU's is already low-valued).
  if (c.in_low && !std::holds_alternative<Linear<double>>(layer) && !std::holds_alternative<ReLU<double>>(layer)) {
    GradRoundedToLow(*m.autocast(), &dx, &edx);
  }
  *d = std::move(dx);
  *ed = std::move(edx);
}

bool GroupBounds(const std::vector<Member>& ms, double loss_scale, double u, std::vector<MicroBatchBounds>* out) {
  const Model<double>& m0 = *ms.front().m;
  const size_t J = ms.size();
  const int nl = m0.num_layers();
  std::vector<int> pbase(static_cast<size_t>(nl)), bbase(static_cast<size_t>(nl));
  std::vector<bool> synced(static_cast<size_t>(nl), false);
  int np = 0, nb = 0;
  double rows = 0;
  for (const Member& mb : ms) rows += static_cast<double>(mb.x->rows());
  for (int i = 0; i < nl; ++i) {
    const auto ii = static_cast<size_t>(i);
    pbase[ii] = np;
    bbase[ii] = nb;
    np += std::visit([](const auto& l) { return l.num_params(); }, m0.layer(i));
    nb += std::visit([](const auto& l) { return l.num_buffers(); }, m0.layer(i));
    if (const auto* sbn = std::get_if<SyncBatchNorm1d<double>>(&m0.layer(i))) {
      // SyncBatchNorm synchronises in training over a group of more than one rank; its rules need every rank.
      const core::SyncBnGroup* group = m0.sync_bn_group();
      const bool syncs = sbn->Syncs(group);
      if (syncs && static_cast<int>(J) != group->world()) return false;
      synced[ii] = syncs;
      for (const Member& mb : ms) {
        if (syncs && mb.m->layer_bypassed(i)) return false;
      }
    }
  }
  std::vector<MicroBatchBounds> r(J);
  std::vector<std::vector<LayerCache>> cache(J, std::vector<LayerCache>(static_cast<size_t>(nl)));
  std::vector<M> h(J), e(J);
  std::vector<bool> low(J, false);  // autocast: member j's activations hold low-precision values
  for (size_t j = 0; j < J; ++j) {
    r[j].grad.resize(static_cast<size_t>(np));
    r[j].buffer.resize(static_cast<size_t>(nb));
    h[j] = *ms[j].x;
    e[j] = M::Zero(h[j].rows(), h[j].cols());
  }
  for (int i = 0; i < nl; ++i) {
    const auto ii = static_cast<size_t>(i);
    const int pb = pbase[ii], bb = bbase[ii];
    for (size_t j = 0; j < J; ++j) {
      cache[j][ii].in = h[j];
      cache[j][ii].ein = e[j];
      cache[j][ii].in_low = low[j];
    }
    if (synced[ii]) {
      const auto& sbn = std::get<SyncBatchNorm1d<double>>(m0.layer(i));
      const BatchNormOptions& o = sbn.options();
      const BnStats st = MergedStats(h, e, o.eps, u);
      for (size_t j = 0; j < J; ++j) {
        const Model<double>& m = *ms[j].m;
        if (o.track_running_stats) {
          RunningStatBounds(o, st, m.buffer_data(bb), m.buffer_data(bb + 1), u, &r[j].buffer[static_cast<size_t>(bb)],
                            &r[j].buffer[static_cast<size_t>(bb + 1)]);
        }
        LayerCache& c = cache[j][ii];
        c.batch_stats = true;
        Normalize(st.mean, st.emean, st.var, st.evar, o.eps, o.affine ? m.param_data(pb) : nullptr,
                  o.affine ? m.param_data(pb + 1) : nullptr, u, &c);
        // Under autocast a low input's output is rounded to the low type (statistics exchanged in float).
        if (m.autocast() && c.in_low) RoundLayerOutput(m, i, &c);
      }
    } else {
      for (size_t j = 0; j < J; ++j) {
        LayerCache& c = cache[j][ii];
        if (ms[j].m->layer_bypassed(i)) {
          c.out = c.in;
          c.eout = c.ein;
        } else if (!ForwardLayer(*ms[j].m, i, pb, bb, u, &c, &r[j])) {
          return false;
        } else if (const Model<double>& m = *ms[j].m; m.autocast()) {
          // A Linear's output, and that of a layer whose input was low, is rounded to the low type (ReLU's
          // is low-valued already); the replay's own rounding is the next layer's input or the output.
          const bool linear = std::holds_alternative<Linear<double>>(m.layer(i));
          if (linear || (c.in_low && !std::holds_alternative<ReLU<double>>(m.layer(i)))) RoundLayerOutput(m, i, &c);
          low[j] = low[j] || linear;
        }
      }
    }
    for (size_t j = 0; j < J; ++j) {
      h[j] = cache[j][ii].out;
      e[j] = cache[j][ii].eout;
    }
  }
  std::vector<M> d(J), ed(J);
  for (size_t j = 0; j < J; ++j) {
    LossBounds(*ms[j].m, h[j], e[j], *ms[j].y, loss_scale, u, &r[j].loss, &d[j], &ed[j]);
    if (low[j]) GradRoundedToLow(*ms[j].m->autocast(), &d[j], &ed[j]);  // the backward of the loss's cast
  }
  // Backward, last layer first.
  for (int i = nl; i-- > 0;) {
    const auto ii = static_cast<size_t>(i);
    const int pb = pbase[ii];
    if (!synced[ii]) {
      for (size_t j = 0; j < J; ++j) {
        if (!ms[j].m->layer_bypassed(i)) BackwardLayer(*ms[j].m, i, pb, cache[j][ii], u, &d[j], &ed[j], &r[j]);
      }
      continue;
    }
    // SyncBatchNorm: weight and bias gradients from each rank's rows; the input gradient from the sums of
    // every rank's (local sums, then an all-reduce over the group).
    const bool affine = std::get<SyncBatchNorm1d<double>>(m0.layer(i)).options().affine;
    std::vector<M> g(J), eg(J);
    BnGradSums sums;
    for (size_t j = 0; j < J; ++j) {
      std::vector<double> ew, eb;
      BatchNormAffineGrads(affine ? ms[j].m->param_data(pb) : nullptr, cache[j][ii], d[j], ed[j], u, &g[j], &eg[j],
                           &ew, &eb);
      if (affine) {
        r[j].grad[static_cast<size_t>(pb)] = std::move(ew);
        r[j].grad[static_cast<size_t>(pb + 1)] = std::move(eb);
      }
      sums.Add(g[j], eg[j], cache[j][ii]);
    }
    sums.Finish(rows, static_cast<double>(J), u);
    for (size_t j = 0; j < J; ++j) {
      BatchNormInputGrad(cache[j][ii], g[j], eg[j], sums, rows, 8, u, &d[j], &ed[j]);
      if (cache[j][ii].in_low) GradRoundedToLow(*ms[j].m->autocast(), &d[j], &ed[j]);
    }
  }
  for (MicroBatchBounds& b : r) {
    if (std::isnan(b.loss)) b.loss = kInf;
    for (auto& v : b.grad) NanToInf(&v);
    for (auto& v : b.buffer) NanToInf(&v);
  }
  *out = std::move(r);
  return true;
}

}  // namespace

bool MicroBatchErrorBounds(const Model<double>& m, const Matrix<double>& x, const core::Tensor& y,
                           double loss_scale, double u, MicroBatchBounds* out) {
  std::vector<MicroBatchBounds> r;
  if (!GroupBounds({Member{&m, &x, &y}}, loss_scale, u, &r)) return false;
  *out = std::move(r.front());
  return true;
}

bool GroupMicroBatchErrorBounds(const std::vector<const Model<double>*>& models,
                                const std::vector<const Matrix<double>*>& xs, const std::vector<const core::Tensor*>& ys,
                                double loss_scale, double u, std::vector<MicroBatchBounds>* out) {
  if (models.empty() || models.size() != xs.size() || models.size() != ys.size()) return false;
  std::vector<Member> ms;
  ms.reserve(models.size());
  for (size_t j = 0; j < models.size(); ++j) ms.push_back(Member{models[j], xs[j], ys[j]});
  return GroupBounds(ms, loss_scale, u, out);
}

}  // namespace ddpcheck::ref
