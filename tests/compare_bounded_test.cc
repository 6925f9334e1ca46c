// CompareTraces against element-wise bounds (the step-local check): its figures (bad count, max abs/rel/ulps,
// budget, sensitivity), the worst element and the mismatch must be exactly what the element-by-element
// definition gives, NaN, infinities, signed zeros and all (the comparison skips equal elements' rel and ulps
// and tests a failed tensor's ratio in a second pass).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>

#include "core/compare.h"
#include "core/report.h"
#include "core/trace.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::DType;
using core::Tensor;

// The ulp distance written out apart from core::UlpDistance (whose branch-free form is what is tested): the
// count of values of the dtype between a and b on the line where each value is its magnitude bits, signed.
double Ulps(double a, double b, DType dt) {
  auto line = [dt](double v) -> __int128 {
    if (dt == DType::kFloat32) {
      const auto f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      const __int128 magnitude = u & 0x7fffffffu;
      return (u >> 31) ? -magnitude : magnitude;
    }
    uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    const __int128 magnitude = u & 0x7fffffffffffffffu;
    return (u >> 63) ? -magnitude : magnitude;
  };
  const __int128 d = line(a) - line(b);
  return static_cast<double>(d < 0 ? -d : d);
}

// The definition, element by element (CompareTensor's loop as session 6 wrote it).
struct Expected {
  int64_t bad = 0, worst = -1;
  double max_abs = 0, max_rel = 0, max_ulps = 0, max_budget = 0, sensitivity = INFINITY, worst_budget = 0;
};

Expected Define(const Tensor& got, const Tensor& want, const Tensor& bound) {
  Expected x;
  double worst_excess = -1;
  for (size_t i = 0; i < want.data.size(); ++i) {
    const double g = got.data[i], w = want.data[i];
    const bool both_nan = std::isnan(g) && std::isnan(w);
    double abs_err = both_nan || g == w ? 0.0 : std::abs(g - w);
    if (std::isnan(abs_err)) abs_err = INFINITY;
    const double b = core::kBoundSafety * bound.data[i];
    x.max_budget = std::max(x.max_budget, b);
    if (w != 0 && std::isfinite(w)) x.sensitivity = std::min(x.sensitivity, 2 * b / std::abs(w));
    if (abs_err != 0) {
      x.max_abs = std::max(x.max_abs, abs_err);
      x.max_rel = std::max(x.max_rel, w != 0 ? abs_err / std::abs(w) : INFINITY);
      x.max_ulps = std::max(x.max_ulps, std::isfinite(g) && std::isfinite(w) ? Ulps(g, w, want.dtype) : INFINITY);
    }
    if (!(abs_err == 0 || abs_err <= b)) {  // equal values agree whatever the bound, NaN included
      ++x.bad;
      const double excess = std::isnan(b) ? INFINITY : abs_err - b;
      if (excess > worst_excess || x.worst < 0) {
        worst_excess = excess;
        x.worst = static_cast<int64_t>(i);
        x.worst_budget = b;
      }
    }
  }
  return x;
}

double Special(std::mt19937_64& rng, DType dt) {
  const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, std::nan(""), 1e-30, -1e30, 1.0, -1.0};
  std::uniform_int_distribution<int> pick(0, 40);
  const int k = pick(rng);
  if (k < 9) return dt == DType::kFloat32 ? static_cast<double>(static_cast<float>(specials[k])) : specials[k];
  std::normal_distribution<double> n(0.0, 1.0);
  const double v = n(rng) * std::pow(10.0, static_cast<double>(k % 7) - 3);
  return dt == DType::kFloat32 ? static_cast<double>(static_cast<float>(v)) : v;
}

// A bound that overflowed to NaN (a run that blew up to 1e283, QA round 15): equal values still agree (they failed,
// and the report showed an equal pair as the first divergence), and a value that differs is named, its bound NaN.
TEST(CompareBounded, ANanBoundHoldsEqualValuesAndNamesADifferentOne) {
  const core::TraceKey key{0, Checkpoint::kReduced, "p", core::kAllRanks};
  const double nan = std::nan("");
  for (const bool differs : {false, true}) {
    core::Trace g, w, b;
    g.Add(key, Tensor(DType::kFloat64, {3}, {1e283, 1.3e-321, differs ? 2.0 : 1.0}));
    w.Add(key, Tensor(DType::kFloat64, {3}, {1e283, 1.3e-321, 1.0}));
    b.Add(key, Tensor(DType::kFloat64, {3}, {nan, nan, nan}));
    const core::CompareResult r = core::CompareTraces(g, w, core::TolerancePolicy(), b, 0);
    EXPECT_EQ(r.pass, !differs);
    if (differs) {
      ASSERT_TRUE(r.first.has_value());
      EXPECT_EQ(r.first->index, 2);
      EXPECT_EQ(r.first->bad_elements, 1);
    }
  }
}

TEST(CompareBounded, TheFiguresAreTheDefinitionsExactly) {
  std::mt19937_64 rng(7);
  for (const DType dt : {DType::kFloat32, DType::kFloat64}) {
    for (int trial = 0; trial < 400; ++trial) {
      const bool passing = trial % 2 == 1;
      const int64_t n = 1 + static_cast<int64_t>(rng() % 70);  // the eight-lane pass and its tail
      Tensor want(dt, {n}, {}), got(dt, {n}, {}), bound(DType::kFloat64, {n}, {});
      std::uniform_real_distribution<double> u(0, 1);
      for (int64_t i = 0; i < n; ++i) {
        const double w = Special(rng, dt);
        double g = w;
        const double r = u(rng);
        if (r < 0.3) g = w * (1 + 1e-6 * (u(rng) - 0.5));
        else if (r < 0.4) g = Special(rng, dt);
        else if (r < 0.45) g = std::nextafter(static_cast<float>(w), INFINITY);
        if (dt == DType::kFloat32) g = static_cast<double>(static_cast<float>(g));
        want.data.push_back(w);
        got.data.push_back(g);
        bound.data.push_back(u(rng) < 0.1 ? INFINITY : std::abs(w) * 1e-7 * u(rng));
      }
      if (passing) {
        // Every element within its bound (the vectorised pass's case): a bound of at least the error, or none.
        for (int64_t i = 0; i < n; ++i) {
          const double e = std::abs(got.data[static_cast<size_t>(i)] - want.data[static_cast<size_t>(i)]);
          if (u(rng) < 0.5 || !std::isfinite(e)) bound.data[static_cast<size_t>(i)] = INFINITY;
          else if (bound.data[static_cast<size_t>(i)] < e) bound.data[static_cast<size_t>(i)] = e * (1 + u(rng));
        }
      }
      core::Trace g, w, b;
      const core::TraceKey key{0, Checkpoint::kReduced, "p", core::kAllRanks};
      g.Add(key, got);
      w.Add(key, want);
      b.Add(key, bound);
      core::TolerancePolicy policy;
      const core::CompareResult r = core::CompareTraces(g, w, policy, b, 0);
      const Expected x = Define(got, want, bound);
      ASSERT_EQ(r.stats.count("reduced"), 1u);
      const core::CheckpointStats& st = r.stats.at("reduced");
      const std::string where = "dtype " + core::DTypeName(dt) + ", trial " + std::to_string(trial);
      EXPECT_EQ(st.max_abs, x.max_abs) << where;
      EXPECT_EQ(st.max_rel, std::isfinite(x.max_rel) ? x.max_rel : 0.0) << where;
      EXPECT_EQ(st.max_ulps, std::isfinite(x.max_ulps) ? x.max_ulps : 0.0) << where;
      EXPECT_EQ(st.max_budget, x.max_budget) << where;
      EXPECT_EQ(st.sensitivity, x.sensitivity < 1 ? x.sensitivity : 0.0) << where;
      EXPECT_EQ(st.noise, x.sensitivity < 1 ? 0 : 1) << where;
      EXPECT_EQ(r.pass, x.bad == 0) << where;
      if (passing) {
        EXPECT_TRUE(r.pass) << where;
      }
      if (x.bad > 0) {
        ASSERT_TRUE(r.first.has_value()) << where;
        EXPECT_EQ(r.first->bad_elements, x.bad) << where;
        EXPECT_EQ(r.first->index, x.worst) << where;
        if (std::isnan(x.worst_budget)) {  // (a NaN bound: a NaN wanted value's)
          EXPECT_TRUE(std::isnan(r.first->budget)) << where;
        } else {
          EXPECT_EQ(r.first->budget, x.worst_budget) << where;
        }
      }
    }
  }
}


// The divergence map's largest error per cell and the reference scales are eight-lane scans (core/lanes.h):
// their figures must be the element-by-element definitions, specials and tails included.
TEST(CompareBounded, TheDivergenceMapAndTheScalesAreTheDefinitionsExactly) {
  std::mt19937_64 rng(11);
  for (const DType dt : {DType::kFloat32, DType::kFloat64}) {
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 70);
      Tensor want(dt, {n}, {}), got(dt, {n}, {});
      std::uniform_real_distribution<double> u(0, 1);
      double max_err = 0, finite = 0, all = 0;
      bool differs = false;
      for (int64_t i = 0; i < n; ++i) {
        const double w = Special(rng, dt);
        double g = u(rng) < 0.5 ? w : (u(rng) < 0.5 ? Special(rng, dt) : w * (1 + 1e-6 * (u(rng) - 0.5)));
        if (dt == DType::kFloat32) g = static_cast<double>(static_cast<float>(g));
        want.data.push_back(w);
        got.data.push_back(g);
        const bool both_nan = std::isnan(g) && std::isnan(w);
        double err = both_nan || g == w ? 0.0 : std::abs(g - w);
        if (std::isnan(err)) err = INFINITY;
        max_err = std::max(max_err, err);
        differs = differs || (!both_nan && g != w);
        const double a = std::abs(w);
        if (a <= std::numeric_limits<double>::max()) finite = std::max(finite, a);
        all = std::max(all, a);
      }
      // A float32 value also as a trace holds it from a replica (core::RecordValue, floats read as held).
      for (const bool as_floats : {false, true}) {
        if (as_floats && dt != DType::kFloat32) continue;
        auto floats = [](const Tensor& t) {
          return std::make_shared<const core::RecordValue>(t.shape, std::vector<float>(t.data.begin(), t.data.end()));
        };
        core::Trace g, w;
        const core::TraceKey key{0, Checkpoint::kLocalGrad, "p", 0};
        if (as_floats) {
          g.Add(key, floats(got));
          w.Add(key, floats(want));
        } else {
          g.Add(key, got);
          w.Add(key, want);
        }
        const std::string where =
            "dtype " + core::DTypeName(dt) + (as_floats ? " as floats" : "") + ", trial " + std::to_string(trial);
        std::map<const core::RecordValue*, double> own;
        const auto at = core::ReferenceScales(w, &own);
        ASSERT_EQ(at.size(), 1u) << where;
        EXPECT_EQ(at.begin()->second, finite) << where;
        ASSERT_EQ(own.size(), 1u) << where;
        EXPECT_EQ(own.begin()->second, all) << where;
        core::RunReport report;
        core::TolerancePolicy exact;
        exact.exact = true;
        core::FillDivergenceMap(g, w, exact, &report);
        EXPECT_EQ(report.divergence_map[0][0].max_abs_err, max_err) << where;
        EXPECT_EQ(report.divergence_map[0][0].failed, differs) << where;
      }
    }
  }
}

// A batch of another size on one rank (its DataLoader's batch_size) is said as such, not only as shapes.
TEST(CompareBounded, SamplerIndicesOfAnotherCountSayHowManySamplesTheRankDrew) {
  core::Trace g, w;
  g.Add({0, core::Checkpoint::kSampler, "indices", 1}, core::Tensor(core::DType::kInt64, {5}, {0, 1, 2, 3, 4}));
  w.Add({0, core::Checkpoint::kSampler, "indices", 1}, core::Tensor(core::DType::kInt64, {4}, {0, 1, 2, 3}));
  const core::CompareResult r = core::CompareTraces(g, w, core::TolerancePolicy());
  ASSERT_FALSE(r.pass);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_NE(r.first->message.find("rank 1 drew 5 samples in step 0 where the reference draws 4"), std::string::npos)
      << r.first->message;
}

}  // namespace
}  // namespace ddpcheck
