// The model-agnostic protocol check of a recorded torch run (TorchDump): what DDP and the optimizer must do for
// ANY nn.Module, from what tools/ddpcheck_torch.py records (its comm hook's per-bucket local and reduced
// gradients, the optimizer's inputs, the float64 single-process reference gradient), without replaying the
// model. Per step and rank:
//   loss        what parameterises the loss (a loss module's settings and tensors, a loss function's closure) the
//               same on every rank (loss-per-rank);
//   sampler     a DistributedSampler's seed, num_replicas and rank agree with the world (sampler-seed-per-rank);
//   bypass      a rank stepped its optimizer with gradients but DDP reduced no bucket (bypass-ddp);
//   buckets     bucket assignment and order against torch's algorithm for the parameters and bucket_cap_mb
//               (core/buckets.h: the initial layout at step 0, one rebuild from ready order after it), the
//               same on every rank;
//   mean        every rank's reduced bucket = the mean over ranks of the local buckets, within the rounding of
//               W summands;
//   reference   each rank's local gradient against the float64 gradient of its micro-batches, and the reduced
//               gradient against their mean (the single-process gradient of the global batch), within
//               64 u (rows + largest parameter + W) max|ref|; a common factor is named (loss-times-world = W,
//               grad-accum-normalisation = the micro-batch count), a factor on one rank is loss-scale-per-rank;
//   lr          each group's lr the same on every rank (scheduler-one-rank names the rank that stepped its
//               scheduler a different number of times), against ddpcheck's own schedulers where every
//               scheduler is one it knows, stepped once per epoch;
//   optimizer   the parameters after the step reproduced by core/optimizer.h from the previous step's
//               parameters and optimizer state, the gradients the optimizer saw and each group's lr (bitwise
//               for SGD/Adam/AdamW, RMSprop, Adagrad, Adadelta; skip-step names a rank that did not step).
// Loading reads files (LoadProtocolRecords); the checks are pure functions of the records.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/dump.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

struct ProtocolBucket {
  int64_t index = 0;
  std::vector<int> params;  // parameter indices (DDP's order), in the bucket's layout order
  Tensor local;             // this rank's flattened gradients before the all-reduce
  std::optional<Tensor> reduced;  // after it
};

struct ProtocolStep {
  int64_t step = 0, epoch = 0;
  bool buckets_recorded = false;  // the recorder's hook was armed
  std::vector<ProtocolBucket> buckets;
  std::map<std::string, Tensor> grads, params;  // grads: what the optimizer saw
  std::map<std::string, std::map<std::string, Tensor>> opt_state;  // state name -> param -> tensor
  std::map<std::string, double> opt_counts;  // state['step'] per param
  std::map<std::string, Tensor> ref_grads;  // float64 reference of this rank's micro-batches
  std::string ref_note;
  int64_t ref_rows = 0, microbatches = 0;
  std::optional<double> loss, ref_loss;  // the loss passed to rec.step and the float64 loss of the last micro-batch
  // The loss passed to rec.step over the loss module's value, where they differ by no clean factor (the loop added
  // terms or scaled the loss): ref_grads is then the loss module's gradient, which the local gradient matches only
  // as this ratio times it when the loop scaled its loss (core/dump_protocol_ref.cc).
  std::optional<double> ref_loss_ratio;
  // Buffers at the start of the step's first forward through DDP (after its broadcast) and at rec.step(); whether
  // that forward was the module's first since the last rec.step() (the recorder's forward_buffers_first)
  std::map<std::string, Tensor> forward_buffers, buffers;
  bool forward_buffers_first = false;
  // What parameterised the loss at rec.step() (the recorder's loss_state: name -> number, bool or string); nullopt
  // where the recorder did not take it (an older one, a loss named by a string)
  std::optional<std::map<std::string, nlohmann::json>> loss_state;
  // What the module's submodules held that DDP does not broadcast at rec.step() (the recorder's model_state: plain
  // attribute tensors "attr:<path>", plain settings "settings:<submodule>"); nullopt where not taken
  std::optional<std::map<std::string, nlohmann::json>> model_state;
  // The parameters the optimizer steps outside DDP's module, after the step (the recorder's outside_params:
  // "group<g>[<i>]" -> their values or checksum); nullopt where there are none or the recorder is older.
  std::optional<std::map<std::string, nlohmann::json>> outside_params;
  // Each param group's hyper-parameters at the optimizer step but the lr ("weight_decay (group 0)" -> its value), from
  // the recorder's groups; nullopt where the step does not record them.
  std::optional<std::map<std::string, nlohmann::json>> optimizer_settings;
  std::vector<double> lrs;  // each group's lr at the optimizer step
  // The recorder saw the optimizer step with an lr no scheduler given to it set (by hand: a warmup in the loop,
  // adjust_learning_rate(); or a scheduler it was not given): from here on the lr follows no known schedule.
  bool lr_edited = false;
  std::vector<OptimizerSpec> groups;  // each group's hyper-parameters at the optimizer step (empty: as constructed)
  int64_t optimizer_steps = 1, scheduler_steps = 0;
  bool optimizer_steps_known = false;  // the recorder counted optimizer.step() calls (optimizer_steps)
  int64_t ddp_forwards = -1;  // forwards through the DDP wrapper in the step (-1: not recorded)
  int64_t scheduler_steps_before = 0;  // scheduler.step() calls before this step's optimizer.step()
  std::vector<int64_t> indices;
  bool autocast = false;  // the step's forwards ran under torch.autocast
  bool autocast_known = false;  // the index says (older recorders said it only with a reference)
  std::optional<std::vector<std::string>> eval_modules;  // submodules in eval mode in its training forwards
  std::optional<std::string> trainable;  // "<count>:<crc32>" of the parameters its training forwards trained
  int64_t train_forwards = -1;  // forwards of the module with a gradient to come (-1: not recorded)
  bool after_gap = false;  // steps before it were not kept (Join's uneven tail): its previous state is unknown
  bool scaler = false;  // the step recorded an enabled GradScaler (its unscale_ divides the grads by the scale)
  // Parameters (or their optimizer state) the loop changed outside optimizer.step(), as the recorder noticed:
  // before the step (since the last rec.step(): a checkpoint loaded) or after it (weights clipped, p.data edited).
  std::vector<std::string> edited_before, edited_after;
};

struct ProtocolRank {
  int rank = 0;
  bool failed = false;
  std::string error;  // the exception the rank's run ended with, as recorded ("" when none)
  std::vector<std::string> param_names;  // this rank's parameters in DDP's order (its index's "params")
  std::map<std::string, Tensor> init;
  ProtocolStep init_optimizer;  // opt_state and opt_counts the optimizer had when the recorder started (a resume)
  std::optional<nlohmann::json> sampler;
  std::vector<ProtocolStep> steps;
};

struct ProtocolParam {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  bool requires_grad = true;
  // In DDP's buckets: it required grad when DDP(...) was built (the recorder's ddp_registered; requires_grad at the
  // recorder's start where the recording does not say, as before)
  bool ddp_registered = true;
  bool sparse = false;  // an Embedding(Bag) weight with sparse=True: DDP gives it a bucket of its own
};

struct ProtocolGroup {
  OptimizerSpec spec;
  double initial_lr = -1;  // group['initial_lr'] set by torch's schedulers; -1 when absent
  std::vector<int> params;
};

struct ProtocolRecords {
  int world = 1;
  DType dtype = DType::kFloat32;
  std::vector<ProtocolParam> params;  // DDP's order
  DdpSpec ddp;
  bool ddp_wrapped = true;
  int64_t ddp_iterations_before = 0;  // training forwards DDP ran before the recorder started (created mid-run)
  std::string optimizer_type;
  std::string optimizer_note;  // why the optimizer update is not checked ("" when it is)
  std::vector<ProtocolGroup> groups;
  std::vector<SchedulerSpec> schedulers;  // ddpcheck's own description, when every scheduler is known
  bool schedulers_known = false;
  int64_t steps_per_epoch = 0;  // from the sampler and batch size; 0 when unknown
  std::string buckets_note, reference_note;
  std::string comm_hook;  // the user's DDP communication hook, by name ("" for DDP's own all-reduce)
  std::vector<std::string> init_buffers_rebroadcast;  // TorchDump's: said in the report
  std::optional<TorchDump::DatasetConflict> dataset_conflict;  // TorchDump's
  // The submodules whose forward depends on train/eval mode, and why (BatchNorm with running statistics, Dropout
  // with p > 0, a class whose code reads self.training): only their modes must agree between ranks. nullopt when the
  // recorder did not say (an older one): every submodule's mode must agree.
  std::optional<std::map<std::string, std::string>> mode_dependent;
  // What DDP's forward was called with beside the batch, over the run, on any rank (the recorder's forward_inputs):
  // the most positional arguments and the keywords. Each rank's own: the report says they went unchecked.
  int64_t forward_positional = 0;
  std::set<std::string> forward_keywords;
  // ddpcheck replays the dump (TorchDump::replay_unsupported is empty): a step whose recorder skipped the float64
  // reference with reference='auto' (ProtocolStep::ref_note starts with kAutoReferenceNote) has the replay as its
  // single-process reference.
  bool replayed = false;
  std::vector<ProtocolRank> ranks;
};

// What a reduced bucket is compared against (Mismatch::against) when it is checked as the mean of the ranks' local
// buckets: a mismatch there means the reduction itself, not the loss, is off.
inline constexpr const char* kMeanOfLocalBuckets = "mean of the ranks' local buckets";

// How tools/ddpcheck_torch.py's reference='auto' notes a step it left to ddpcheck's replay.
inline constexpr const char* kAutoReferenceNote = "reference='auto': not recomputed, the run is replayed";
// How the recorder's note begins where the user's module or loss raised in the float64 reference
// (tools/ddpcheck_torch_protocol.py, Reference.compute).
inline constexpr const char* kReferenceFailedNote = "single-process reference failed";

// torch's param-group keys (lr, momentum, dampening, weight_decay, nesterov, maximize, betas, eps, amsgrad,
// alpha, centered, rho, lr_decay, initial_accumulator_value) as an OptimizerSpec of `type` (torch's class
// name lower-cased). Invalid names the key and why for an unknown type.
Status OptimizerSpecFromGroup(const std::string& type, const nlohmann::json& group, OptimizerSpec* out);

// Reads the recorder's protocol records of every rank (index keys and the tensors they name; docs/torch.md).
Status LoadProtocolRecords(const TorchDump& dump, ProtocolRecords* out);

struct ProtocolResult {
  CompareResult result;
  std::optional<Diagnosis> diagnosis;  // the first finding's BUGS.md pattern, when the evidence names one
  std::vector<std::string> checked;    // what was checked ("buckets", "reduced = mean of local", ...)
  std::vector<std::string> skipped;    // what was not, and why
  std::string reference;               // which single-process reference was used
  // Where no step of any rank had the recorder's single-process reference (it failed at every step: the user's model
  // or loss did not run in float64; or it could not be formed: no targets, LBFGS's closure): why, for the verdict
  // line. The gradients were then held to nothing but each other. Empty where some step had it, or none was asked.
  std::string reference_missing;
};

ProtocolResult CheckProtocol(const ProtocolRecords& records);

// Internal parts of CheckProtocol, one file each (core/dump_protocol_*.cc). A finding adds its mismatch to
// `out->result` and returns its pattern ("" when none is evident).
struct ProtocolFinding {
  Mismatch mismatch;
  std::string pattern;  // BUGS.md name, "" when the evidence names none
  std::string explanation;
  int priority = 0;  // among findings at one step, the lower one is the headline
};
void CheckProtocolData(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* findings);
void CheckProtocolOptimizer(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* findings);

}  // namespace ddpcheck::core
