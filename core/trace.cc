#include "core/trace.h"

#include "core/file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/json_reader.h"
#include "core/npy.h"
#include "core/scenario.h"

namespace ddpcheck::core {

namespace {
constexpr const char* kCheckpointNames[kNumCheckpoints] = {
    "init", "sampler", "forward_buffers", "loss", "local_grad", "bucket",
    "reduced", "unscaled", "scaler", "lr", "params", "buffers"};
constexpr const char* kFormat = "ddpcheck-trace";
constexpr int kFormatVersion = 1;
}  // namespace

std::string CheckpointName(Checkpoint c) { return kCheckpointNames[static_cast<int>(c)]; }

bool ParseCheckpoint(const std::string& name, Checkpoint* out) {
  for (int i = 0; i < kNumCheckpoints; ++i) {
    if (name == kCheckpointNames[i]) {
      *out = static_cast<Checkpoint>(i);
      return true;
    }
  }
  return false;
}

bool TraceKey::operator<(const TraceKey& o) const {
  return std::tie(step, checkpoint, tensor, rank) < std::tie(o.step, o.checkpoint, o.tensor, o.rank);
}
bool TraceKey::operator==(const TraceKey& o) const {
  return step == o.step && checkpoint == o.checkpoint && tensor == o.tensor && rank == o.rank;
}

std::string TraceKey::ToString() const {
  return "step " + std::to_string(step) + ", " + CheckpointName(checkpoint) + ", " + tensor + ", " +
         (rank == kAllRanks ? std::string("all ranks") : "rank " + std::to_string(rank));
}

Trace::Trace(const Trace& o) {
  std::lock_guard<std::mutex> lock(o.mu_);
  records_ = o.records_;
  events_ = o.events_;
  meta = o.meta;
}

Trace& Trace::operator=(const Trace& o) {
  if (this == &o) return *this;
  std::scoped_lock lock(mu_, o.mu_);
  records_ = o.records_;
  events_ = o.events_;
  meta = o.meta;
  return *this;
}

Trace::Trace(Trace&& o) noexcept {
  std::lock_guard<std::mutex> lock(o.mu_);
  records_ = std::move(o.records_);
  events_ = std::move(o.events_);
  meta = std::move(o.meta);
}

Trace& Trace::operator=(Trace&& o) noexcept {
  if (this == &o) return *this;
  std::scoped_lock lock(mu_, o.mu_);
  records_ = std::move(o.records_);
  events_ = std::move(o.events_);
  meta = std::move(o.meta);
  return *this;
}

Trace Trace::TakeSteps(int64_t last_step) {
  Trace out;
  while (!records_.empty() && records_.begin()->first.step <= last_step) {
    out.records_.insert(records_.extract(records_.begin()));
  }
  return out;
}

std::vector<std::shared_ptr<const RecordValue>> Trace::Twins(const TraceKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return TwinsLocked(key);
}

std::vector<std::shared_ptr<const RecordValue>> Trace::TwinsLocked(const TraceKey& key) const {
  std::vector<std::shared_ptr<const RecordValue>> out;
  if (key.rank == kAllRanks) return out;
  TraceKey from = key;
  from.rank = std::numeric_limits<int>::min();
  for (auto it = records_.lower_bound(from); it != records_.end() && it->first.step == key.step &&
                                            it->first.checkpoint == key.checkpoint && it->first.tensor == key.tensor;
       ++it) {
    const auto& p = it->second.ptr();
    if (it->first.rank != key.rank && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

std::shared_ptr<const RecordValue> Trace::SourceTwin(const TraceKey& key, const RecordValue& p) const {
  return SourceRecord(key, [&](const RecordValue& t) { return BitwiseEqual(t, p); });
}

std::shared_ptr<const RecordValue> Trace::SourceRecord(const TraceKey& key,
                                                       const std::function<bool(const RecordValue&)>& same) const {
  if (!twin_source_) return nullptr;
  const auto& theirs = twin_source_->records_;
  TraceKey other = key;
  auto it = theirs.find(other);
  if (it == theirs.end()) {
    other.rank = key.rank == kAllRanks ? 0 : kAllRanks;
    it = theirs.find(other);
  }
  if (it == theirs.end() || !same(*it->second.ptr())) return nullptr;
  return it->second.ptr();
}

void Trace::AddShared(const TraceKey& key, std::shared_ptr<const RecordValue> p) {
  std::lock_guard<std::mutex> lock(mu_);
  records_.insert_or_assign(key, SharedTensor(std::move(p)));
}

void Trace::Add(const TraceKey& key, Tensor value) { Add(key, std::make_shared<const RecordValue>(std::move(value))); }

void Trace::Add(const TraceKey& key, std::shared_ptr<const RecordValue> p) {
  const bool shareable = p->numel() >= kShareMin;
  std::vector<std::shared_ptr<const RecordValue>> seen;
  if (shareable) {
    if (auto twin = SourceTwin(key, *p)) p = std::move(twin);
    // Compared outside the lock: the other ranks keep adding meanwhile.
    seen = Twins(key);
    for (const auto& twin : seen) {
      if (BitwiseEqual(*twin, *p)) {
        p = twin;
        break;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shareable && std::find(seen.begin(), seen.end(), p) == seen.end()) {
    // A twin another rank added since (two ranks recording one value at once): compared under the lock, so
    // that of two equal values added together the second always shares the first. Rare: no copy waits here
    // otherwise.
    for (const auto& twin : TwinsLocked(key)) {
      if (std::find(seen.begin(), seen.end(), twin) == seen.end() && BitwiseEqual(*twin, *p)) {
        p = twin;
        break;
      }
    }
  }
  records_.insert_or_assign(key, SharedTensor(std::move(p)));
}

bool Trace::AddTwin(const TraceKey& key, const std::function<bool(const RecordValue&)>& same) {
  for (const auto& twin : Twins(key)) {
    if (!same(*twin)) continue;
    std::lock_guard<std::mutex> lock(mu_);
    records_.insert_or_assign(key, SharedTensor(twin));
    return true;
  }
  return false;
}

void Trace::AddEvent(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
}

const Tensor* Trace::FindOrAllRanks(TraceKey key) const {
  if (const Tensor* v = Find(key)) return v;
  key.rank = kAllRanks;
  return Find(key);
}

const RecordValue* Trace::FindValueOrAllRanks(TraceKey key) const {
  if (const RecordValue* v = FindValue(key)) return v;
  key.rank = kAllRanks;
  return FindValue(key);
}

const RecordValue* Trace::FindValue(const TraceKey& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : it->second.ptr().get();
}

const Tensor* Trace::Find(const TraceKey& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : it->second.get();
}

nlohmann::json EncodeValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

bool DecodeValue(const nlohmann::json& j, double* out) {
  if (j.is_number()) {
    *out = j.get<double>();
    return true;
  }
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "nan") { *out = std::nan(""); return true; }
    if (s == "inf") { *out = INFINITY; return true; }
    if (s == "-inf") { *out = -INFINITY; return true; }
  }
  return false;
}

Status Trace::Write(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Io(dir + ": cannot create trace folder: " + ec.message());
  // One file at a time (a large trace is not held twice), the index last: a folder with an index.json is complete.
  return EncodeTo([&](const std::string& name, std::string bytes) { return WriteStringToFile(dir + "/" + name, bytes); });
}

Status Trace::Encode(std::map<std::string, std::string>* files) const {
  files->clear();
  return EncodeTo([&](const std::string& name, std::string bytes) {
    (*files)[name] = std::move(bytes);
    return Status::Ok();
  });
}

Status Trace::EncodeTo(const std::function<Status(const std::string& name, std::string bytes)>& sink) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json index = {{"format", kFormat}, {"version", kFormatVersion}, {"meta", meta}};
  nlohmann::json records = nlohmann::json::array();
  int file_no = 0;
  std::map<const RecordValue*, std::string> written;  // a value ranks share is one file
  for (const auto& [key, shared] : records_) {
    const RecordValue& t = shared.value();  // (a value held as floats is written from them, not widened)
    nlohmann::json r = {{"step", key.step},
                        {"checkpoint", CheckpointName(key.checkpoint)},
                        {"tensor", key.tensor},
                        {"rank", key.rank},
                        {"dtype", DTypeName(t.dtype())},
                        {"shape", t.shape()}};
    if (t.numel() <= kInlineMax) {
      nlohmann::json values = nlohmann::json::array();
      for (double v : t.tensor().data) values.push_back(EncodeValue(v));
      r["values"] = std::move(values);
    } else if (auto w = written.find(&t); w != written.end()) {
      r["file"] = w->second;
    } else {
      std::string file = "t" + std::to_string(file_no++) + ".npy";
      std::string bytes;
      const RecordValue::Floats floats = t.floats();
      Status st = floats ? EncodeNpyFloats(t.shape(), *floats, &bytes) : EncodeNpy(t.tensor(), &bytes);
      if (!st.ok()) return st.Prefixed(file);
      DDPCHECK_RETURN_IF_ERROR(sink(file, std::move(bytes)));
      r["file"] = file;
      written[&t] = file;
    }
    records.push_back(std::move(r));
  }
  index["records"] = std::move(records);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : events_) {
    events.push_back({{"step", e.step}, {"rank", e.rank}, {"checkpoint", CheckpointName(e.checkpoint)},
                      {"kind", e.kind}, {"message", e.message}});
  }
  index["events"] = std::move(events);
  return sink("index.json", index.dump(1) + "\n");
}

namespace {

// The largest tensor a trace record may declare: a record is either inline (its values are in the file) or a
// .npy file whose own size bounds it, so this only keeps a hostile shape from overflowing.
constexpr int64_t kMaxRecordElements = int64_t{1} << 40;

// Integers of the index: exact, within [lo, hi]; `where` is "<file>: /records/3/step".
Status IndexInt(const nlohmann::json& v, const std::string& where, int64_t lo, int64_t hi, int64_t* out) {
  DDPCHECK_RETURN_IF_ERROR(ReadInt64(v, where, out));
  if (*out < lo || *out > hi) {
    return JsonError(where, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
  }
  return Status::Ok();
}

Status ReadRecord(const nlohmann::json& r, const Trace::NpyLoader& load, const std::string& where, TraceKey* key,
                  Tensor* value) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(
      JsonObject::Open(r, where, {"step", "checkpoint", "tensor", "rank", "dtype", "shape", "values", "file"}, &o));
  for (const char* k : {"step", "checkpoint", "tensor", "rank", "dtype", "shape"}) {
    DDPCHECK_RETURN_IF_ERROR(o.Require(k, "every trace record has step, checkpoint, tensor, rank, dtype and shape"));
  }
  DDPCHECK_RETURN_IF_ERROR(IndexInt(o.At("step"), o.PathOf("step"), 0, kMaxSteps, &key->step));
  std::string checkpoint, dtype;
  DDPCHECK_RETURN_IF_ERROR(o.String("checkpoint", &checkpoint));
  if (!ParseCheckpoint(checkpoint, &key->checkpoint)) {
    return Status::Invalid(o.PathOf("checkpoint") + ": unknown checkpoint '" + checkpoint + "'");
  }
  DDPCHECK_RETURN_IF_ERROR(o.String("tensor", &key->tensor));
  int64_t rank = 0;
  DDPCHECK_RETURN_IF_ERROR(IndexInt(o.At("rank"), o.PathOf("rank"), kAllRanks, kMaxWorld - 1, &rank));
  key->rank = static_cast<int>(rank);
  DDPCHECK_RETURN_IF_ERROR(o.String("dtype", &dtype));
  if (!ParseDType(dtype, &value->dtype)) return Status::Invalid(o.PathOf("dtype") + ": unknown dtype '" + dtype + "'");
  const nlohmann::json& shape = o.At("shape");
  if (!shape.is_array()) return JsonError(o.PathOf("shape"), "must be an array of sizes", shape);
  value->shape.assign(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    DDPCHECK_RETURN_IF_ERROR(IndexInt(shape[i], JsonPath(o.PathOf("shape"), i), 0, kMaxRecordElements, &value->shape[i]));
  }
  int64_t numel = 0;
  if (!CheckedNumel(value->shape, kMaxRecordElements, &numel)) {
    return JsonError(o.PathOf("shape"), "must have at most 2^40 elements", shape);
  }
  if (o.Has("file")) {
    std::string file;
    DDPCHECK_RETURN_IF_ERROR(o.String("file", &file));
    if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos) {
      return JsonError(o.PathOf("file"), "must be the name of a .npy file inside the trace folder", o.At("file"));
    }
    Tensor loaded;
    DDPCHECK_RETURN_IF_ERROR(load(file, &loaded).Prefixed(o.PathOf("file")));
    if (loaded.shape != value->shape) {
      return Status::Invalid(o.PathOf("file") + ": " + file + " has shape " + ShapeString(loaded.shape) +
                             ", the record says " + ShapeString(value->shape));
    }
    // The file holds the record's dtype (bfloat16 is written as float32; QA round 16: a float64 file under a
    // float32 record was read as float32 values)
    const bool widened = value->dtype == DType::kBFloat16 && loaded.dtype == DType::kFloat32;
    if (loaded.dtype != value->dtype && !widened) {
      return Status::Invalid(o.PathOf("file") + ": " + file + " holds " + DTypeName(loaded.dtype) +
                             " values, the record says " + DTypeName(value->dtype) + " (an edited trace? write it again)");
    }
    value->data = std::move(loaded.data);
    return Status::Ok();
  }
  DDPCHECK_RETURN_IF_ERROR(o.Require("values", "a record holds its \"values\" inline or names a .npy \"file\""));
  const nlohmann::json& values = o.At("values");
  if (!values.is_array() || static_cast<int64_t>(values.size()) != numel) {
    return JsonError(o.PathOf("values"), "must be an array of " + std::to_string(numel) + " numbers (shape " +
                                             ShapeString(value->shape) + ")", values);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    double d;
    if (!DecodeValue(values[i], &d)) {
      return JsonError(JsonPath(o.PathOf("values"), i), "must be a number or \"nan\", \"inf\", \"-inf\"", values[i]);
    }
    value->data.push_back(d);
  }
  return Status::Ok();
}

// A float32 value of a model's size as a run holds it (core::RecordValue, floats), when every value is a float
// (a .npy of float32 always; an edited index's inline values need not be): nullptr otherwise.
std::shared_ptr<const RecordValue> AsFloats(const Tensor& t) {
  if (!Trace::HeldAsFloats(t.dtype, t.numel())) return nullptr;
  std::vector<float> f(t.data.begin(), t.data.end());
  if (!WidenedBitwiseEqual(f.data(), t.data)) return nullptr;
  return std::make_shared<const RecordValue>(t.shape, std::move(f));
}

Status ReadEvent(const nlohmann::json& e, const std::string& where, TraceEvent* ev) {
  JsonObject o;
  DDPCHECK_RETURN_IF_ERROR(JsonObject::Open(e, where, {"step", "rank", "checkpoint", "kind", "message"}, &o));
  if (o.Has("step")) DDPCHECK_RETURN_IF_ERROR(IndexInt(o.At("step"), o.PathOf("step"), 0, kMaxSteps, &ev->step));
  if (o.Has("rank")) {
    int64_t rank = 0;
    DDPCHECK_RETURN_IF_ERROR(IndexInt(o.At("rank"), o.PathOf("rank"), kAllRanks, kMaxWorld - 1, &rank));
    ev->rank = static_cast<int>(rank);
  }
  std::string checkpoint = "init";
  DDPCHECK_RETURN_IF_ERROR(o.String("checkpoint", &checkpoint));
  if (!ParseCheckpoint(checkpoint, &ev->checkpoint)) {
    return Status::Invalid(o.PathOf("checkpoint") + ": unknown checkpoint '" + checkpoint + "'");
  }
  DDPCHECK_RETURN_IF_ERROR(o.String("kind", &ev->kind));
  return o.String("message", &ev->message);
}

// The meta keys `ddpcheck diff` reads, at their types (other keys are free-form provenance).
Status CheckMeta(const nlohmann::json& meta, const std::string& where) {
  if (!meta.is_object()) return JsonError(where, "must be an object", meta);
  const auto has = [&](const char* k) { return meta.contains(k); };
  if (has("exact") && !meta.at("exact").is_boolean()) return JsonError(where + "/exact", "must be true or false", meta.at("exact"));
  for (const char* k : {"precision", "scenario", "backend"}) {
    if (has(k) && !meta.at(k).is_string()) return JsonError(JsonPath(where, k), "must be a string", meta.at(k));
  }
  DType precision;
  if (has("precision") && !ParseDType(meta.at("precision").get<std::string>(), &precision)) {
    return JsonError(where + "/precision", "must be a dtype ddpcheck knows (float64, float32, ...)", meta.at("precision"));
  }
  int64_t v = 0;
  if (has("world")) DDPCHECK_RETURN_IF_ERROR(IndexInt(meta.at("world"), where + "/world", 1, kMaxWorld, &v));
  if (has("reduction_length")) {
    DDPCHECK_RETURN_IF_ERROR(IndexInt(meta.at("reduction_length"), where + "/reduction_length", 1, kMaxRecordElements, &v));
  }
  return Status::Ok();
}

}  // namespace

Status Trace::Read(const std::string& dir, Trace* out) {
  const std::string path = dir + "/index.json";
  if (Status at = ExpectFile(path); !at.ok()) {  // a symlink loop or a folder named index.json: the OS's reason
    return at.code() == Code::kNotFound
               ? Status::NotFound(path + ": no trace here (expected a folder written by --dump-trace)")
               : Status(at.code(), at.message() + " (expected a folder written by --dump-trace)");
  }
  nlohmann::json index;
  DDPCHECK_RETURN_IF_ERROR(ReadJsonFile(path, &index));
  DDPCHECK_RETURN_IF_ERROR(
      FromIndex(index, path, [&](const std::string& file, Tensor* t) { return ReadNpy(dir + "/" + file, t); }, out));
  // A stored trace holds every rank's initial state and steps: one with no records, or none of a rank of its world,
  // was emptied or cut (diff compared the records one side holds: it PASSed with 0 tensors compared).
  if (out->records().empty()) {
    return Status::Invalid(path + ": /records: holds no record; a trace written by --dump-trace holds every rank's "
                                  "initial state and steps (this one was emptied or cut short: write it again)");
  }
  if (out->meta.is_object() && out->meta.contains("world") && out->meta.at("world").is_number_integer()) {
    const int64_t world = out->meta.at("world").get<int64_t>();
    std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(world, 0)), false);
    for (const auto& [key, v] : out->records()) {
      if (key.rank >= world) {  // (QA round 16: a rank-99 record in a world of 4 was "rank 4 missing", exit 1)
        return Status::Invalid(fmt::format("{}: /records: a record of rank {} (step {}, {}, tensor {}), though "
                                           "/meta/world is {}: an edited trace? write it again",
                                           path, key.rank, key.step, CheckpointName(key.checkpoint), key.tensor, world));
      }
      if (key.rank >= 0) seen[static_cast<size_t>(key.rank)] = true;
    }
    for (int64_t r = 0; r < world; ++r) {
      if (!seen[static_cast<size_t>(r)]) {
        return Status::Invalid(fmt::format("{}: /records: no record of rank {}, though /meta/world is {}: every rank "
                                           "records its initial state and steps (the trace was cut: write it again)",
                                           path, r, world));
      }
    }
  }
  return Status::Ok();
}

Status Trace::Decode(const std::map<std::string, std::string>& files, const std::string& where, Trace* out) {
  const auto it = files.find("index.json");
  if (it == files.end()) return Status::Invalid(where + ": no index.json");
  const std::string path = where + "/index.json";
  nlohmann::json index;
  DDPCHECK_RETURN_IF_ERROR(ParseJsonText(it->second, path, &index));
  return FromIndex(index, path, [&](const std::string& file, Tensor* t) {
    const auto f = files.find(file);
    if (f == files.end()) return Status::Invalid(where + ": " + file + " is missing");
    return ParseNpy(f->second, where + "/" + file, t);
  }, out);
}

Status Trace::FromIndex(const nlohmann::json& index, const std::string& path, const NpyLoader& load, Trace* out) {
  if (!index.is_object() || !index.contains("format") || index.at("format") != kFormat) {
    return Status::Invalid(path + ": not a ddpcheck trace (missing \"format\": \"" + kFormat + "\")");
  }
  if (!index.contains("version") || index.at("version") != kFormatVersion) {
    return Status::Invalid(path + ": /version: trace format version " + index.value("version", nlohmann::json()).dump() +
                           " is not supported; this ddpcheck reads version " + std::to_string(kFormatVersion));
  }
  Trace t;
  t.meta = index.value("meta", nlohmann::json::object());
  DDPCHECK_RETURN_IF_ERROR(CheckMeta(t.meta, "/meta").Prefixed(path));
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json& records = index.contains("records") ? index.at("records") : empty;
  const nlohmann::json& events = index.contains("events") ? index.at("events") : empty;
  if (!records.is_array()) return JsonError("/records", "must be an array of records", records).Prefixed(path);
  if (!events.is_array()) return JsonError("/events", "must be an array of events", events).Prefixed(path);
  for (size_t i = 0; i < records.size(); ++i) {
    TraceKey key;
    Tensor value;
    DDPCHECK_RETURN_IF_ERROR(ReadRecord(records[i], load, JsonPath("/records", i), &key, &value).Prefixed(path));
    if (t.FindValue(key)) {  // (the writer writes each key once: a second one would silently replace the first)
      return Status::Invalid(fmt::format("{}: {}: a second record of step {}, {}, tensor {}, rank {}", path,
                                         JsonPath("/records", i), key.step, CheckpointName(key.checkpoint), key.tensor,
                                         key.rank));
    }
    if (auto held = AsFloats(value)) {
      value = Tensor();
      t.Add(key, std::move(held));
    } else {
      t.Add(key, std::move(value));
    }
  }
  for (size_t i = 0; i < events.size(); ++i) {
    TraceEvent ev;
    DDPCHECK_RETURN_IF_ERROR(ReadEvent(events[i], JsonPath("/events", i), &ev).Prefixed(path));
    t.events_.push_back(std::move(ev));
  }
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace ddpcheck::core
