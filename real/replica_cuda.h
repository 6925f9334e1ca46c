// CudaReplica: core::Replica on one GPU, the device twin of sim/replica_cpu.h (same layer formulas as
// reference/*.h, same optimizer rounding as core/optimizer.cc). cuBLAS does the GEMMs in the math mode the run
// asks for: fp64, fp32 (no TF32), TF32 tensor cores, or autocast to fp16/bf16 (inputs and weights cast to the
// low type, fp32 accumulation, the output rounded once to the low type; losses in fp32; fp32 master weights and
// grads holding low-precision values, as torch.autocast gives). Elementwise ops, BatchNorm1d, losses,
// optimizers and GradScaler's unscale run in kernels (real/kernels.h). Dropout masks are drawn on the host
// from the rank's reference generator (RankSetup) and copied, so a rank drops the same elements as its CPU twin.
// SyncBatchNorm1d in training over a group of W > 1 ranks computes its row of statistics, the merge and the
// backward in kernels and exchanges through the group (SyncBnGroup::GatherStats, SumGradStats: the rank's
// Communicator, on device memory); otherwise it is a BatchNorm1d, as torch's.
//
// Memory: parameters, grads, buffers and everything Allocate returns live on the device; Span points there.
// Work is enqueued on the context's compute stream; methods that return host values wait for it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/replica.h"
#include "core/scenario.h"
#include "core/status.h"
#include "real/device_context.h"

namespace ddpcheck::real {

// How the GEMMs (and the values they produce) are computed.
enum class MathMode { kFp64, kFp32, kTf32, kFp16Amp, kBf16Amp };
std::string MathModeName(MathMode m);  // "fp64", "fp32", "tf32", "fp16-amp", "bf16-amp"
bool ParseMathMode(const std::string& name, MathMode* out);
// The mode a scenario runs in: fp64 -> kFp64; fp32 with amp -> kFp16Amp / kBf16Amp; fp32 otherwise -> kFp32,
// or kTf32 when `tf32`. Invalid for amp with fp64.
core::Status MathModeFor(const core::Scenario& s, bool tf32, MathMode* out);
// Unit roundoff of the mode's GEMM inputs (what a tolerance should be derived from).
core::DType MathModeRoundoffType(MathMode m);

// What a rank's replica takes from the host side that real/ does not compute itself (real/ includes neither
// reference/ nor sim/): built by harness/gpu/rank_setup_ref.h from the reference model of this rank.
struct RankSetup {
  std::vector<core::LayerSpec> layers;  // this rank's model (after model-changing faults)
  std::string loss = "mse";
  std::map<std::string, core::Tensor> initial;  // every parameter and buffer, by state_dict name
  std::vector<bool> bypassed;                   // per layer: an identity on this rank (unused-parameter faults)
                                                // (only_micro_step layers: Forward bypasses them per micro-step)
  std::function<double()> dropout_uniform;      // the next draw of this rank's dropout stream, in [0, 1)
};

// The compute side (core::Replica) and the device memory (core::DeviceMemory) in one class for now: the
// memory methods are the ones below Memory().
class CudaReplica final : public core::Replica, public core::DeviceMemory {
 public:
  // Builds the replica on context->device(). The context must outlive the replica.
  static core::Status Create(const RankSetup& setup, const core::OptimizerSpec& optimizer, MathMode math,
                             DeviceContext* context, std::unique_ptr<CudaReplica>* out);
  ~CudaReplica() override;

  DeviceContext* context() const { return ctx_; }
  MathMode math() const { return math_; }

  const std::vector<core::ParamInfo>& ParamInfos() const override { return param_infos_; }
  const std::vector<core::ParamInfo>& BufferInfos() const override { return buffer_infos_; }
  core::Span Param(int i) override;
  core::Span Grad(int i) override;
  core::Span Buffer(int i) override;
  bool GradDefined(int i) const override { return grad_defined_.at(static_cast<size_t>(i)); }
  void SetGradDefined(int i, bool defined) override { grad_defined_.at(static_cast<size_t>(i)) = defined; }

  void SetTraining(bool training) override { training_ = training; }
  core::Status Forward(const core::Batch& batch, double* loss) override;
  core::Status Backward(double loss_scale, const core::GradReadyFn& on_ready) override;
  // The group's collectives must work on this replica's device memory (core::CommSyncBnGroup over the rank's
  // NcclCommunicator or StagingCommunicator does).
  core::Status SetSyncBnGroup(core::SyncBnGroup* group) override {
    sync_bn_ = group;
    return core::Status::Ok();
  }
  void ZeroGrad(bool set_to_none) override;

  core::DeviceMemory& Memory() override { return *this; }
  const core::DeviceMemory& Memory() const override { return *this; }
  core::Span Allocate(int64_t numel, core::DType dtype) override;
  void CopyScaled(core::ConstSpan src, core::Span dst, double factor, core::ScaleMode mode) override;
  void Fill(core::Span dst, double value) override;
  core::Tensor ToHost(core::ConstSpan src, const std::vector<int64_t>& shape) const override;
  void FromHost(const core::Tensor& src, core::Span dst) override;

  core::Status OptimizerStep(double lr) override;
  bool UnscaleGrads(float inv_scale) override;
  double GradNorm() override;
  void ScaleGrads(double factor) override;
  std::vector<std::pair<std::string, core::Tensor>> OptimizerState() const override;

  struct Impl;  // device buffers and per-layer state (replica_cuda.cc)

 private:
  CudaReplica() = default;
  template <typename T> core::Status ForwardT(const core::Batch& batch, double* loss);
  template <typename T> core::Status BackwardT(double loss_scale, const core::GradReadyFn& on_ready);
  // Whether syncbatchnorm1d layers synchronise in the next Forward (torch's need_sync).
  bool SyncsBatchNorm() const { return training_ && sync_bn_ != nullptr && sync_bn_->world() > 1; }
  template <typename T> core::Status OptimizerStepT(double lr);

  DeviceContext* ctx_ = nullptr;
  MathMode math_ = MathMode::kFp32;
  core::DType dtype_ = core::DType::kFloat32;  // parameters, grads, buffers, activations
  core::OptimizerSpec optimizer_;
  bool training_ = true;
  core::SyncBnGroup* sync_bn_ = nullptr;  // not owned
  std::vector<core::ParamInfo> param_infos_, buffer_infos_;
  std::vector<bool> grad_defined_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpcheck::real
