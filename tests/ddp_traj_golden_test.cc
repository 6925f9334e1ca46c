// The PyTorch DDP trajectories of tests/golden/ddp_traj (real gloo DDP runs, W=2, torch 1.13) reproduced by the
// reference trainer and by the sim world: the same batch indices, bucket layouts per step, losses, parameters
// (1e-12 relative in float64, 1e-5 in float32) and BatchNorm buffers at every step.
#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "core/scenario.h"
#include "core/trace.h"
#include "harness/check.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::Tensor;

void Flatten(const nlohmann::json& j, std::vector<double>* out, std::vector<int64_t>* shape, size_t depth) {
  if (j.is_array()) {
    if (shape->size() <= depth) shape->push_back(static_cast<int64_t>(j.size()));
    for (const auto& e : j) Flatten(e, out, shape, depth + 1);
  } else {
    out->push_back(j.get<double>());
  }
}

Tensor FromJson(const nlohmann::json& j, core::DType dtype) {
  Tensor t;
  t.dtype = dtype;
  Flatten(j, &t.data, &t.shape, 0);
  return t;
}

struct Golden {
  nlohmann::json j;
  core::Scenario scenario;
  std::vector<std::string> names;         // golden param names, in order
  std::vector<std::string> buffer_names;  // golden buffer names
  double tol = 0;
};

Golden Load(const std::string& file) {
  Golden g;
  g.j = testing::LoadGolden("ddp_traj/" + file);
  const bool f64 = g.j.at("dtype") == "float64";
  const core::DType dt = f64 ? core::DType::kFloat64 : core::DType::kFloat32;
  g.tol = f64 ? 1e-12 : 1e-5;
  core::Scenario& s = g.scenario;
  s.name = file;
  const std::string model = g.j.at("model");
  auto linear = [](int64_t in, int64_t out) {
    core::LayerSpec l;
    l.type = "linear";
    l.in_features = in;
    l.out_features = out;
    return l;
  };
  if (model.rfind("a_linear10x10", 0) == 0) {
    s.model = {linear(10, 10)};
  } else {
    core::LayerSpec bn;
    bn.type = "batchnorm1d";
    bn.num_features = 16;
    core::LayerSpec relu;
    relu.type = "relu";
    s.model = {linear(8, 16), bn, relu, linear(16, 4)};
  }
  s.loss = "mse";
  s.precision = dt;
  s.world = g.j.at("world_size");
  s.batch_size = 4;
  s.epochs = 3;
  s.sampler.shuffle = true;
  s.sampler.seed = 0;
  s.optimizer.type = "sgd";
  s.optimizer.lr = 0.01;
  s.optimizer.momentum = 0.9;
  s.optimizer.weight_decay = 1e-4;
  s.data.kind = "inline";
  s.data.x = FromJson(g.j.at("dataset").at("X"), dt);
  s.data.y = FromJson(g.j.at("dataset").at("Y"), dt);
  s.data.samples = s.data.x.shape[0];
  g.names = g.j.at("param_names").get<std::vector<std::string>>();
  g.buffer_names = g.j.at("buffer_names").get<std::vector<std::string>>();
  // Our names are Sequential-style ("0.weight"); the single-Linear model's torch names are "weight"/"bias".
  auto ours = [&](const std::string& n) { return n.find('.') == std::string::npos ? "0." + n : n; };
  s.init.kind = "inline";
  const auto& init = g.j.at("initial").at(0).at("init_after_ddp_broadcast");
  for (const auto& n : g.names) s.init.values[ours(n)] = FromJson(init.at("params").at(n), dt);
  for (const auto& n : g.buffer_names) {
    s.init.values[ours(n)] = FromJson(init.at("buffers").at(n), n.find("num_batches") != std::string::npos ? core::DType::kInt64 : dt);
  }
  for (auto& n : g.names) n = ours(n);
  for (auto& n : g.buffer_names) n = ours(n);
  return g;
}

// max |got - want| / max |want| over the tensor (normwise relative error).
double RelErr(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.data.size(); ++i) {
    num = std::max(num, std::abs(got.data[i] - want.data[i]));
    den = std::max(den, std::abs(want.data[i]));
  }
  return den == 0 ? num : num / den;
}

const Tensor& Need(const core::Trace& t, int64_t step, Checkpoint c, const std::string& name, int rank) {
  const Tensor* v = t.Find({step, c, name, rank});
  if (!v) v = t.Find({step, c, name, core::kAllRanks});
  if (!v) throw std::runtime_error("trace lacks " + core::TraceKey{step, c, name, rank}.ToString());
  return *v;
}

class DdpTrajGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DdpTrajGolden, ReferenceAndSimReproduceTorchAtEveryStep) {
  Golden g = Load(GetParam());
  ASSERT_TRUE(core::ValidateScenario(g.scenario).ok()) << core::ValidateScenario(g.scenario).ToString();
  harness::CheckOptions opts;
  core::RunReport report;
  core::Trace sim_trace, ref_trace;
  core::Status st = harness::Check(g.scenario, opts, &report, &sim_trace, &ref_trace);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);

  const auto& steps = g.j.at("steps");
  ASSERT_EQ(report.steps, static_cast<int64_t>(steps.size()));
  const core::DType dt = g.scenario.precision;
  for (const auto& step : steps) {
    const int64_t s = step.at("global_step");
    // Bucket layout used by this step's all-reduce, on every rank of the sim world.
    const auto buckets = step.at("bucket_param_indices").get<std::vector<std::vector<int>>>();
    for (int r = 0; r < g.scenario.world; ++r) {
      for (size_t b = 0; b < buckets.size(); ++b) {
        const Tensor& layout = Need(sim_trace, s, Checkpoint::kBucket, "bucket" + std::to_string(b) + ".params", r);
        std::vector<int> got(layout.data.begin(), layout.data.end());
        EXPECT_EQ(got, buckets[b]) << "step " << s << " rank " << r << " bucket " << b;
      }
    }
    for (const auto& rank : step.at("ranks")) {
      const int r = rank.at("rank");
      const auto indices = rank.at("batch_indices").get<std::vector<double>>();
      for (const core::Trace* t : {&sim_trace, &ref_trace}) {
        const std::string who = t == &sim_trace ? "sim" : "reference";
        EXPECT_EQ(Need(*t, s, Checkpoint::kSampler, "indices", r).data, indices) << who << " step " << s;
        const double loss = Need(*t, s, Checkpoint::kLoss, "loss", r).data[0];
        EXPECT_LE(std::abs(loss - rank.at("loss").get<double>()), g.tol * std::abs(loss)) << who << " step " << s;
        for (size_t p = 0; p < g.names.size(); ++p) {
          const std::string torch_name = g.j.at("param_names")[p];
          const Tensor want = FromJson(rank.at("params").at(torch_name), dt);
          EXPECT_LE(RelErr(Need(*t, s, Checkpoint::kParams, g.names[p], r), want), g.tol)
              << who << " step " << s << " rank " << r << " " << g.names[p];
        }
        for (size_t b = 0; b < g.buffer_names.size(); ++b) {
          const std::string torch_name = g.j.at("buffer_names")[b];
          const Tensor want = FromJson(rank.at("buffers").at(torch_name), dt);
          EXPECT_LE(RelErr(Need(*t, s, Checkpoint::kBuffers, g.buffer_names[b], r), want), g.tol)
              << who << " step " << s << " rank " << r << " " << g.buffer_names[b];
        }
      }
    }
    // Reduced gradients, relative to the step's largest gradient: a bias feeding BatchNorm has a gradient that
    // is exactly 0 in exact arithmetic, so its value (torch's and ours) is rounding noise of the sums behind it.
    double grad_scale = 0;
    for (size_t p = 0; p < g.names.size(); ++p) {
      const std::string torch_name = g.j.at("param_names")[p];
      for (double v : FromJson(step.at("grads_after_allreduce_rank0").at(torch_name), dt).data) {
        grad_scale = std::max(grad_scale, std::abs(v));
      }
    }
    for (size_t p = 0; p < g.names.size(); ++p) {
      const std::string torch_name = g.j.at("param_names")[p];
      const Tensor want = FromJson(step.at("grads_after_allreduce_rank0").at(torch_name), dt);
      const Tensor& got = Need(sim_trace, s, Checkpoint::kReduced, g.names[p], 0);
      double err = 0;
      for (size_t i = 0; i < want.data.size(); ++i) err = std::max(err, std::abs(got.data[i] - want.data[i]));
      EXPECT_LE(err, g.tol * grad_scale) << "step " << s << " " << g.names[p];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Torch113, DdpTrajGolden,
                         ::testing::Values("a_linear10x10_float64_W2.json", "a_linear10x10_float32_W2.json",
                                           "c_mlp_bn8_16_4_float32_W2.json"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           n = n.substr(0, n.find(".json"));
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

}  // namespace
}  // namespace ddpcheck
