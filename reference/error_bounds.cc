// Forward, loss and backward rules of the running error analysis (reference/error_bounds.h). Each layer's
// values are recomputed here in double from its input (Model::layer_input) and the model's parameters; each
// value v carries e(v) >= |v_run - v_exact| for a run in unit roundoff u that starts from the same state.
#include "reference/error_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>

namespace ddpcheck::ref {

namespace {

using M = Matrix<double>;
using RV = RowVector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// What the backward rules need of each layer's forward.
struct LayerCache {
  M in, ein;    // the layer's input and its bound
  M out, eout;  // its output and bound
  // BatchNorm1d: xhat and the inverse standard deviation (with bounds), and whether batch stats were used.
  M xhat, exhat;
  RV invstd, einv;
  bool batch_stats = false;
};

M Abs(const M& a) { return a.cwiseAbs(); }

// e of 1/sqrt(s) given e of s: |1/sqrt(s') - 1/sqrt(s)| <= es / (2 (s - es)^(3/2)) for es < s, plus the
// roundings of sqrt and the division (3u relative).
double InvSqrtBound(double s, double es, double u) {
  if (es >= s) return kInf;
  return es / (2.0 * std::pow(s - es, 1.5)) + 3.0 * u / std::sqrt(s);
}

void BatchNormForward(const BatchNorm1d<double>& bn, const double* w, const double* b, const double* running_mean,
                      const double* running_var, double u, LayerCache* c, std::vector<std::vector<double>>* ebuf,
                      int buffer_base) {
  const M& h = c->in;
  const M& e = c->ein;
  const auto n = static_cast<double>(h.rows());
  const int64_t ch = bn.num_features();
  const double eps = bn.options().eps;
  RV mean, emean, var, evar;
  M cen, ecen;
  c->batch_stats = bn.UsesBatchStats();
  if (c->batch_stats) {
    mean = h.colwise().sum() / n;
    emean = e.colwise().sum() / n + Gamma(n + 1, u) * Abs(h).colwise().sum() / n;
    cen = h.rowwise() - mean;
    ecen = (e.rowwise() + emean) + u * Abs(cen);
    const RV sumsq = cen.cwiseProduct(cen).colwise().sum();
    // torch's CPU kernel takes two passes (mean, then the sum of squared deviations, accumulated in double for
    // float): a mean off by d changes sum((x - mean - d)^2) = sum(c^2) + n d^2 (sum(c) = 0), so the mean's
    // error enters only squared, and the inputs' errors as 2 |c| e.
    var = sumsq / n;
    const M ec_own = e + u * Abs(cen);
    evar = (2.0 * Abs(cen).cwiseProduct(ec_own) + ec_own.cwiseProduct(ec_own)).colwise().sum() / n +
           emean.cwiseProduct(emean) + Gamma(n + 2, u) * sumsq / n;
    if (bn.options().track_running_stats && ebuf) {
      // The running stats after this forward: r' = (1 - f) r + f stat, f and 1 - f rounded to the run's type.
      const double f = bn.options().momentum_none ? kInf : bn.options().momentum;
      auto& erm = (*ebuf)[static_cast<size_t>(buffer_base)];
      auto& erv = (*ebuf)[static_cast<size_t>(buffer_base + 1)];
      erm.assign(static_cast<size_t>(ch), 0.0);
      erv.assign(static_cast<size_t>(ch), 0.0);
      for (int64_t k = 0; k < ch; ++k) {
        const auto kk = static_cast<size_t>(k);
        if (!std::isfinite(f)) {  // momentum=None: f = 1/num_batches_tracked, the new stat's own share
          erm[kk] = emean(k) + 4 * u * (std::abs(running_mean[k]) + std::abs(mean(k)));
          erv[kk] = evar(k) * n / (n - 1) + 5 * u * (std::abs(running_var[k]) + sumsq(k) / (n - 1));
          continue;
        }
        // running_mean/var hold the updated values: |(1 - f) r_old| <= |r_new| + f |stat|.
        const double unb = sumsq(k) / (n - 1);
        erm[kk] = f * emean(k) + 4 * u * (std::abs(running_mean[k]) + 2 * f * std::abs(mean(k)));
        erv[kk] = f * evar(k) * n / (n - 1) + 5 * u * (std::abs(running_var[k]) + 2 * f * unb);
      }
    }
  } else {
    mean = Eigen::Map<const RV>(running_mean, ch);
    var = Eigen::Map<const RV>(running_var, ch);
    emean = RV::Zero(ch);
    evar = RV::Zero(ch);
    cen = h.rowwise() - mean;
    ecen = e + u * Abs(cen);
  }
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

// Backward of BatchNorm1d; returns dx and its bound, fills the weight and bias grads' bounds.
void BatchNormBackward(const double* w, const LayerCache& c, const M& d, const M& ed, double u, M* dx, M* edx,
                       std::vector<double>* ew, std::vector<double>* eb) {
  const auto n = static_cast<double>(d.rows());
  const int64_t ch = d.cols();
  M g = d, eg = ed;
  if (w) {
    const RV wr = Eigen::Map<const RV>(w, ch);
    const RV edw = (ed.cwiseProduct(Abs(c.xhat)) + Abs(d).cwiseProduct(c.exhat) + ed.cwiseProduct(c.exhat)).colwise().sum() +
                   Gamma(n + 1, u) * Abs(d.cwiseProduct(c.xhat)).colwise().sum();
    const RV edb = ed.colwise().sum() + Gamma(n, u) * Abs(d).colwise().sum();
    ew->assign(edw.data(), edw.data() + ch);
    eb->assign(edb.data(), edb.data() + ch);
    g = d.array().rowwise() * wr.array();
    eg = (ed.array().rowwise() * wr.cwiseAbs().array()).matrix() + u * Abs(g);
  }
  if (!c.batch_stats) {
    *dx = g.array().rowwise() * c.invstd.array();
    *edx = (eg.array().rowwise() * c.invstd.array()).matrix() + (Abs(g).array().rowwise() * c.einv.array()).matrix() +
           2 * u * Abs(*dx);
    return;
  }
  const RV sg = g.colwise().sum();
  const RV esg = eg.colwise().sum() + Gamma(n, u) * Abs(g).colwise().sum();
  const M gx = g.cwiseProduct(c.xhat);
  const RV sgx = gx.colwise().sum();
  const RV esgx = (eg.cwiseProduct(Abs(c.xhat)) + Abs(g).cwiseProduct(c.exhat) + eg.cwiseProduct(c.exhat)).colwise().sum() +
                  Gamma(n + 1, u) * Abs(gx).colwise().sum();
  M inner = (g * n).rowwise() - sg;
  inner -= (c.xhat.array().rowwise() * sgx.array()).matrix();
  const M ax_sgx = Abs(c.xhat).array().rowwise() * sgx.cwiseAbs().array();
  M ein = n * eg;
  ein.rowwise() += esg;
  ein += (c.exhat.array().rowwise() * sgx.cwiseAbs().array()).matrix() +
         (Abs(c.xhat).array().rowwise() * esgx.array()).matrix() +
         (c.exhat.array().rowwise() * esgx.array()).matrix();
  M mag = n * Abs(g) + ax_sgx;
  mag.rowwise() += sg.cwiseAbs();
  ein += 4 * u * mag;
  *dx = inner.array().rowwise() * (c.invstd.array() / n);
  *edx = ((ein.array().rowwise() * c.invstd.array()) + (Abs(inner).array().rowwise() * c.einv.array()) +
          (ein.array().rowwise() * c.einv.array()))
             .matrix() / n +
         3 * u * Abs(*dx);
}

}  // namespace

double Gamma(double n, double u) {
  const double nu = n * u;
  return nu >= 1 ? kInf : nu / (1 - nu);
}

bool MicroBatchErrorBounds(const Model<double>& m, const Matrix<double>& x, const core::Tensor& y,
                           double loss_scale, double u, MicroBatchBounds* out) {
  if (m.autocast()) return false;
  const int nl = m.num_layers();
  std::vector<int> pbase(static_cast<size_t>(nl)), bbase(static_cast<size_t>(nl));
  int np = 0, nb = 0;
  for (int i = 0; i < nl; ++i) {
    if (std::holds_alternative<SyncBatchNorm1d<double>>(m.layer(i))) return false;
    pbase[static_cast<size_t>(i)] = np;
    bbase[static_cast<size_t>(i)] = nb;
    np += std::visit([](const auto& l) { return l.num_params(); }, m.layer(i));
    nb += std::visit([](const auto& l) { return l.num_buffers(); }, m.layer(i));
  }
  MicroBatchBounds r;
  r.grad.resize(static_cast<size_t>(np));
  r.buffer.resize(static_cast<size_t>(nb));
  std::vector<LayerCache> cache(static_cast<size_t>(nl));
  M h = x, e = M::Zero(x.rows(), x.cols());
  for (int i = 0; i < nl; ++i) {
    LayerCache& c = cache[static_cast<size_t>(i)];
    c.in = h;
    c.ein = e;
    const int pb = pbase[static_cast<size_t>(i)];
    if (m.layer_bypassed(i)) {
      c.out = h;
      c.eout = e;
      continue;
    }
    const auto& layer = m.layer(i);
    if (const auto* lin = std::get_if<Linear<double>>(&layer)) {
      const auto W = Eigen::Map<const M>(m.param_data(pb), lin->out_features(), lin->in_features());
      c.out = h * W.transpose();
      c.eout = e * W.cwiseAbs().transpose() + Gamma(static_cast<double>(lin->in_features() + 1), u) * (Abs(h) * W.cwiseAbs().transpose());
      if (lin->has_bias()) {
        const auto b = Eigen::Map<const RV>(m.param_data(pb + 1), lin->out_features());
        c.out.rowwise() += b;
        c.eout.rowwise() += Gamma(static_cast<double>(lin->in_features() + 1), u) * b.cwiseAbs();
      }
    } else if (std::holds_alternative<ReLU<double>>(layer)) {
      c.out = h.cwiseMax(0.0);
      c.eout = e;
    } else if (std::holds_alternative<Tanh<double>>(layer)) {
      c.out = h.array().tanh().matrix();
      c.eout = e + 2 * u * Abs(c.out);  // tanh is 1-Lipschitz; libm's tanh within 1 ulp, plus the rounding
    } else if (const auto* dr = std::get_if<Dropout<double>>(&layer)) {
      if (dr->mask().size() == 0) {
        c.out = h;
        c.eout = e;
      } else {
        c.out = h.cwiseProduct(dr->mask());
        c.eout = e.cwiseProduct(dr->mask().cwiseAbs()) + 2 * u * Abs(c.out);
      }
    } else if (const auto* bn = std::get_if<BatchNorm1d<double>>(&layer)) {
      const bool affine = bn->options().affine;
      const int bb = bbase[static_cast<size_t>(i)];
      const bool tracked = bn->options().track_running_stats;
      BatchNormForward(*bn, affine ? m.param_data(pb) : nullptr, affine ? m.param_data(pb + 1) : nullptr,
                       tracked ? m.buffer_data(bb) : nullptr, tracked ? m.buffer_data(bb + 1) : nullptr, u, &c,
                       &r.buffer, bb);
    } else {
      return false;
    }
    h = c.out;
    e = c.eout;
  }
  // The loss and d(loss * loss_scale)/d(out).
  M d, ed;
  const auto N = static_cast<double>(h.size());
  if (m.loss() == "mse") {
    M target(h.rows(), h.cols());
    for (Eigen::Index k = 0; k < target.size(); ++k) target.data()[k] = y.data[static_cast<size_t>(k)];
    const M diff = h - target;
    const M ediff = e + u * Abs(diff);
    r.loss = (2 * Abs(diff).cwiseProduct(ediff) + ediff.cwiseProduct(ediff)).sum() / N +
             Gamma(N + 1, u) * diff.squaredNorm() / N;
    d = diff * (2.0 / N * loss_scale);
    ed = ediff * (2.0 / N * std::abs(loss_scale)) + 3 * u * Abs(d);
  } else {
    const auto B = static_cast<double>(h.rows());
    const auto C = static_cast<double>(h.cols());
    const double gscale = std::abs(loss_scale) / B;
    d.resize(h.rows(), h.cols());
    ed.resize(h.rows(), h.cols());
    double loss_sum = 0;
    r.loss = 0;
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
        d(i, j) = (p - (j == t ? 1.0 : 0.0)) * loss_scale / B;
        ed(i, j) = gscale * ep + 3 * u * std::abs(d(i, j)) + u * gscale;
        if (j == t) {
          r.loss += elogp / B;
          loss_sum += std::abs(logp);
        }
      }
    }
    r.loss += Gamma(B + 1, u) * loss_sum / B;
  }
  // Backward, last layer first.
  for (int i = nl; i-- > 0;) {
    if (m.layer_bypassed(i)) continue;
    const LayerCache& c = cache[static_cast<size_t>(i)];
    const int pb = pbase[static_cast<size_t>(i)];
    const auto& layer = m.layer(i);
    M dx, edx;
    if (const auto* lin = std::get_if<Linear<double>>(&layer)) {
      const auto W = Eigen::Map<const M>(m.param_data(pb), lin->out_features(), lin->in_features());
      const double B = static_cast<double>(d.rows());
      const M edW = ed.transpose() * Abs(c.in) + Abs(d).transpose() * c.ein + ed.transpose() * c.ein +
                    Gamma(B, u) * (Abs(d).transpose() * Abs(c.in));
      r.grad[static_cast<size_t>(pb)].assign(edW.data(), edW.data() + edW.size());
      if (lin->has_bias()) {
        const RV edb = ed.colwise().sum() + Gamma(B, u) * Abs(d).colwise().sum();
        r.grad[static_cast<size_t>(pb + 1)].assign(edb.data(), edb.data() + edb.size());
      }
      dx = d * W;
      edx = ed * W.cwiseAbs() + Gamma(static_cast<double>(lin->out_features()), u) * (Abs(d) * W.cwiseAbs());
    } else if (std::holds_alternative<ReLU<double>>(layer)) {
      // Where the input's sign is uncertain (|x| <= e(x)) the run may have passed or blocked dy.
      const auto pass = (c.in.array() > 0).cast<double>();
      const auto unsure = (c.in.array().abs() <= c.ein.array()).cast<double>();
      dx = (d.array() * pass).matrix();
      edx = (ed.array() * pass + unsure * (Abs(d).array() + ed.array())).matrix();
    } else if (std::holds_alternative<Tanh<double>>(layer)) {
      const auto y2 = c.out.array().square();
      dx = (d.array() * (1 - y2)).matrix();
      edx = (ed.array() * (1 - y2) + (Abs(d).array() + ed.array()) * 2 * c.out.array().abs() * c.eout.array() +
             c.eout.array().square() * (Abs(d).array() + ed.array()) + 3 * u * Abs(d).array() * (1 + y2))
                .matrix();
    } else if (const auto* dr = std::get_if<Dropout<double>>(&layer)) {
      dx = dr->mask().size() == 0 ? d : M(d.cwiseProduct(dr->mask()));
      edx = dr->mask().size() == 0 ? ed : M(ed.cwiseProduct(dr->mask().cwiseAbs()) + 2 * u * Abs(dx));
    } else if (const auto* bn = std::get_if<BatchNorm1d<double>>(&layer)) {
      const bool affine = bn->options().affine;
      std::vector<double> ew, eb;
      BatchNormBackward(affine ? m.param_data(pb) : nullptr, c, d, ed, u, &dx, &edx, &ew, &eb);
      if (affine) {
        r.grad[static_cast<size_t>(pb)] = std::move(ew);
        r.grad[static_cast<size_t>(pb + 1)] = std::move(eb);
      }
    }
    d = std::move(dx);
    ed = std::move(edx);
  }
  *out = std::move(r);
  return true;
}

}  // namespace ddpcheck::ref
