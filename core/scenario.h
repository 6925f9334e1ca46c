// Scenario: everything that describes one DDP training run. Loaded from JSON (schema: docs/scenario.md),
// overridden by CLI flags, validated once; every backend runs the same Scenario and produces a Trace.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// Limits on every size and count a scenario (file or flags) can ask for, checked by ValidateScenario before
// anything is allocated (docs/scenario.md#limits). Within them a CPU run holds at most a few hundred MiB;
// beyond them the input is refused as bad input (exit 2), never attempted.
constexpr int kMaxWorld = 4096;
constexpr int64_t kMaxWidth = int64_t{1} << 20;           // a layer's in / out / features, data widths
constexpr int64_t kMaxModelElements = int64_t{1} << 24;   // parameters + buffers of one replica (128 MiB fp64)
// Layers of the model: a run keeps per layer, rank and step a trace record of each parameter, gradient and
// buffer (about 10 KB of bookkeeping besides the values), so a deep stack of small layers costs memory and time
// the element limits do not see (100,001 Linear(10, 10) layers: > 20 GB).
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxWorldElements = int64_t{1} << 26;   // world x model elements (every replica in one process)
constexpr int64_t kMaxSamples = int64_t{1} << 24;         // data samples, and batch_size
constexpr int64_t kMaxDataElements = int64_t{1} << 25;    // samples x (in_features + out_features)
constexpr int64_t kMaxEpochs = int64_t{1} << 20;          // epochs
constexpr int64_t kMaxSteps = int64_t{1} << 30;           // steps, no_sync_steps, fault steps, scheduler epochs
constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;  // a week
constexpr double kMaxBucketCapMb = 1 << 20;               // 1 TiB: every model fits one bucket long before

// One layer of a Sequential model. Parameters are registered in torch's order and named "<index>.<name>"
// ("0.weight", "0.bias", "1.running_mean", ...), index = position in the layer list.
struct LayerSpec {
  std::string type;          // "linear", "relu", "tanh", "batchnorm1d", "syncbatchnorm1d", "dropout"
  int64_t in_features = 0;   // linear
  int64_t out_features = 0;  // linear
  bool bias = true;          // linear
  int64_t num_features = 0;  // batchnorm1d, syncbatchnorm1d (and their other keys below)
  double eps = 1e-5;
  double momentum = 0.1;  // momentum_none = cumulative average (torch momentum=None)
  bool momentum_none = false;
  bool affine = true;
  bool track_running_stats = true;
  double p = 0.5;                   // dropout
  // For the unused-parameter faults: a layer that exists (its parameters are registered) but whose output
  // is not used in the loss on the listed ranks (empty + unused=true: on every rank).
  bool unused = false;
  std::vector<int> unused_on_ranks;
  // Control flow across a no_sync window: the layer runs only in this micro-step of each accumulation
  // window and is bypassed in the others (-1: always runs). Used by the nosync-unused scenario.
  int64_t only_micro_step = -1;
};

struct InitSpec {
  std::string kind = "seed";  // "seed" | "npy" | "inline"
  // seed: rank r initialises with seeds[r] (seeds.size() == 1 means the same seed on every rank, which with
  // DDP's initial broadcast changes nothing). torch-like uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) init.
  std::vector<uint64_t> seeds = {0};
  // exact: initial values are small dyadic fractions (k/16, |k| <= 8) so every sum is exact in fp32/fp64.
  bool exact = false;
  std::map<std::string, std::string> npy;  // npy: parameter name -> file (relative to the scenario file)
  std::map<std::string, Tensor> values;     // inline: parameter/buffer name -> value
};

struct DataSpec {
  std::string kind = "regression";  // "regression" | "classification" | "npy" | "inline"
  int64_t samples = 64;
  int64_t in_features = 0;   // 0: taken from the model's first linear layer
  int64_t out_features = 0;  // regression targets / classification classes; 0: from the model's last layer
  uint64_t seed = 12345;
  // exact: inputs and targets are small integers/dyadic fractions, so sums are exact in any order.
  bool exact = false;
  std::string x_path, y_path;  // npy (relative to the scenario file)
  Tensor x, y;                 // inline, or loaded: x (N, in_features); y (N, out) or (N) class ids
};

struct SamplerSpec {
  bool shuffle = true;
  uint64_t seed = 0;
  // The recorded run's seed was negative (DistributedSampler(seed=-1)): `seed` holds it in two's complement, and
  // seed + epoch is the signed sum torch computes (only a dump sets it; a scenario's seed is unsigned).
  bool negative_seed = false;
  bool drop_last = false;
  bool set_epoch = true;  // whether the training loop calls sampler.set_epoch(epoch)
  // DataLoader(drop_last=True): each epoch's last batch is dropped when it is shorter than batch_size.
  bool drop_last_batch = false;
  // The user's data split is uneven: every rank but 0 loses the last sample of its shard each epoch (a
  // sampler without DistributedSampler's padding), so the ranks' last batches differ in size.
  bool uneven_split = false;
};

struct DdpSpec {
  double bucket_cap_mb = 25.0;
  int64_t first_bucket_bytes = 1048576;  // torch's _DEFAULT_FIRST_BUCKET_BYTES
  bool broadcast_buffers = true;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  int64_t no_sync_steps = 1;  // gradient accumulation window: k-1 micro-steps under no_sync, then a synced one
  int64_t timeout_ms = 30000;  // every collective's timeout (torch's default process-group timeout is 30 min)
  int64_t bucket_cap_bytes() const { return static_cast<int64_t>(bucket_cap_mb * 1024 * 1024); }
};

struct OptimizerSpec {
  std::string type = "sgd";  // "sgd" | "adam" | "adamw"
  double lr = 0.01;
  double momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false, maximize = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // Only for OptimizerStep on recorded torch runs (core/dump_protocol.h); scenarios use sgd/adam/adamw.
  bool amsgrad = false;                        // adam/adamw
  double alpha = 0.99;                         // rmsprop
  bool centered = false;                       // rmsprop
  double rho = 0.9;                            // adadelta
  double lr_decay = 0.0, initial_accumulator_value = 0.0;  // adagrad
};

struct SchedulerSpec {
  std::string type;  // "step" | "multistep" | "exponential" | "cosine" | "linear"
  int64_t step_size = 1;
  std::vector<int64_t> milestones;
  double gamma = 0.1;
  int64_t t_max = 1;
  double eta_min = 0.0;
  double start_factor = 1.0 / 3.0, end_factor = 1.0;
  int64_t total_iters = 5;
};

struct AmpSpec {
  bool enabled = false;
  std::string dtype = "fp16";  // "fp16" | "bf16"
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double clip_grad_norm = 0.0;  // 0: no clipping
  // false: torch.autocast without a GradScaler (bfloat16 training, CPU autocast): the loss is not scaled,
  // nothing is unscaled or checked for inf, every step runs the optimizer.
  bool grad_scaler = true;
  // Not a scenario field (never read from or written to JSON): the float64 oracle of an AMP run (harness/check.cc,
  // CheckOptions::oracle_precision; gpu-report's "vs fp64") keeps the run's GradScaler and autocast's casts, each
  // cast keeping its value in float64 and only overflowing where the low type would (reference/autocast.h,
  // LowCast): the run's overflowing steps are skipped there too, the scale sequence is the run's, and what differs
  // is the roundings alone.
  bool range_only = false;
};

// A fault: BUGS.md name, optional rank (-1: all/default) and step (-1: from the start).
struct FaultSpec {
  std::string name;
  int rank = -1;
  int64_t step = -1;
};

struct Scenario {
  std::string name = "scenario";
  std::string description;
  std::string source;    // the file it was loaded from ("<flags>" when built from flags)
  std::string base_dir;  // relative paths resolve against this
  std::vector<LayerSpec> model;
  std::string loss = "mse";  // "mse" | "cross_entropy"
  InitSpec init;
  DataSpec data;
  int world = 4;
  int64_t batch_size = 4;  // per rank
  SamplerSpec sampler;
  DdpSpec ddp;
  OptimizerSpec optimizer;
  std::vector<SchedulerSpec> schedulers;  // stepped once per epoch, in this order
  DType precision = DType::kFloat64;      // fp64 | fp32
  AmpSpec amp;
  std::vector<FaultSpec> faults;
  int64_t epochs = 1;
  int64_t steps = -1;  // -1: all steps of all epochs; otherwise stop after this many optimizer steps
  // The oracle's gradient: DDP's mean of the ranks' per-shard means (false), or the single-process mean over
  // the global batch (true), which differ when shards are uneven. Not in the JSON: set by the harness from the
  // uneven-shard-mean fault (core::OracleScenario).
  bool global_batch_mean = false;
};

// Parses and validates. Errors name the JSON path: "s.json: /ddp/bucket_cap_mb: must be > 0, got -1".
// Unknown keys are errors. Relative paths (npy files) resolve against the file's folder; npy data is loaded.
Status LoadScenario(const std::string& path, Scenario* out);
Status ParseScenario(const nlohmann::json& j, const std::string& source, const std::string& base_dir,
                     Scenario* out);
// Cross-field checks (world >= 1, layer shapes chain, data matches the model, ...). Called by the loaders;
// call it again after applying CLI overrides.
Status ValidateScenario(const Scenario& s);
// For a scenario to run (`ddpcheck run`, not one rebuilt from a recording, whose steps are what was recorded):
// every rank gets at least one batch an epoch, and every fault falls below the run's optimizer steps.
Status CheckTrainsSomeStep(const Scenario& s);
// The scenario as JSON (round-trips through ParseScenario; inline tensors written as nested arrays).
nlohmann::json ScenarioToJson(const Scenario& s);
// The default scenario of `ddpcheck run` with no arguments: a tutorial-like MLP with BatchNorm, W=4, 3 epochs.
Scenario DefaultScenario();

}  // namespace ddpcheck::core
