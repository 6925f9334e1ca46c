#include "core/trace.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "core/npy.h"

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

void Trace::Add(const TraceKey& key, Tensor value) {
  std::lock_guard<std::mutex> lock(mu_);
  records_[key] = std::move(value);
}

void Trace::AddEvent(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
}

const Tensor* Trace::Find(const TraceKey& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
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
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json index = {{"format", kFormat}, {"version", kFormatVersion}, {"meta", meta}};
  nlohmann::json records = nlohmann::json::array();
  int file_no = 0;
  for (const auto& [key, t] : records_) {
    nlohmann::json r = {{"step", key.step},
                        {"checkpoint", CheckpointName(key.checkpoint)},
                        {"tensor", key.tensor},
                        {"rank", key.rank},
                        {"dtype", DTypeName(t.dtype)},
                        {"shape", t.shape}};
    if (t.numel() <= kInlineMax) {
      nlohmann::json values = nlohmann::json::array();
      for (double v : t.data) values.push_back(EncodeValue(v));
      r["values"] = std::move(values);
    } else {
      std::string file = "t" + std::to_string(file_no++) + ".npy";
      DDPCHECK_RETURN_IF_ERROR(WriteNpy(dir + "/" + file, t));
      r["file"] = file;
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
  std::ofstream out(dir + "/index.json");
  if (!out) return Status::Io(dir + "/index.json: cannot write");
  out << index.dump(1) << "\n";
  if (!out) return Status::Io(dir + "/index.json: write failed (disk full?)");
  return Status::Ok();
}

Status Trace::Read(const std::string& dir, Trace* out) {
  const std::string path = dir + "/index.json";
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": no trace here (expected a folder written by --dump-trace)");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return Status::Io(path + ": not valid JSON: " + e.what());
  }
  if (!index.is_object() || index.value("format", "") != kFormat) {
    return Status::Invalid(path + ": not a ddpcheck trace (missing \"format\": \"" + kFormat + "\")");
  }
  if (index.value("version", 0) != kFormatVersion) {
    return Status::Invalid(path + ": trace format version " + index.value("version", nlohmann::json()).dump() +
                           " is not supported; this ddpcheck reads version " + std::to_string(kFormatVersion));
  }
  Trace t;
  t.meta = index.value("meta", nlohmann::json::object());
  const auto& records = index.value("records", nlohmann::json::array());
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    const std::string where = path + ": /records/" + std::to_string(i);
    try {
      TraceKey key;
      key.step = r.at("step").get<int64_t>();
      if (!ParseCheckpoint(r.at("checkpoint").get<std::string>(), &key.checkpoint)) {
        return Status::Invalid(where + "/checkpoint: unknown checkpoint '" + r.at("checkpoint").get<std::string>() + "'");
      }
      key.tensor = r.at("tensor").get<std::string>();
      key.rank = r.at("rank").get<int>();
      Tensor value;
      if (!ParseDType(r.at("dtype").get<std::string>(), &value.dtype)) {
        return Status::Invalid(where + "/dtype: unknown dtype " + r.at("dtype").dump());
      }
      value.shape = r.at("shape").get<std::vector<int64_t>>();
      if (r.contains("file")) {
        Tensor loaded;
        DDPCHECK_RETURN_IF_ERROR(ReadNpy(dir + "/" + r.at("file").get<std::string>(), &loaded));
        if (loaded.shape != value.shape) {
          return Status::Invalid(where + ": " + r.at("file").get<std::string>() + " has shape " +
                                 ShapeString(loaded.shape) + ", index says " + ShapeString(value.shape));
        }
        value.data = std::move(loaded.data);
      } else {
        for (const auto& v : r.at("values")) {
          double d;
          if (!DecodeValue(v, &d)) return Status::Invalid(where + "/values: not a number: " + v.dump());
          value.data.push_back(d);
        }
        if (value.numel() != NumelOf(value.shape)) {
          return Status::Invalid(where + ": " + std::to_string(value.numel()) + " values for shape " +
                                 ShapeString(value.shape));
        }
      }
      t.records_[key] = std::move(value);
    } catch (const nlohmann::json::exception& e) {
      return Status::Invalid(where + ": malformed record: " + e.what());
    }
  }
  for (const auto& e : index.value("events", nlohmann::json::array())) {
    TraceEvent ev;
    ev.step = e.value("step", int64_t{0});
    ev.rank = e.value("rank", kAllRanks);
    ParseCheckpoint(e.value("checkpoint", std::string("init")), &ev.checkpoint);
    ev.kind = e.value("kind", "");
    ev.message = e.value("message", "");
    t.events_.push_back(std::move(ev));
  }
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace ddpcheck::core
