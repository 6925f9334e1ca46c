// The reference model against real PyTorch (tests/golden/ddp_traj, golden/README.md section 6): one
// training-mode forward + backward per rank at step 0, from the post-broadcast initial values.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "reference/model.h"
#include "tests/test_util.h"

namespace ddpcheck::ref {
namespace {

using nlohmann::json;

// A nested JSON list (or a number) as a Tensor in C order.
void Flatten(const json& j, std::vector<double>* out) {
  if (j.is_array()) {
    for (const json& e : j) Flatten(e, out);
  } else {
    out->push_back(j.get<double>());
  }
}
core::Tensor ToTensor(const json& j) {
  core::Tensor t;
  for (const json* p = &j; p->is_array(); p = &(*p)[0]) t.shape.push_back(static_cast<int64_t>(p->size()));
  Flatten(j, &t.data);
  return t;
}

core::LayerSpec Lin(int64_t in, int64_t out) {
  core::LayerSpec s;
  s.type = "linear";
  s.in_features = in;
  s.out_features = out;
  return s;
}

// The layer list of a golden model name (golden/README.md section 6).
std::vector<core::LayerSpec> LayersOf(const std::string& model) {
  core::LayerSpec relu;
  relu.type = "relu";
  if (model == "a_linear10x10") return {Lin(10, 10)};
  if (model == "b_mlp10_20_10") return {Lin(10, 20), relu, Lin(20, 10)};
  core::LayerSpec bn;
  bn.type = "batchnorm1d";
  bn.num_features = 16;
  EXPECT_EQ(model, "c_mlp_bn8_16_4");
  return {Lin(8, 16), bn, relu, Lin(16, 4)};
}

// golden name -> value, renamed to the model's state_dict names by position (a bare Linear's "weight" is
// the model's "0.weight").
std::map<std::string, core::Tensor> Renamed(const json& values, const json& golden_names,
                                            const std::vector<core::ParamInfo>& infos) {
  std::map<std::string, core::Tensor> out;
  for (size_t i = 0; i < golden_names.size(); ++i) {
    out[infos.at(i).name] = ToTensor(values.at(golden_names[i].get<std::string>()));
  }
  return out;
}

double MaxAbs(const core::Tensor& t) {
  double m = 0;
  for (double v : t.data) m = std::max(m, std::abs(v));
  return m;
}

// |got - want| <= rtol * (|want| + 0.1 * scale), elementwise. `scale` (the largest value in the model's
// gradients) is the floor for elements that are sums which cancel: e.g. the grad of a Linear bias that feeds
// a BatchNorm is 0 in exact arithmetic, and PyTorch's value is rounding noise (~1e-9 in float32).
void ExpectClose(const std::vector<double>& got, const core::Tensor& want, double rtol, double scale,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.data.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    const double tol = rtol * (std::abs(want.data[k]) + 0.1 * scale);
    EXPECT_NEAR(got[k], want.data[k], tol) << what << "[" << k << "]";
  }
}

struct Tolerance {
  double loss, grad;
};

template <class T>
void CheckStepZero(const json& g, Tolerance tol) {
  const std::string model_name = g.at("model");
  Model<T> model;
  core::Status st = Model<T>::Build(LayersOf(model_name), "mse", &model);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const json& init = g.at("initial").at(0).at("init_after_ddp_broadcast");
  ASSERT_TRUE(model.LoadValues(Renamed(init.at("params"), g.at("param_names"), model.param_infos())).ok());
  ASSERT_TRUE(model.LoadValues(Renamed(init.at("buffers"), g.at("buffer_names"), model.buffer_infos())).ok());

  const core::Tensor x_all = ToTensor(g.at("dataset").at("X")), y_all = ToTensor(g.at("dataset").at("Y"));
  const int64_t in = x_all.shape[1], out = y_all.shape[1];
  const json& step = g.at("steps").at(0);
  const int world = g.at("world_size");
  std::vector<std::vector<double>> grad_sum(static_cast<size_t>(model.num_params()));
  for (int r = 0; r < world; ++r) {
    const json& rank = step.at("ranks").at(r);
    const std::vector<int64_t> rows = rank.at("batch_indices");
    const int64_t b = static_cast<int64_t>(rows.size());
    Matrix<T> x(b, in);
    core::Tensor y(core::DType::kFloat64, {b, out}, {});
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t j = 0; j < in; ++j) x(i, j) = static_cast<T>(x_all.data[static_cast<size_t>(rows[i] * in + j)]);
      for (int64_t j = 0; j < out; ++j) y.data.push_back(y_all.data[static_cast<size_t>(rows[i] * out + j)]);
    }
    Model<T> replica = model;  // every rank starts from the broadcast values
    replica.SetRank(r);
    const double loss = replica.Forward(x, y);
    const double want_loss = rank.at("loss");
    EXPECT_NEAR(loss, want_loss, tol.loss * std::abs(want_loss)) << model_name << " rank " << r << " loss";
    replica.Backward(T(1), nullptr);
    for (int i = 0; i < replica.num_params(); ++i) {
      auto& sum = grad_sum[static_cast<size_t>(i)];
      sum.resize(static_cast<size_t>(replica.param_info(i).numel()), 0.0);
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += replica.grad_data(i)[k];
    }
    if (r == 0) {
      const auto want = Renamed(rank.at("buffers"), g.at("buffer_names"), replica.buffer_infos());
      for (int i = 0; i < replica.num_buffers(); ++i) {
        const auto& info = replica.buffer_info(i);
        std::vector<double> got(replica.buffer_data(i), replica.buffer_data(i) + info.numel());
        ExpectClose(got, want.at(info.name), tol.grad, MaxAbs(want.at(info.name)),
                    model_name + " rank 0 buffer " + info.name);
      }
    }
  }
  const auto want = Renamed(step.at("grads_after_allreduce_rank0"), g.at("param_names"), model.param_infos());
  double scale = 0;
  for (const auto& [name, t] : want) scale = std::max(scale, MaxAbs(t));
  for (int i = 0; i < model.num_params(); ++i) {
    std::vector<double> avg = grad_sum[static_cast<size_t>(i)];
    for (double& v : avg) v /= world;
    const std::string& name = model.param_info(i).name;
    ExpectClose(avg, want.at(name), tol.grad, scale, model_name + " grad " + name);
  }
}

std::vector<std::string> GoldenFiles() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(std::string(DDPCHECK_GOLDEN_DIR) + "/ddp_traj")) {
    if (e.path().extension() == ".json") files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ReferenceGolden, StepZeroLossGradsAndBatchNormBuffersMatchPyTorch) {
  const std::vector<std::string> files = GoldenFiles();
  ASSERT_FALSE(files.empty()) << "no tests/golden/ddp_traj/*.json";
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const json g = testing::LoadGolden("ddp_traj/" + f);
    if (g.at("dtype") == "float64") {
      CheckStepZero<double>(g, {1e-12, 1e-12});
    } else {
      ASSERT_EQ(g.at("dtype"), "float32");
      CheckStepZero<float>(g, {1e-6, 1e-5});
    }
  }
}

}  // namespace
}  // namespace ddpcheck::ref
