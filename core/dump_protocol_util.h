// Helpers shared by the core/dump_protocol_*.cc files (not a public interface).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dump_protocol.h"

namespace ddpcheck::core {

// The most steps any rank recorded.
size_t MaxSteps(const ProtocolRecords& r);
// The ranks that recorded step s (and whose step s passes `keep`, when given), in rank order.
std::vector<const ProtocolRank*> RanksAt(const ProtocolRecords& r, size_t s,
                                         const std::function<bool(const ProtocolStep&)>& keep = nullptr);

// Per parameter: its slice of the step's `reduced` (or local) buckets, from the last hook call that holds it;
// parameters without one are absent.
std::map<std::string, std::vector<double>> FromBuckets(const ProtocolRecords& r, const ProtocolStep& s, bool reduced);

// The bucket layout a step's hook calls show: bucket b's parameter indices, by bucket index (first call of each).
std::vector<std::vector<int>> BucketLayout(const ProtocolStep& s);
std::string LayoutString(const std::vector<std::vector<int>>& layout);  // "[[3, 2], [1, 0]]"

// The worst element of `got` beyond its budget (nullopt when every element is within), as a Mismatch at `key`.
std::optional<Mismatch> CompareElementwise(const TraceKey& key, const std::vector<double>& got,
                                           const std::vector<double>& want, const std::vector<double>& budget,
                                           const std::string& against);
// One tensor compared at checkpoint c (CompareResult::stats).
void Account(ProtocolResult* out, Checkpoint c);

// The unit roundoff a communication hook adds to the all-reduce: 2^-11 for an fp16 compression hook (torch's
// default_hooks.fp16_compress_hook and its wrappers), 2^-8 for bf16, infinity for a hook that approximates
// (PowerSGD, quantization: the reduced gradient is not checked by value), 0 for DDP's own all-reduce or a hook
// that keeps float32 (allreduce_hook, a user's mean).
double CommHookRoundoff(const ProtocolRecords& r);

// Whether every spec passes ValidateSchedulerSpec.
bool ValidateSchedulerSpecs(const std::vector<SchedulerSpec>& specs);

// The single-process reference check (core/dump_protocol_ref.cc).
void CheckReference(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f);

// What must be the same on every rank at each step although DDP does not make it so (core/dump_protocol_loss.cc):
// everything that parameterises the loss (ProtocolStep::loss_state: loss-per-rank); what the module's submodules
// hold that DDP does not broadcast (model_state: plain attribute tensors, plain settings; attribute-per-rank); the
// parameters the optimizer steps outside DDP's module, whose gradients DDP never all-reduces (outside_params:
// param-outside-ddp); each param group's hyper-parameters but the lr (optimizer_settings: weight_decay, momentum,
// betas, eps; optimizer-settings-per-rank).
void CheckStatesAgree(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f);

// Each step's forward buffers against rank 0's after the step before, with broadcast_buffers
// (core/dump_protocol_buffers.cc).
void CheckBufferBroadcast(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f);
// A BatchNorm's (or InstanceNorm's) running statistic by its name: running_mean, running_var, num_batches_tracked.
bool IsNormStatistic(const std::string& name);

}  // namespace ddpcheck::core
