// Trace: what one backend's run recorded, keyed (step, checkpoint, tensor, rank). Every backend records at the
// same checkpoints (ARCHITECTURE.md), so traces line up key by key and Compare can name the first key that
// differs. A trace is written to a folder (index.json + .npy files for large tensors) and read back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// In the order they happen within a step; the first failing key in this order is a report's headline.
enum class Checkpoint {
  kInit,            // params and buffers after DDP construction (the initial broadcast), step 0
  kSampler,         // "indices": the dataset rows of this step's batch (micro-batches concatenated)
  kForwardBuffers,  // buffers each rank's forward starts from (after the per-forward broadcast)
  kLoss,            // "loss" of this rank's batch (the last micro-batch's under no_sync accumulation)
  kLocalGrad,       // per parameter: this rank's gradient before DDP touches it
  kBucket,          // "bucket<b>": flattened bucket contents before the all-reduce; "bucket<b>.params": layout
  kReduced,         // per parameter: the gradient after DDP's all-reduce and write-back
  kUnscaled,        // per parameter: gradient after GradScaler.unscale_ (and clipping) (AMP)
  kScaler,          // "scale", "growth_tracker", "found_inf", "skipped" after update() (AMP)
  kLr,              // "lr" in effect for this step's optimizer step
  kParams,          // per parameter after the optimizer step
  kBuffers,         // per buffer at the end of the step (BatchNorm running stats, rank-local)
};
constexpr int kNumCheckpoints = 12;

std::string CheckpointName(Checkpoint c);  // "init", "sampler", "forward_buffers", ...
bool ParseCheckpoint(const std::string& name, Checkpoint* out);

// rank == kAllRanks: a value that holds for every rank (the reference's single parameter copy).
constexpr int kAllRanks = -1;

struct TraceKey {
  int64_t step = 0;
  Checkpoint checkpoint = Checkpoint::kInit;
  std::string tensor;
  int rank = kAllRanks;

  bool operator<(const TraceKey& o) const;
  bool operator==(const TraceKey& o) const;
  // "step 3, reduced, 0.weight, rank 1"
  std::string ToString() const;
};

// Something that happened instead of a value: a collective that timed out, a DDP error, a skipped step.
struct TraceEvent {
  int64_t step = 0;
  int rank = kAllRanks;
  Checkpoint checkpoint = Checkpoint::kInit;  // where the rank was when it happened
  std::string kind;     // "timeout", "ddp_error", "mismatch", ...
  std::string message;  // the full Status text
};

// A record's value. Records of different ranks holding bitwise the same values (DDP's parameters and reduced
// gradients after the all-reduce) share one copy (Trace::Add): W ranks of a large model hold it once, and two
// records that share it are equal without reading them. Float32 values recorded from a replica's memory are held
// as floats (RecordValue) and read as a Tensor (widened once) only where a reader needs doubles.
class SharedTensor {
 public:
  SharedTensor() = default;
  explicit SharedTensor(std::shared_ptr<const RecordValue> p) : p_(std::move(p)) {}
  const Tensor& operator*() const { return p_->tensor(); }
  const Tensor* operator->() const { return &p_->tensor(); }
  const Tensor* get() const { return &p_->tensor(); }
  operator const Tensor&() const { return p_->tensor(); }  // NOLINT: a record reads as its tensor
  // The value as held (dtype, shape, compact floats) without widening it.
  const RecordValue& value() const { return *p_; }
  const std::shared_ptr<const RecordValue>& ptr() const { return p_; }

 private:
  std::shared_ptr<const RecordValue> p_;
};

class Trace {
 public:
  Trace() = default;
  Trace(const Trace& o);
  Trace& operator=(const Trace& o);
  // Moves take the records without copying them (a trace of a large model is gigabytes).
  Trace(Trace&& o) noexcept;
  Trace& operator=(Trace&& o) noexcept;

  // Thread-safe: rank threads add concurrently. A second Add for one key replaces the first. A value of at least
  // kShareMin elements bitwise equal to another rank's record of the same (step, checkpoint, tensor) shares it.
  void Add(const TraceKey& key, Tensor value);
  void Add(const TraceKey& key, std::shared_ptr<const RecordValue> value);
  // Records, without a copy, the value of another rank's record of the same (step, checkpoint, tensor) that
  // `same` accepts (a replica's device memory compared in place); false, recording nothing, when none does.
  bool AddTwin(const TraceKey& key, const std::function<bool(const RecordValue&)>& same);
  void AddEvent(TraceEvent event);
  // While set, Add also shares a value of at least kShareMin elements bitwise equal to `other`'s record of the
  // same key (or of the same (step, checkpoint, tensor) for all ranks / rank 0 where one side records it for all
  // ranks): a reference run beside the world it checks holds the local gradients both computed alike once.
  // `other` must outlive the setting and not change meanwhile; nullptr clears it. Copies do not carry it.
  void SetTwinSource(const Trace* other) { twin_source_ = other; }
  // The twin source's record for key (matched as Add matches it) when `same` accepts it, else nullptr: a value
  // compared where it lies, without a copy. Thread-safe while the source does not change.
  std::shared_ptr<const RecordValue> SourceRecord(const TraceKey& key,
                                                  const std::function<bool(const RecordValue&)>& same) const;
  // Records p, a value held with another trace (SourceRecord), as key's.
  void AddShared(const TraceKey& key, std::shared_ptr<const RecordValue> p);
  // Moves the records of steps <= last_step (not the events or meta) into the returned trace. Not synchronised
  // with Add.
  Trace TakeSteps(int64_t last_step);
  // nullptr when absent. Not synchronised with Add: read after the run.
  const Tensor* Find(const TraceKey& key) const;
  // key's record, or else the one of the same (step, checkpoint, tensor) for all ranks (a trace that records a
  // value once for every rank, as the reference does); nullptr when neither is there.
  const Tensor* FindOrAllRanks(TraceKey key) const;
  // Find and FindOrAllRanks for the value as held (compact values not widened).
  const RecordValue* FindValue(const TraceKey& key) const;
  const RecordValue* FindValueOrAllRanks(TraceKey key) const;
  const std::map<TraceKey, SharedTensor>& records() const { return records_; }
  const std::vector<TraceEvent>& events() const { return events_; }

  // Provenance and run description: backend, world, precision, scenario name, version, commit, host.
  nlohmann::json meta = nlohmann::json::object();

  // Writes DIR/index.json (+ DIR/t<N>.npy for tensors of more than kInlineMax elements). Creates DIR.
  Status Write(const std::string& dir) const;
  static Status Read(const std::string& dir, Trace* out);
  // The files Write writes, in memory ("index.json", "t<N>.npy" -> their bytes), and Read from them: a trace
  // shard crosses the store without a file per tensor on disk. `where` names the files in Decode's errors.
  Status Encode(std::map<std::string, std::string>* files) const;
  // Reads a record's .npy file by its name in the trace (a folder's file, or bytes in memory).
  using NpyLoader = std::function<Status(const std::string& file, Tensor* out)>;
  static Status Decode(const std::map<std::string, std::string>& files, const std::string& where, Trace* out);

  static constexpr int64_t kInlineMax = 64;
  static constexpr int64_t kShareMin = 1024;
  // Whether a value of this dtype and size is recorded as floats (RecordValue): float32 of a model's size.
  static constexpr bool HeldAsFloats(DType dtype, int64_t numel) {
    return dtype == DType::kFloat32 && numel >= kShareMin;
  }

 private:
  // Write and Encode: every file to `sink` (the .npy files as they are made, index.json last).
  Status EncodeTo(const std::function<Status(const std::string& name, std::string bytes)>& sink) const;
  // Read and Decode once the index is parsed; `load` reads a record's .npy file by its name.
  static Status FromIndex(const nlohmann::json& index, const std::string& path, const NpyLoader& load, Trace* out);
  // Other ranks' records of key's (step, checkpoint, tensor), distinct values only (taken under mu_).
  std::vector<std::shared_ptr<const RecordValue>> Twins(const TraceKey& key) const;
  std::vector<std::shared_ptr<const RecordValue>> TwinsLocked(const TraceKey& key) const;  // mu_ held
  // twin_source_'s value equal to p for key, or nullptr.
  std::shared_ptr<const RecordValue> SourceTwin(const TraceKey& key, const RecordValue& p) const;
  mutable std::mutex mu_;
  std::map<TraceKey, SharedTensor> records_;
  std::vector<TraceEvent> events_;
  const Trace* twin_source_ = nullptr;
};

// JSON encoding of doubles that keeps NaN and infinities ("nan", "inf", "-inf" strings).
nlohmann::json EncodeValue(double v);
bool DecodeValue(const nlohmann::json& j, double* out);

}  // namespace ddpcheck::core
