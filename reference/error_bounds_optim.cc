// Optimizer rules of the running error analysis (reference/error_bounds.h): one SGD / Adam / AdamW step of one
// parameter from an exact state, with a gradient known to within eg. Every Python scalar torch rounds to the
// run's type (momentum, 1 - dampening, betas, eps, lr, step size) adds u times the term it multiplies.
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "reference/error_bounds.h"

namespace ddpcheck::ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The named state's error bound, or nullptr where none is given; Prior reads element k of it (0 beyond).
const std::vector<double>* PriorOf(const std::map<std::string, std::vector<double>>* err, const char* state) {
  if (!err) return nullptr;
  auto it = err->find(state);
  return it == err->end() ? nullptr : &it->second;
}
double Prior(const std::vector<double>* err, size_t k) { return !err || k >= err->size() ? 0.0 : (*err)[k]; }

// Elements per piece of the rules' work on every core (each element's rule reads and writes only element k).
constexpr int64_t kChunk = int64_t{1} << 15;

void SgdBounds(const core::OptimizerSpec& s, double lr, const double* p, const double* g, const std::vector<double>& eg,
               int64_t n, const core::ParamState<double>& before,
               const std::map<std::string, std::vector<double>>* before_err, double u, std::vector<double>* ep,
               std::map<std::string, std::vector<double>>* estate) {
  const bool first = before.momentum_buffer.empty();
  std::vector<double>* ebuf = nullptr;
  if (s.momentum != 0) {
    ebuf = &(*estate)["momentum_buffer"];
    ebuf->assign(static_cast<size_t>(n), 0.0);
  }
  const std::vector<double>* prior_buf = PriorOf(before_err, "momentum_buffer");
  core::ParallelForChunks(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto k = static_cast<size_t>(i);
      double d = s.maximize ? -g[i] : g[i];
      double ed = eg[k];
      if (s.weight_decay != 0) {
        d += s.weight_decay * p[i];
        ed += 2 * u * (std::abs(d) + s.weight_decay * std::abs(p[i]));
      }
      if (s.momentum != 0) {
        double buf, ebuf_k;
        if (first) {
          buf = d;
          ebuf_k = ed;
        } else {
          const double old = before.momentum_buffer[k];
          buf = old * s.momentum + (1 - s.dampening) * d;
          ebuf_k = s.momentum * Prior(prior_buf, k) + (1 - s.dampening) * ed +
                   3 * u * (std::abs(old) * s.momentum + (1 - s.dampening) * std::abs(d));
        }
        (*ebuf)[k] = ebuf_k;
        if (s.nesterov) {
          ed = ed + s.momentum * ebuf_k + 3 * u * (std::abs(d) + s.momentum * std::abs(buf));
          d = d + s.momentum * buf;
        } else {
          d = buf;
          ed = ebuf_k;
        }
      }
      const double np = p[i] - lr * d;
      (*ep)[k] = lr * ed + 2 * u * (std::abs(np) + lr * std::abs(d));
    }
  });
}

void AdamBounds(const core::OptimizerSpec& s, bool decoupled, double lr, const double* p, const double* g,
                const std::vector<double>& eg, int64_t n, const core::ParamState<double>& before,
                const std::map<std::string, std::vector<double>>* before_err, double u, std::vector<double>* ep,
                std::map<std::string, std::vector<double>>* estate) {
  auto& em_out = (*estate)["exp_avg"];
  auto& ev_out = (*estate)["exp_avg_sq"];
  em_out.assign(static_cast<size_t>(n), 0.0);
  ev_out.assign(static_cast<size_t>(n), 0.0);
  const double step = static_cast<double>(before.step) + 1;
  const double bc1 = 1 - std::pow(s.beta1, step);
  const double bc2_sqrt = std::sqrt(1 - std::pow(s.beta2, step));
  const double step_size = lr / bc1;
  const bool fresh = before.exp_avg.empty();
  const std::vector<double>* prior_m = PriorOf(before_err, "exp_avg");
  const std::vector<double>* prior_v = PriorOf(before_err, "exp_avg_sq");
  core::ParallelForChunks(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto k = static_cast<size_t>(i);
      double pi = p[i], epi = 0;
      double grad = s.maximize ? -g[i] : g[i];
      double eg_k = eg[k];
      if (decoupled) {
        pi = pi * (1 - lr * s.weight_decay);
        epi = 2 * u * std::abs(pi);
      } else if (s.weight_decay != 0) {
        grad += s.weight_decay * pi;
        eg_k += 2 * u * (std::abs(grad) + s.weight_decay * std::abs(pi));
      }
      const double m0 = fresh ? 0.0 : before.exp_avg[k];
      const double v0 = fresh ? 0.0 : before.exp_avg_sq[k];
      const double m = s.beta1 * m0 + (1 - s.beta1) * grad;
      const double em = s.beta1 * Prior(prior_m, k) + (1 - s.beta1) * eg_k + 3 * u * (s.beta1 * std::abs(m0) + (1 - s.beta1) * std::abs(grad));
      const double v = s.beta2 * v0 + (1 - s.beta2) * grad * grad;
      const double ev = s.beta2 * Prior(prior_v, k) + (1 - s.beta2) * (2 * std::abs(grad) * eg_k + eg_k * eg_k) +
                        4 * u * (s.beta2 * std::abs(v0) + (1 - s.beta2) * grad * grad);
      em_out[k] = em;
      ev_out[k] = ev;
      // |sqrt(v') - sqrt(v)| <= ev / (sqrt(v) + sqrt(max(v - ev, 0))) on both sides.
      const double sv = std::sqrt(v);
      const double den_s = sv + std::sqrt(std::max(v - ev, 0.0));
      const double esq = den_s > 0 ? ev / den_s : std::sqrt(ev);
      const double denom = sv / bc2_sqrt + s.eps;
      const double eden = esq / bc2_sqrt + 3 * u * denom;
      const double upd = step_size * m / denom;
      const double eupd = eden >= denom ? kInf
                                        : step_size * (em / (denom - eden) + std::abs(m) * eden / (denom * (denom - eden))) +
                                              4 * u * std::abs(upd);
      (*ep)[k] = epi + eupd + u * std::abs(pi - upd);
    }
  });
}

}  // namespace

void OptimizerErrorBounds(const core::OptimizerSpec& spec, double lr, const double* p, const double* g,
                          const std::vector<double>& eg, int64_t n, const core::ParamState<double>& before,
                          const std::map<std::string, std::vector<double>>* before_err, double u,
                          std::vector<double>* ep, std::map<std::string, std::vector<double>>* estate) {
  ep->assign(static_cast<size_t>(n), 0.0);
  if (spec.type == "sgd") {
    SgdBounds(spec, lr, p, g, eg, n, before, before_err, u, ep, estate);
  } else {
    AdamBounds(spec, spec.type == "adamw", lr, p, g, eg, n, before, before_err, u, ep, estate);
  }
}

}  // namespace ddpcheck::ref
