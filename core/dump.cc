#include "core/dump.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/dump_index.h"
#include "core/dump_protocol_util.h"
#include "core/file.h"
#include "core/finite.h"
#include "core/json_reader.h"
#include "core/npy_archive.h"
#include "core/sampler.h"

namespace ddpcheck::core {

namespace {

namespace fs = std::filesystem;

// The dump format versions this reader knows (docs/torch.md, "Dump format"): 1 a .npy file per tensor, 2 per-step
// archives, 3 a rank's tensors may name rank 0's archive entries and a bucket's reduced gradient the step's grads.
constexpr int64_t kMaxDumpVersion = 3;

Status ReadIndex(const std::string& path, nlohmann::json* out) {
  if (Status at = ExpectFile(path); !at.ok()) {  // a symlink loop, a folder: the OS's reason, not "not found"
    return at.code() == Code::kNotFound ? Status::NotFound(path + ": not found") : at;
  }
  DDPCHECK_RETURN_IF_ERROR(ReadJsonFile(path, out));
  if (!out->is_object() || !out->contains("format") || out->at("format") != "ddpcheck-torch-dump") {
    return Status::Invalid(path + ": not a ddpcheck torch dump (\"format\" must be \"ddpcheck-torch-dump\"; "
                                  "write it with tools/ddpcheck_torch.py)");
  }
  if (out->contains("version")) {
    const nlohmann::json& v = out->at("version");
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxDumpVersion) {
      return JsonError("/version", fmt::format("must be a dump format version this ddpcheck reads, 1 to {} (a newer "
                                               "tools/ddpcheck_torch.py wrote it? use the ddpcheck beside it)",
                                               kMaxDumpVersion), v)
          .Prefixed(path);
    }
  }
  return Status::Ok();
}

int64_t DumpVersion(const nlohmann::json& ix) {
  return ix.contains("version") && ix.at("version").is_number_integer() ? ix.at("version").get<int64_t>() : 1;
}

// A tensor name that names another rank's archive entry ("../rank0/s3.npz/s3.param.0.weight.npy", format version 3:
// the recorder of rank r > 0 writes a tensor DDP keeps equal on every rank only where rank 0's archive entry of
// this recording does not hold the same bytes): checks it may, and that the rank names rank 0's entries of the
// same recording ("peer_run" = rank 0's "run"). `where` is the name's JSON pointer.
Status CheckPeerName(const TorchDumpRank& r, const nlohmann::json& rank0, const std::string& where,
                     const std::string& name) {
  if (!name.starts_with("../")) return Status::Ok();
  const auto bad = [&](const std::string& why) {
    return Status::Invalid(fmt::format("{}/index.json: {}: '{}' {}", r.dir, where, name, why));
  };
  const int64_t version = DumpVersion(r.index);
  if (version < 3) {
    return bad(fmt::format("names another rank's entry, which dump format version {} does not allow (version 3 "
                           "does: the index says {})", version, version));
  }
  const std::string prefix = "../rank0/";
  const std::string rest = name.starts_with(prefix) ? name.substr(prefix.size()) : std::string();
  const size_t slash = rest.find('/');
  const std::string archive = slash == std::string::npos ? std::string() : rest.substr(0, slash);
  const std::string entry = slash == std::string::npos ? std::string() : rest.substr(slash + 1);
  if (archive.size() <= 4 || !archive.ends_with(".npz") || entry.size() <= 4 || !entry.ends_with(".npy") ||
      entry.find('/') != std::string::npos || archive.starts_with(".")) {
    return bad("must name an entry of rank 0's archive as ../rank0/ARCHIVE.npz/ENTRY.npy");
  }
  if (r.rank == 0) return bad("is rank 0's own index naming a rank's folder: only ranks above 0 name rank 0's entries");
  const bool named = r.index.contains("peer_run") && r.index.at("peer_run").is_string();
  const bool known = rank0.contains("run") && rank0.at("run").is_string();
  if (!named || !known || r.index.at("peer_run") != rank0.at("run")) {
    return Status::Invalid(fmt::format(
        "{}/index.json: /peer_run: {} is not rank 0's recording {} ({}/rank0/index.json /run), yet this rank names "
        "rank 0's entries ({} at {}): the rank folders come from different recordings; record again into an empty "
        "folder", r.dir, named ? r.index.at("peer_run").dump() : "(missing)", known ? rank0.at("run").dump() : "(none)",
        fs::path(r.dir).parent_path().string(), name, where));
  }
  return Status::Ok();
}

// Every tensor name of a rank's index that names another rank's entry, and every bucket whose reduced gradient is
// the step's grads ("reduced_is_grads", format version 3), checked before any tensor is read.
Status CheckFormat3(const TorchDumpRank& r, const nlohmann::json& rank0) {
  const auto one = [&](const nlohmann::json& o, const char* key, const std::string& where) -> Status {
    if (!o.is_object() || !o.contains(key) || !o.at(key).is_string()) return Status::Ok();
    return CheckPeerName(r, rank0, JsonPath(where, key), o.at(key).get<std::string>());
  };
  const auto names = [&](const nlohmann::json& files, const std::string& where) -> Status {
    if (!files.is_object()) return Status::Ok();
    for (const auto& [k, v] : files.items()) {
      if (v.is_string()) DDPCHECK_RETURN_IF_ERROR(CheckPeerName(r, rank0, JsonPath(where, k), v.get<std::string>()));
    }
    return Status::Ok();
  };
  const nlohmann::json& ix = r.index;
  for (const char* group : {"init", "init_local"}) {
    if (ix.contains(group)) DDPCHECK_RETURN_IF_ERROR(names(ix.at(group), std::string("/") + group));
  }
  if (ix.contains("init_optimizer_state") && ix.at("init_optimizer_state").is_object()) {
    for (const auto& [state, files] : ix.at("init_optimizer_state").items()) {
      DDPCHECK_RETURN_IF_ERROR(names(files, JsonPath("/init_optimizer_state", state)));
    }
  }
  if (ix.contains("dataset")) {
    DDPCHECK_RETURN_IF_ERROR(one(ix.at("dataset"), "x", "/dataset"));
    DDPCHECK_RETURN_IF_ERROR(one(ix.at("dataset"), "y", "/dataset"));
  }
  const nlohmann::json& steps = ix.at("steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& st = steps[i];
    const std::string at = JsonPath("/steps", i);
    DDPCHECK_RETURN_IF_ERROR(one(st, "indices", at));
    for (const char* group : {"forward_buffers", "grads", "params", "buffers", "ref_grads"}) {
      if (st.contains(group)) DDPCHECK_RETURN_IF_ERROR(names(st.at(group), JsonPath(at, group)));
    }
    if (st.contains("optimizer_state") && st.at("optimizer_state").is_object()) {
      for (const auto& [state, files] : st.at("optimizer_state").items()) {
        DDPCHECK_RETURN_IF_ERROR(names(files, JsonPath(JsonPath(at, "optimizer_state"), state)));
      }
    }
    if (!st.contains("buckets") || !st.at("buckets").is_array()) continue;
    for (size_t b = 0; b < st.at("buckets").size(); ++b) {
      const nlohmann::json& bucket = st.at("buckets")[b];
      const std::string bat = JsonPath(JsonPath(at, "buckets"), b);
      DDPCHECK_RETURN_IF_ERROR(one(bucket, "local", bat));
      DDPCHECK_RETURN_IF_ERROR(one(bucket, "reduced", bat));
      if (!bucket.is_object() || !bucket.contains("reduced_is_grads")) continue;
      const std::string p = JsonPath(bat, "reduced_is_grads");
      if (DumpVersion(ix) < 3) {
        return Status::Invalid(fmt::format("{}/index.json: {}: dump format version {} has no reduced_is_grads "
                                           "(version 3 has)", r.dir, p, DumpVersion(ix)));
      }
      if (bucket.at("reduced_is_grads") != true) {
        return JsonError(p, "must be true (the bucket's reduced gradient is the step's grads of its parameters, in "
                            "its order) or absent", bucket.at("reduced_is_grads")).Prefixed(r.dir + "/index.json");
      }
      if (bucket.contains("reduced")) {
        return Status::Invalid(fmt::format("{}/index.json: {}: a bucket whose reduced gradient is the step's grads "
                                           "names no reduced tensor, but this one names {}", r.dir, p,
                                           bucket.at("reduced").dump()));
      }
    }
  }
  return Status::Ok();
}

// The integer at JSON pointer `path` of the index (its type already checked), within [lo, hi].
Status IndexInt(const nlohmann::json& v, const std::string& path, int64_t lo, int64_t hi, int64_t* out) {
  DDPCHECK_RETURN_IF_ERROR(ReadInt64(v, path, out));
  if (*out < lo || *out > hi) return JsonError(path, fmt::format("must be in [{}, {}]", lo, hi), v);
  return Status::Ok();
}

// Copies the rows of this rank's dataset file (x, y) that its batches saw into the merged data (s->data): every
// row index in [0, rows) of both, the widths equal.
Status MergeRowsSeen(const nlohmann::json& ds, const Tensor& x, const Tensor& y, DataSpec* data) {
  const auto rows = ds.value("rows_seen", std::vector<int64_t>{});
  if (rows.empty()) return Status::Ok();
  if (x.shape.empty() || y.shape.empty() || x.shape != data->x.shape || y.shape != data->y.shape) {
    return Status::Invalid(fmt::format("/dataset: x {} and y {} must have the shapes of the dataset merged so far, "
                                       "x {} and y {} (every rank records the same dataset)",
                                       ShapeString(x.shape), ShapeString(y.shape), ShapeString(data->x.shape),
                                       ShapeString(data->y.shape)));
  }
  const int64_t n = x.shape[0], xw = n ? x.numel() / n : 0, yw = n ? y.numel() / n : 0;
  if (y.shape[0] != n) {
    return Status::Invalid(fmt::format("/dataset: x has {} rows but y has {}", n, y.shape[0]));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= n) {
      return JsonError(JsonPath("/dataset/rows_seen", i), fmt::format("must be a row in [0, {}) of dataset x", n),
                       nlohmann::json(row));
    }
    std::copy_n(x.data.begin() + row * xw, xw, data->x.data.begin() + row * xw);
    std::copy_n(y.data.begin() + row * yw, yw, data->y.data.begin() + row * yw);
  }
  return Status::Ok();
}

// The first dataset row that two ranks recorded (rows_seen) with different values, and how many such rows: every
// rank trains on one dataset, so a row that differs between ranks is data that differs (targets from a model loaded
// on one rank only, preprocessing per rank). Only ranks whose recorder saw rows drawn again and none of them change
// take part: with augmentation or values sampled per draw, a row differs from draw to draw on one rank too. A rank
// whose dataset files cannot be read or have another shape is left out (the scenario's reading reports those).
std::optional<TorchDump::DatasetConflict> FindDatasetConflict(const TorchDump& d) {
  std::vector<std::pair<Tensor, Tensor>> data(d.ranks.size());
  std::vector<std::pair<int, size_t>> owner;  // per row: (rank, index into data) of the first rank that drew it
  std::optional<TorchDump::DatasetConflict> out;
  for (size_t k = 0; k < d.ranks.size(); ++k) {
    const auto& r = d.ranks[k];
    if (!r.index.contains("dataset") || !r.index.at("dataset").is_object()) continue;
    const auto& ds = r.index.at("dataset");
    if (ds.value("rows_redrawn", int64_t{0}) <= 0 || ds.value("rows_changed", int64_t{1}) != 0) continue;
    if (!ds.contains("x") || !ds.at("x").is_string() || !ds.contains("y") || !ds.at("y").is_string()) continue;
    const auto rows = ds.value("rows_seen", std::vector<int64_t>{});
    if (rows.empty()) continue;
    auto& [x, y] = data[k];
    DumpTensorFiles tensors(r.dir);
    if (!tensors.Read(ds.at("x").get<std::string>(), &x).ok() || !tensors.Read(ds.at("y").get<std::string>(), &y).ok() ||
        x.shape.empty() || y.shape.empty() || x.shape[0] != y.shape[0]) {
      continue;
    }
    const int64_t n = x.shape[0], xw = n ? x.numel() / n : 0, yw = n ? y.numel() / n : 0;
    if (owner.size() < static_cast<size_t>(n)) owner.resize(static_cast<size_t>(n), {-1, 0});
    for (int64_t row : rows) {
      if (row < 0 || row >= n) continue;
      auto& own = owner[static_cast<size_t>(row)];
      if (own.first < 0) {
        own = {r.rank, k};
        continue;
      }
      const auto& [ox, oy] = data[own.second];
      if (ox.shape != x.shape || oy.shape != y.shape) continue;
      for (const auto& [name, mine, theirs, width] : {std::tuple{"x", &x, &ox, xw}, std::tuple{"y", &y, &oy, yw}}) {
        const double* a = mine->data.data() + row * width;
        const double* b = theirs->data.data() + row * width;
        int64_t e = 0;
        while (e < width && std::memcmp(a + e, b + e, sizeof(double)) == 0) ++e;
        if (e == width) continue;
        if (!out) out = TorchDump::DatasetConflict{r.rank, own.first, row, e, 0, name, a[e], b[e]};
        ++out->rows;
        break;
      }
    }
  }
  return out;
}

// Loads the tensors of a {name: file} object into the trace at (step, checkpoint, prefix + name, rank).
// What the index's "params" says of each parameter: its shape and dtype (a tensor file of a parameter, its grad or
// its optimizer state that says otherwise was edited or comes from another run).
struct ParamFacts {
  std::vector<int64_t> shape;
  std::optional<DType> dtype;
};
using ParamTable = std::map<std::string, ParamFacts>;

ParamTable ParamsOf(const nlohmann::json& ix) {
  ParamTable out;
  if (!ix.contains("params") || !ix.at("params").is_array()) return out;
  for (const auto& p : ix.at("params")) {
    if (!p.is_object() || !p.contains("name") || !p.at("name").is_string() || !p.contains("shape") ||
        !p.at("shape").is_array()) {
      continue;
    }
    ParamFacts f;
    for (const auto& d : p.at("shape")) {
      if (!d.is_number_integer()) return {};
      f.shape.push_back(d.get<int64_t>());
    }
    DType dt;
    if (p.contains("dtype") && p.at("dtype").is_string() && ParseDType(p.at("dtype").get<std::string>(), &dt)) {
      f.dtype = dt;
    }
    out[p.at("name").get<std::string>()] = f;
  }
  return out;
}

// The optimizer's type as the index names it (torch's class name lower-cased; "" when not recorded).
std::string OptimizerTypeOf(const nlohmann::json& ix) {
  if (ix.contains("optimizer_type") && ix.at("optimizer_type").is_string()) return ix.at("optimizer_type").get<std::string>();
  if (ix.contains("optimizer") && ix.at("optimizer").is_object() && ix.at("optimizer").contains("type") &&
      ix.at("optimizer").at("type").is_string()) {
    return ix.at("optimizer").at("type").get<std::string>();
  }
  return "";
}

// Whether optimizer `type`'s state `state` holds one value per element of its parameter in the update ddpcheck
// reproduces (core/optimizer.h reads it element by element): a file of another shape there was edited or comes from
// another recording. Any other optimizer's state, or another state of these, may have any shape (NAdam's
// mu_product, ASGD's eta and mu: 0-d; LBFGS's H_diag and its flat direction d, kept for the first parameter only):
// it is compared between ranks, bitwise, and nothing reads it element by element.
bool PerElementState(const std::string& type, const std::string& state) {
  static const std::map<std::string, std::set<std::string>> kStates = {
      {"sgd", {"momentum_buffer"}},
      {"adam", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {"adamw", {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {"rmsprop", {"square_avg", "momentum_buffer", "grad_avg"}},
      {"adagrad", {"sum"}},
      {"adadelta", {"square_avg", "acc_delta"}}};
  const auto it = kStates.find(type);
  return it != kStates.end() && it->second.count(state) > 0;
}

// Loads a group of tensor files (name -> file). With `params`, a file holding a parameter's tensor (its value, grad
// or per-element optimizer state) must have the parameter's shape, and with same_dtype its dtype too: `where` is the
// group's JSON pointer in the index, for the error.
Status LoadGroup(const TorchDumpRank& r, DumpTensorFiles& tensors, const nlohmann::json& files, int64_t step,
                 Checkpoint c, const std::string& prefix, Trace* trace, const ParamTable* params = nullptr,
                 bool same_dtype = false, const std::string& where = "") {
  for (const auto& [name, file] : files.items()) {
    Tensor t;
    if (Status st = tensors.Read(file.get<std::string>(), &t); !st.ok()) {  // said with where the index names it
      return where.empty() ? st : Status(st.code(), st.message() + " (index.json " + JsonPath(where, name) + ")");
    }
    const auto p = params ? params->find(name) : ParamTable::const_iterator();
    if (params && p != params->end() && (t.shape != p->second.shape || (same_dtype && p->second.dtype &&
                                                                        t.dtype != *p->second.dtype))) {
      return Status::Invalid(fmt::format(
          "{}/{}: {}: holds a {} tensor of shape {}, but {}/index.json /params says parameter '{}' is {} of shape {} "
          "(a file edited or from another recording)",
          r.dir, file.get<std::string>(), JsonPath(where, name), DTypeName(t.dtype), ShapeString(t.shape), r.dir, name,
          p->second.dtype ? DTypeName(*p->second.dtype) : std::string("?"), ShapeString(p->second.shape)));
    }
    trace->Add({step, c, prefix + name, r.rank}, std::move(t));
  }
  return Status::Ok();
}

// This rank's local gradient of each parameter at step `step` (kLocalGrad), cut from the local buckets the
// recorder's communication hook kept: the step-local replay compares it with the replay's gradient of this rank's
// own batch (a rank whose loss or batch is wrong, or ranks' buckets swapped, while their mean still agrees). Only
// for a step whose every bucket was reduced once, and a bucket whose size is its parameters' as /params shapes
// them (the protocol check reports any other layout); a sparse parameter's bucket is left out. The index schema
// holds the rest: a bucket's index is an integer, its params index /params, whose entries have a name.
Status LoadLocalGrads(const TorchDumpRank& r, DumpTensorFiles& tensors, const nlohmann::json& ix,
                      const nlohmann::json& st, int64_t step, Trace* trace) {
  if (!st.contains("buckets") || !ix.contains("params")) return Status::Ok();
  const nlohmann::json& plist = ix.at("params");
  std::set<int64_t> seen;
  for (const auto& b : st.at("buckets")) {
    if (!seen.insert(b.at("index").get<int64_t>()).second) return Status::Ok();  // a bucket reduced twice
  }
  for (const auto& b : st.at("buckets")) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> cut;  // (name, shape) in the bucket's order
    int64_t total = 0;
    for (const auto& i : b.at("params")) {
      const nlohmann::json& p = plist.at(i.get<size_t>());
      if (p.value("sparse", false) || !p.contains("shape")) {
        cut.clear();
        break;
      }
      cut.emplace_back(p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>());
      total += NumelOf(cut.back().second);
    }
    if (cut.empty()) continue;
    Tensor local;
    DDPCHECK_RETURN_IF_ERROR(tensors.Read(b.at("local").get<std::string>(), &local));
    if (local.numel() != total) continue;
    int64_t at = 0;
    for (auto& [name, shape] : cut) {
      const int64_t n = NumelOf(shape);
      std::vector<double> v(local.data.begin() + at, local.data.begin() + at + n);
      at += n;
      trace->Add({step, Checkpoint::kLocalGrad, name, r.rank}, Tensor(local.dtype, std::move(shape), std::move(v)));
    }
  }
  return Status::Ok();
}

Status ToLayer(const nlohmann::json& j, size_t i, LayerSpec* l, std::string* unsupported) {
  l->type = j.at("type").get<std::string>();
  if (l->type == "linear") {
    l->in_features = j.at("in");
    l->out_features = j.at("out");
    l->bias = j.value("bias", true);
  } else if (l->type == "batchnorm1d") {
    l->num_features = j.at("features");
    l->eps = j.value("eps", 1e-5);
    l->momentum_none = j.contains("momentum") && j.at("momentum").is_null();
    if (!l->momentum_none) l->momentum = j.value("momentum", 0.1);
    l->affine = j.value("affine", true);
    l->track_running_stats = j.value("track_running_stats", true);
  } else if (l->type == "dropout") {
    l->p = j.value("p", 0.5);
    if (l->p > 0) *unsupported = fmt::format("model layer {} is Dropout(p={}): torch's random masks cannot be replayed", i, l->p);
  } else if (l->type == "syncbatchnorm1d") {
    return Status::Invalid(fmt::format(
        "/model/{}/type: SyncBatchNorm is not supported by torch-compare: torch 1.13 runs it only on CUDA (DDP "
        "raises \"SyncBatchNorm layers only work with GPU modules\" on CPU), so a CPU dump cannot replay it; check "
        "the model with `ddpcheck run` on a scenario with a syncbatchnorm1d layer instead", i));
  } else if (l->type != "relu" && l->type != "tanh") {
    return Status::Invalid(fmt::format("/model/{}/type: unknown layer type '{}'", i, l->type));
  }
  return Status::Ok();
}

// DataLoader(drop_last=True), which the recorder cannot see, where the batch does not divide the shard: the first
// epoch the recorded epochs show ended after floor(shard / batch) steps where ceil would be one more; or, with no
// epoch change recorded (set_epoch never called), the step at floor(shard / batch), where the short last batch
// would be, holds a whole batch.
bool DropsLastBatch(const TorchDump& d, int64_t shard, int64_t batch) {
  if (batch < 1 || shard % batch == 0) return false;
  const nlohmann::json& steps = d.ranks[0].index.at("steps");
  for (size_t i = 1; i < steps.size(); ++i) {
    const int64_t e0 = steps[0].value("epoch", int64_t{0}), e = steps[i].value("epoch", int64_t{0});
    if (e != e0) return static_cast<int64_t>(i) == shard / batch;
  }
  const Tensor* at = d.trace.Find({shard / batch, Checkpoint::kSampler, "indices", d.ranks[0].rank});
  return at != nullptr && static_cast<int64_t>(at->data.size()) == batch;
}

Status BuildScenario(const TorchDump& d, Scenario* s, std::string* unsupported) {
  const nlohmann::json& ix = d.ranks[0].index;
  s->name = "torch dump " + d.dir;
  s->source = d.dir;
  s->world = d.world;
  s->model.clear();
  for (size_t i = 0; i < ix.at("model").size(); ++i) {
    LayerSpec l;
    DDPCHECK_RETURN_IF_ERROR(ToLayer(ix.at("model")[i], i, &l, unsupported));
    s->model.push_back(l);
  }
  // null: a loss the recorder could not describe (QA round 16: read as a string, the json library's text)
  const bool loss_known = !ix.contains("loss") || ix.at("loss").is_string();
  s->loss = loss_known ? ix.value("loss", std::string("mse")) : std::string("mse");
  if (!loss_known && unsupported->empty()) *unsupported = "the recorded loss is none ddpcheck replays (/loss is null)";
  if (!ParseDType(ix.value("dtype", std::string("float32")), &s->precision)) {
    return Status::Invalid("/dtype: expected float32 or float64, got " + ix.value("dtype", std::string()));
  }
  const auto& ddp = ix.at("ddp");
  s->ddp.bucket_cap_mb = ddp.value("bucket_cap_mb", 25.0);
  s->ddp.broadcast_buffers = ddp.value("broadcast_buffers", true);
  s->ddp.find_unused_parameters = ddp.value("find_unused_parameters", false);
  s->ddp.gradient_as_bucket_view = ddp.value("gradient_as_bucket_view", false);
  if (!ix.at("optimizer").is_object()) {  // null: an optimizer the recorder could not describe
    if (unsupported->empty()) *unsupported = "the recorded optimizer is none ddpcheck replays (/optimizer is null)";
    return Status::Ok();
  }
  const auto& opt = ix.at("optimizer");
  s->optimizer.type = opt.at("type");
  s->optimizer.lr = opt.at("lr");
  s->optimizer.weight_decay = opt.value("weight_decay", 0.0);
  s->optimizer.maximize = opt.value("maximize", false);
  if (s->optimizer.type == "sgd") {
    s->optimizer.momentum = opt.value("momentum", 0.0);
    s->optimizer.dampening = opt.value("dampening", 0.0);
    s->optimizer.nesterov = opt.value("nesterov", false);
  } else {
    s->optimizer.beta1 = opt.at("betas")[0];
    s->optimizer.beta2 = opt.at("betas")[1];
    s->optimizer.eps = opt.at("eps");
  }
  for (const auto& j : ix.value("schedulers", nlohmann::json::array())) {
    SchedulerSpec sc;
    sc.type = j.at("type");
    sc.step_size = j.value("step_size", int64_t{1});
    sc.milestones = j.value("milestones", std::vector<int64_t>{});
    sc.gamma = j.value("gamma", 0.1);
    sc.t_max = j.value("t_max", int64_t{1});
    sc.eta_min = j.value("eta_min", 0.0);
    sc.start_factor = j.value("start_factor", 1.0 / 3.0);
    sc.end_factor = j.value("end_factor", 1.0);
    sc.total_iters = j.value("total_iters", int64_t{5});
    s->schedulers.push_back(sc);
  }
  for (const auto& st : ix.at("steps")) {
    if (st.contains("scaler")) *unsupported = "the run used a GradScaler (AMP needs CUDA in torch 1.13)";
  }
  // Initial state after DDP's broadcast (rank 0's), data (merged over ranks when rebuilt from batches).
  s->init.kind = "inline";
  s->init.values.clear();
  for (const auto& [key, t] : d.trace.records()) {
    if (key.step == 0 && key.checkpoint == Checkpoint::kInit && key.rank == 0) s->init.values[key.tensor] = t;
  }
  s->data.kind = "inline";
  for (const auto& r : d.ranks) {
    if (!r.index.contains("dataset")) continue;
    const auto& ds = r.index.at("dataset");
    Tensor x, y;
    DumpTensorFiles tensors(r.dir);
    DDPCHECK_RETURN_IF_ERROR(tensors.Read(ds.at("x").get<std::string>(), &x));
    DDPCHECK_RETURN_IF_ERROR(tensors.Read(ds.at("y").get<std::string>(), &y));
    // A row per sample in both (QA round 15: a 0-d x crashed here, its row count read from an empty shape)
    if (x.shape.empty() || y.shape.empty() || x.shape[0] != y.shape[0]) {
      return Status::Invalid(fmt::format("/dataset (rank {}'s): x of shape {} and y of shape {} must both hold a row "
                                         "per sample (the same first dimension, at least 1-d): a damaged dump? record "
                                         "it again", r.rank, ShapeString(x.shape), ShapeString(y.shape)));
    }
    if (s->data.x.data.empty() || ds.value("complete", false)) {
      s->data.x = x;
      s->data.y = y;
      if (ds.value("complete", false)) break;
    }
    Status st = MergeRowsSeen(ds, x, y, &s->data);
    if (!st.ok()) return st.Prefixed(r.dir + "/index.json");
  }
  if (s->data.x.data.empty()) {
    if (ix.value("steps", nlohmann::json::array()).empty()) {
      return Status::Invalid("no step was recorded: rec.step() was never called between the recorder's start and "
                             "rec.close() (did the loop run no step? a resumed run already past its last epoch?)");
    }
    return Status::Invalid("no dataset: call rec.set_dataset(X, Y) or pass xb, yb to rec.step()");
  }
  s->data.samples = s->data.x.shape[0];
  // Every batch's rows are rows of the recorded dataset, and some rank recorded each of them (QA round 16: a batch
  // index past the dataset, or a rank whose /dataset was deleted, replayed those rows as zeros and FAILed naming no
  // pattern). Past the dataset: the index is not this dataset's (exit 2). Never recorded: no replay.
  {
    const int64_t n = s->data.samples;
    std::vector<char> covered(static_cast<size_t>(n), 0);
    for (const auto& r : d.ranks) {
      if (!r.index.contains("dataset")) continue;
      const auto& ds = r.index.at("dataset");
      if (ds.value("complete", false)) {
        std::fill(covered.begin(), covered.end(), 1);
        break;
      }
      for (int64_t row : ds.value("rows_seen", std::vector<int64_t>{})) {
        if (row >= 0 && row < n) covered[static_cast<size_t>(row)] = 1;
      }
    }
    for (const auto& [key, t] : d.trace.records()) {
      if (key.checkpoint != Checkpoint::kSampler || key.tensor != "indices") continue;
      for (double v : t->data) {
        if (!(v >= 0 && v < static_cast<double>(n))) {
          return Status::Invalid(fmt::format(
              "{}/rank{}/index.json: /steps/{}/indices: row {} is not a row of the recorded dataset ({} rows): the "
              "indices rec.step() is given must index the dataset it records (rec.set_dataset's, or the rows of "
              "xb/yb); a file edited or from another recording?", d.dir, key.rank, key.step, v, n));
        }
        if (!covered[static_cast<size_t>(v)] && unsupported->empty()) {
          *unsupported = fmt::format("rank {}'s batch at step {} used dataset row {}, which no rank's recorded "
                                     "dataset holds (its /dataset is missing, or its rows_seen leave it out)",
                                     key.rank, key.step, static_cast<int64_t>(v));
        }
      }
    }
  }
  // Sampler, batches and epochs as the loop ran them.
  const auto& sm = ix.value("sampler", nlohmann::json::object());
  s->sampler.shuffle = sm.value("shuffle", false);
  s->sampler.seed = sm.value("seed", uint64_t{0});
  s->sampler.negative_seed = RecordedSeedIsNegative(sm);
  s->sampler.drop_last = sm.value("drop_last", false);
  const auto calls = sm.value("set_epoch_calls", std::vector<int64_t>{});
  s->sampler.set_epoch = !calls.empty();
  s->batch_size = 1;  // from the first rank that completed a step (a rank that failed early recorded none)
  for (const auto& r : d.ranks) {
    if (r.index.contains("batch_size") && r.index.at("batch_size").is_number_integer()) {
      Status st = IndexInt(r.index.at("batch_size"), "/batch_size", 1, kMaxSamples, &s->batch_size);
      if (!st.ok()) return st.Prefixed(r.dir + "/index.json");
      break;
    }
  }
  SamplerConfig cfg;
  cfg.n = s->data.samples;
  if (sm.contains("len") && sm.at("len").is_number_integer()) {
    DDPCHECK_RETURN_IF_ERROR(IndexInt(sm.at("len"), "/sampler/len", 0, kMaxSamples, &cfg.n));
  }
  cfg.world = d.world;
  cfg.drop_last = s->sampler.drop_last;
  const int64_t shard = NumSamples(cfg);
  s->sampler.drop_last_batch = DropsLastBatch(d, shard, s->batch_size);
  const int64_t per_epoch = std::max<int64_t>(1, BatchesPerEpoch(shard, s->batch_size, s->sampler.drop_last_batch));
  s->epochs = std::max<int64_t>(1, (d.steps + per_epoch - 1) / per_epoch);
  s->steps = d.steps;
  // A loop that starts mid-epoch (resumed from a checkpoint at batch j: the batches before it skipped): rank 0's
  // first recorded batch is batch j > 0 of its DistributedSampler shard, where the replay draws batch 0. Not a
  // mistake of the run: it is checked by protocol (a first batch that is no batch of the shard is left to the
  // checks: a sampler mistake).
  const nlohmann::json& steps0 = d.ranks[0].index.at("steps");
  const Tensor* first = d.trace.Find({0, Checkpoint::kSampler, "indices", 0});
  if (first != nullptr && !first->data.empty() && !steps0.empty() && steps0[0].contains("epoch") &&
      steps0[0].at("epoch").is_number_integer()) {
    SamplerConfig c = cfg;
    c.shuffle = s->sampler.shuffle;
    c.seed = s->sampler.seed;
    c.negative_seed = s->sampler.negative_seed;
    c.epoch = steps0[0].at("epoch").get<int64_t>();
    std::vector<int64_t> shard_rows;
    if (ShardIndices(c, 0, &shard_rows).ok()) {
      const auto batches = Batches(shard_rows, s->batch_size, s->sampler.drop_last_batch);
      const std::vector<int64_t> got(first->data.begin(), first->data.end());
      for (size_t j = 1; j < batches.size() && (batches.empty() || got != batches[0]); ++j) {
        if (got != batches[j]) continue;
        *unsupported += fmt::format("{}the loop started at batch {} of epoch {} (resumed mid-epoch, the batches "
                                    "before it skipped); the replay starts an epoch at its first batch",
                                    unsupported->empty() ? "" : "; ", j, c.epoch);
        return Status::Ok();
      }
    }
  }
  // MSELoss between outputs (N, out) and targets of another shape: torch broadcast them (targets (N,) against
  // outputs (N, 1) make an (N, N) loss; torch only warns "Using a target size ... different to the input size"),
  // which the replay's loss does not model. torch ran it, so the dump is not bad: the protocol check judges the
  // run (its float64 reference calls the user's loss, broadcasting as torch did).
  int64_t out_width = 0;
  for (const LayerSpec& l : s->model) {
    if (l.type == "linear") out_width = l.out_features;
  }
  const std::vector<int64_t> want = {s->data.samples, out_width};
  if (s->loss == "mse" && out_width > 0 && s->data.y.shape != want) {
    const std::string rows = ShapeString(s->data.y.shape);  // "(96)": the batch's shape is "(B)"
    *unsupported += fmt::format("{}MSELoss got targets of shape (B{} per batch for outputs of shape (B, {}): torch "
                                "broadcast them, which the replay's loss does not model",
                                unsupported->empty() ? "" : "; ", rows.substr(rows.find_first_of(",)")), out_width);
    return Status::Ok();
  }
  return ValidateScenario(*s);
}

// Uneven inputs under torch.distributed.algorithms.Join: a rank that runs out of batches joins (DDP shadows its
// all-reduces with zeros) while the others step on, so the ranks' k-th recorded steps are different steps once a
// rank has joined. The recorder numbers each `with Join(...)` round (join_round); within a round the ranks step
// in lockstep until the first joins. Each rank keeps, per round (and per stretch between rounds), the steps every
// rank ran (the fewest any rank recorded there); the others (the reduction over fewer ranks) are dropped, the
// steps renumbered, and the first step after a dropped one marked after_gap (its previous state is not the step
// before it). Returns how many steps were dropped over all ranks.
int64_t AlignJoinRounds(std::vector<nlohmann::json>* indexes) {
  // segment of a step: 2 * round + 1 inside round `round`, 2 * (last round seen) + 2 between rounds
  const auto segments = [](const nlohmann::json& steps) {
    std::vector<int64_t> seg;
    int64_t last = -1;
    for (const auto& st : steps) {
      const bool in = st.contains("join_round") && st.at("join_round").is_number_integer();
      if (in) last = st.at("join_round").get<int64_t>();
      seg.push_back(in ? 2 * last + 1 : 2 * last + 2);
    }
    return seg;
  };
  std::vector<std::vector<int64_t>> segs;
  std::vector<std::map<int64_t, int64_t>> counts;  // per rank: segment -> its steps there
  std::set<int64_t> all;
  for (const auto& ix : *indexes) {
    segs.push_back(segments(ix.at("steps")));
    counts.emplace_back();
    for (int64_t g : segs.back()) {
      ++counts.back()[g];
      all.insert(g);
    }
  }
  std::map<int64_t, int64_t> fewest;  // segment -> the fewest steps any rank recorded in it
  for (int64_t g : all) {
    int64_t n = std::numeric_limits<int64_t>::max();
    for (const auto& c : counts) n = std::min(n, c.count(g) ? c.at(g) : int64_t{0});
    fewest[g] = n;
  }
  // A segment some rank ran more steps of than another: Join's end synced the model from the last rank to join,
  // so every rank's first step after it starts from other parameters than its own last recorded step's.
  std::set<int64_t> uneven;
  for (int64_t g : all) {
    for (const auto& c : counts) {
      if ((c.count(g) ? c.at(g) : 0) != fewest[g]) uneven.insert(g);
    }
  }
  int64_t dropped = 0;
  for (size_t r = 0; r < indexes->size(); ++r) {
    nlohmann::json& steps = (*indexes)[r].at("steps");
    nlohmann::json kept = nlohmann::json::array();
    std::map<int64_t, int64_t> taken;
    bool gap = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t g = segs[r][i];
      if (taken[g]++ >= fewest[g]) {
        ++dropped;
        continue;
      }
      gap = gap || (i > 0 && segs[r][i - 1] != g && uneven.count(segs[r][i - 1]));
      nlohmann::json st = steps[i];
      st["step"] = static_cast<int64_t>(kept.size());
      if (gap) st["after_gap"] = true;
      gap = false;
      kept.push_back(std::move(st));
    }
    steps = std::move(kept);
  }
  return dropped;
}

Status ReadRank(const std::string& dir, int rank, TorchDumpRank* r, const nlohmann::json& rank0, Trace* trace,
                nlohmann::json index) {
  r->rank = rank;
  r->dir = dir + "/rank" + std::to_string(rank);
  const std::string index_path = r->dir + "/index.json";
  r->index = std::move(index);
  DDPCHECK_RETURN_IF_ERROR(CheckFormat3(*r, rank == 0 ? r->index : rank0));
  try {
    const auto& ix = r->index;
    if (ix.at("rank") != rank) {
      return Status::Invalid(fmt::format("{}: /rank: says rank {}, expected {}", index_path, ix.at("rank").dump(), rank));
    }
    if (ix.contains("error")) {
      r->failed = true;
      r->error = fmt::format("{} at step {}: {}", ix["error"].value("type", std::string("error")),
                             ix["error"].value("step", int64_t{0}), ix["error"].value("message", std::string()));
      TraceEvent event;
      event.step = ix["error"].value("step", int64_t{0});
      event.rank = rank;
      event.kind = "ddp_error";
      event.message = r->error;
      trace->AddEvent(event);
    }
    DumpTensorFiles tensors(r->dir);
    const ParamTable params = ParamsOf(ix);
    const std::string optimizer_type = OptimizerTypeOf(ix);
    DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, ix.at("init"), 0, Checkpoint::kInit, "", trace, &params, true, "/init"));
    const auto& steps = ix.at("steps");
    r->steps = static_cast<int64_t>(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& st = steps[i];
      int64_t s = 0;
      Status step_ok = IndexInt(st.at("step"), JsonPath(JsonPath("/steps", i), "step"), 0, kMaxSteps, &s);
      if (!step_ok.ok()) return step_ok.Prefixed(index_path);
      if (s != static_cast<int64_t>(i)) {  // the recorder writes its steps in order, numbered from 0
        return JsonError(JsonPath(JsonPath("/steps", i), "step"),
                         fmt::format("must be {} (the steps are recorded in order from 0)", i), st.at("step"))
            .Prefixed(index_path);
      }
      Tensor idx;
      DDPCHECK_RETURN_IF_ERROR(tensors.Read(st.at("indices").get<std::string>(), &idx));
      if (IsFloating(idx.dtype) || idx.shape.size() != 1) {  // (the recorder writes int64 rows: QA round 15's '<f2')
        return Status::Invalid(fmt::format("{}/{}: {}: holds a {} tensor of shape {}, but batch indices are a 1-d "
                                           "integer tensor (a file edited or from another recording)",
                                           r->dir, st.at("indices").get<std::string>(),
                                           JsonPath(JsonPath("/steps", i), "indices"), DTypeName(idx.dtype),
                                           ShapeString(idx.shape)));
      }
      idx.dtype = DType::kInt64;
      trace->Add({s, Checkpoint::kSampler, "indices", rank}, std::move(idx));
      DType dt = DType::kFloat32;
      ParseDType(ix.value("dtype", std::string("float32")), &dt);
      if (st.contains("loss") && st.at("loss").is_number()) {
        // A step of several forwards (micro-batches each all-reduced, an evaluation forward) passes rec.step() one
        // forward's loss, divided or summed as the loop chose: charted, not compared with the step's loss.
        const auto forwards = [&](const char* k) { return st.contains(k) && st.at(k).is_number_integer() ? st.at(k).get<int64_t>() : 1; };
        const bool one_forward = std::max(forwards("ddp_forwards"), forwards("module_forwards")) <= 1;
        trace->Add({s, Checkpoint::kLoss, one_forward ? "loss" : "loss_of_one_forward", rank},
                   Tensor::Scalar(st.at("loss").get<double>(), dt));
      }
      trace->Add({s, Checkpoint::kLr, "lr", rank}, Tensor::Scalar(st.at("lr").get<double>()));
      const std::string at = JsonPath("/steps", i);
      if (st.contains("forward_buffers")) {
        DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, st.at("forward_buffers"), s, Checkpoint::kForwardBuffers, "",
                                           trace, nullptr, false, JsonPath(at, "forward_buffers")));
      }
      DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, st.at("grads"), s, Checkpoint::kReduced, "", trace, &params,
                                         true, JsonPath(at, "grads")));
      DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, st.at("params"), s, Checkpoint::kParams, "", trace, &params,
                                         true, JsonPath(at, "params")));
      DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, st.at("buffers"), s, Checkpoint::kBuffers, "", trace, nullptr,
                                         false, JsonPath(at, "buffers")));
      // A normalisation statistic keeps its shape through the run (QA round 15: a 0-d or empty running_mean in a
      // step's forward buffers compared as nothing and passed); other buffers may be reassigned (a cache).
      for (const auto& [key, c] : {std::pair{"forward_buffers", Checkpoint::kForwardBuffers},
                                   std::pair{"buffers", Checkpoint::kBuffers}}) {
        if (!st.contains(key)) continue;
        for (const auto& [name, file] : st.at(key).items()) {
          const Tensor* t = trace->Find({s, c, name, rank});
          const Tensor* init = trace->Find({0, Checkpoint::kInit, name, rank});
          if (!t || !init || !IsNormStatistic(name) || t->shape == init->shape) continue;
          return Status::Invalid(fmt::format("{}/{}: {}: holds a tensor of shape {}, but the buffer '{}' was {} when "
                                             "the recorder started (a file edited or from another recording)",
                                             r->dir, file.get<std::string>(), JsonPath(JsonPath(at, key), name),
                                             ShapeString(t->shape), name, ShapeString(init->shape)));
        }
      }
      DDPCHECK_RETURN_IF_ERROR(LoadLocalGrads(*r, tensors, ix, st, s, trace));
      const nlohmann::json optimizer_state = st.value("optimizer_state", nlohmann::json::object());  // a copy: keep it alive
      for (const auto& [state, files] : optimizer_state.items()) {
        DDPCHECK_RETURN_IF_ERROR(LoadGroup(*r, tensors, files, s, Checkpoint::kParams, "opt." + state + ".", trace,
                                           PerElementState(optimizer_type, state) ? &params : nullptr, false,
                                           JsonPath(JsonPath(at, "optimizer_state"), state)));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(index_path + ": malformed index: " + e.what());
  }
  return Status::Ok();
}

// With broadcast_buffers DDP broadcasts rank 0's buffers at the start of every training forward: a buffer that
// differs between ranks when the recorder starts (statistics set or loaded on rank 0 only after DDP(...)) is rank
// 0's on every rank by the first forward, so the run is the one whose ranks all started from rank 0's. Where step
// 0's forward buffers show it (every rank's bitwise rank 0's), rank r's init value of such a buffer is taken as
// rank 0's (what its first forward started from); the names are returned for the report. A buffer that still
// differs at step 0's forward (broadcast_buffers off, or no forward buffers recorded) stays a finding.
std::vector<std::string> TakeRebroadcastInitBuffers(TorchDump* d) {
  std::vector<std::string> taken;
  for (const auto& r : d->ranks) {
    const nlohmann::json& ddp = r.index.at("ddp");
    if (!ddp.is_object() || !ddp.value("broadcast_buffers", false)) return taken;
  }
  for (const auto& b : d->ranks[0].index.value("buffers", nlohmann::json::array())) {
    if (!b.is_object() || !b.contains("name") || !b.at("name").is_string()) continue;
    const std::string name = b.at("name").get<std::string>();
    const Tensor* init0 = d->trace.Find({0, Checkpoint::kInit, name, 0});
    const Tensor* fwd0 = d->trace.Find({0, Checkpoint::kForwardBuffers, name, 0});
    if (!init0 || !fwd0) continue;
    bool differs = false, agree = true;
    for (const auto& r : d->ranks) {
      const Tensor* init = d->trace.Find({0, Checkpoint::kInit, name, r.rank});
      const Tensor* fwd = d->trace.Find({0, Checkpoint::kForwardBuffers, name, r.rank});
      differs = differs || (init && !BitwiseEqual(*init, *init0));
      agree = agree && fwd && BitwiseEqual(*fwd, *fwd0);
    }
    if (!differs || !agree) continue;
    const Tensor rank0 = *init0;  // (Add may replace what init0 points to)
    for (const auto& r : d->ranks) {
      if (r.rank != 0) d->trace.Add({0, Checkpoint::kInit, name, r.rank}, rank0);
    }
    taken.push_back(name);
  }
  return taken;
}

// A NaN or inf in what torch recorded is a finding (exit 1, "non-finite value in ..."), replayed or not, except the
// gradients of a GradScaler step (AMP skips those) and the module's buffers (a causal attention mask registered as
// a buffer holds -inf by design).
Status Finite(const TorchDump& d, const std::string& dir) {
  std::set<std::string> buffers;
  const nlohmann::json& ix = d.ranks[0].index;
  for (const auto& b : ix.value("buffers", nlohmann::json::array())) {
    if (b.is_object() && b.contains("name") && b.at("name").is_string()) buffers.insert(b.at("name").get<std::string>());
  }
  std::set<int64_t> overflow_steps;
  for (const auto& r : d.ranks) {
    const auto& steps = r.index.at("steps");
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].contains("scaler")) overflow_steps.insert(steps[i].at("step").get<int64_t>());
    }
  }
  return CheckFinite(d.trace, dir, overflow_steps, buffers);
}

// The error another rank's index recorded, as "; rank q raised at step s: Type: message" ("" when none): usually
// why rank `missing` left no index (mp.spawn terminates the other ranks when one raises, before their recorders
// close), said in the same line.
std::string RecordedCause(const std::string& dir, int world, int missing) {
  std::error_code ec;
  for (int q = 0; q < world && fs::is_directory(dir + "/rank" + std::to_string(q), ec); ++q) {
    nlohmann::json ix;
    if (q == missing || !fs::is_regular_file(dir + "/rank" + std::to_string(q) + "/index.json", ec) ||
        !ReadIndex(dir + "/rank" + std::to_string(q) + "/index.json", &ix).ok()) {
      continue;
    }
    if (!ix.contains("error") || !ix.at("error").is_object()) continue;
    const nlohmann::json& e = ix.at("error");
    const auto str = [&](const char* k) { return e.contains(k) && e.at(k).is_string() ? e.at(k).get<std::string>() : ""; };
    return fmt::format("; rank {} raised at step {}: {}: {}", q,
                       e.contains("step") && e.at("step").is_number_integer() ? e.at("step").get<int64_t>() : 0,
                       str("type"), str("message").substr(0, 300));
  }
  return "";
}

// What describes the recording itself and cannot differ between the ranks of one run (a rank folder copied in
// from another recording, or an edited index): rank r's world_size, dump format version and peer_run (rank 0's
// run id, where both are recorded) against rank 0's. Training settings that differ (batch size, lr, the
// optimizer's) are left to the checks: a user can set them on one rank.
Status SameRecording(const std::string& dir, int r, const nlohmann::json& ix, const nlohmann::json& rank0) {
  const std::string here = fmt::format("{}/rank{}/index.json", dir, r), there = dir + "/rank0/index.json";
  const auto differ = [&](const std::string& pointer, const std::string& mine, const std::string& theirs,
                          const std::string& why) {
    return Status::Invalid(fmt::format("{}: {}: {} on rank {}, but {} {} says {}: {}", here, pointer, mine, r, there,
                                       pointer, theirs, why));
  };
  const std::string fix = "the rank folders come from different recordings (or an index was edited); record again "
                          "into an empty folder";
  if (ix.at("world_size") != rank0.at("world_size")) {
    return differ("/world_size", ix.at("world_size").dump(), rank0.at("world_size").dump(), fix);
  }
  if (DumpVersion(ix) != DumpVersion(rank0)) {
    return differ("/version", std::to_string(DumpVersion(ix)), std::to_string(DumpVersion(rank0)), fix);
  }
  // DDP refuses at construction a module whose parameter shapes differ between ranks, so a layer of the same type
  // at the same place has the same widths on every rank (a ReLU where another rank has Tanh is the checks' finding).
  const nlohmann::json& model = ix.at("model");
  const nlohmann::json& model0 = rank0.at("model");
  for (size_t i = 0; model.is_array() && model0.is_array() && i < std::min(model.size(), model0.size()); ++i) {
    if (model[i].at("type") != model0[i].at("type")) continue;
    for (const char* key : {"in", "out", "features"}) {
      if (model[i].contains(key) && model0[i].contains(key) && model[i].at(key) != model0[i].at(key)) {
        return differ(JsonPath(JsonPath("/model", i), key), model[i].at(key).dump(), model0[i].at(key).dump(),
                      "DDP refuses parameters whose shapes differ between ranks, so " + fix);
      }
    }
  }
  if (ix.contains("peer_run") && rank0.contains("run") && ix.at("peer_run") != rank0.at("run")) {
    return Status::Invalid(fmt::format("{}: /peer_run: {} on rank {}, but rank 0's recording is {} ({} /run): {}",
                                       here, DescribeJson(ix.at("peer_run")), r, DescribeJson(rank0.at("run")), there,
                                       fix));
  }
  return Status::Ok();
}

// A rank folder past the world (rank<k>/ with an index, k >= world_size) that claims this recording (its
// "peer_run" or "run" is rank 0's "run"): a damaged dump, said. One of another recording (a re-recording into the
// same folder with fewer ranks: a recorder clears its own rank's folder only) is left alone, as it always was.
Status NoRankPastWorld(const std::string& dir, int world, const nlohmann::json& rank0) {
  if (!rank0.contains("run") || !rank0.at("run").is_string()) return Status::Ok();
  const nlohmann::json& run = rank0.at("run");
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("rank") || name.size() < 5 || name.size() > 12 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos) {
      continue;
    }
    const int64_t k = std::stoll(name.substr(4));
    std::error_code ec2;
    if (k < world || !fs::is_regular_file(it->path() / "index.json", ec2)) continue;
    nlohmann::json ix;
    if (!ReadIndex((it->path() / "index.json").string(), &ix).ok()) continue;  // not this recording's either
    if (ix.value("peer_run", nlohmann::json()) == run || ix.value("run", nlohmann::json()) == run) {
      return Status::Invalid(fmt::format(
          "{}/index.json: a rank folder past the world that names this recording's run: {}/rank0/index.json "
          "/world_size is {}, so ranks 0 to {} recorded (a damaged or edited dump: record again into an empty folder)",
          it->path().string(), dir, world, world - 1));
    }
  }
  return Status::Ok();
}

}  // namespace

Status ReadTorchDump(const std::string& dir, TorchDump* out) {
  *out = TorchDump();
  out->dir = dir;
  DDPCHECK_RETURN_IF_ERROR(ExpectDirectory(dir, " (expected a folder written by DdpRecorder)"));
  TorchDumpRank r0;
  if (ExpectFile(dir + "/rank0/index.json").code() == Code::kNotFound) {
    // A recording that never closed (the run raised outside `with DdpRecorder(...)`, was killed, or never called
    // rec.close()) leaves its step archives but no index, which close() writes.
    int64_t archives = 0;
    std::error_code ec;
    fs::directory_iterator it(dir + "/rank0", ec), end;
    for (; !ec && it != end; it.increment(ec)) {  // (operator++ throws)
      const std::string name = it->path().filename().string();
      archives += name.ends_with(".npz") || name == "run.json" ? 1 : 0;  // init.npz, s<k>.npz: the recorder's
    }
    if (!ec && archives > 0) {
      return Status::NotFound(fmt::format(
          "{}/rank0/index.json: not found, but {} file(s) of a recording are: the recording never closed (the run raised "
          "outside `with DdpRecorder(...)`, was killed, or did not call rec.close()); record with `with "
          "DdpRecorder(...) as rec:` so an exception closes it, or rerun to the end{}",
          dir, archives, RecordedCause(dir, kMaxWorld, 0)));
    }
  }
  DDPCHECK_RETURN_IF_ERROR(ReadIndex(dir + "/rank0/index.json", &r0.index));
  int64_t world = 0;
  DDPCHECK_RETURN_IF_ERROR(IndexInt(r0.index.value("world_size", nlohmann::json()), "/world_size", 1, kMaxWorld, &world)
                               .Prefixed(dir + "/rank0/index.json"));
  out->world = static_cast<int>(world);
  for (int r = 0; r < out->world; ++r) {  // every rank's index first: a missing rank is the headline
    const Status at = ExpectFile(dir + "/rank" + std::to_string(r) + "/index.json");
    if (!at.ok() && at.code() != Code::kNotFound) return at;  // a symlink loop, a folder, a FIFO: said as such
    if (!at.ok()) {
      const std::string cause = RecordedCause(dir, out->world, r);
      return Status::NotFound(fmt::format("{}/rank{}/index.json: not found: world_size is {} but rank {} left no "
                                          "index (its process died before the recorder closed?){}",
                                          dir, r, out->world, r, cause));
    }
  }
  DDPCHECK_RETURN_IF_ERROR(NoRankPastWorld(dir, out->world, r0.index));
  std::vector<nlohmann::json> indexes(static_cast<size_t>(out->world));
  bool join = false;
  for (int r = 0; r < out->world; ++r) {
    const std::string path = dir + "/rank" + std::to_string(r) + "/index.json";
    nlohmann::json& ix = indexes[static_cast<size_t>(r)];
    if (r == 0) {
      ix = r0.index;
    } else {
      DDPCHECK_RETURN_IF_ERROR(ReadIndex(path, &ix));
    }
    DDPCHECK_RETURN_IF_ERROR(CheckTorchDumpIndexTypes(ix).Prefixed(path));
    if (r > 0) DDPCHECK_RETURN_IF_ERROR(SameRecording(dir, r, ix, indexes[0]));
    join = join || (ix.contains("join") && ix.at("join") == true);
  }
  if (join && out->world > 1) {
    try {
      out->join_steps_dropped = AlignJoinRounds(&indexes);
    } catch (const nlohmann::json::exception& e) {
      return Status::Invalid(dir + ": join rounds: malformed index: " + e.what());
    }
    out->uneven_join = out->join_steps_dropped > 0;
  }
  for (int r = 0; r < out->world; ++r) {
    TorchDumpRank rank;
    DDPCHECK_RETURN_IF_ERROR(
        ReadRank(dir, r, &rank, r0.index, &out->trace, std::move(indexes[static_cast<size_t>(r)])));
    out->steps = std::max(out->steps, rank.steps);
    out->ranks.push_back(std::move(rank));
  }
  for (const auto& r : out->ranks) {
    if (!r.failed && r.steps != out->steps) {
      const auto& longest = *std::max_element(out->ranks.begin(), out->ranks.end(),
                                              [](const auto& a, const auto& b) { return a.steps < b.steps; });
      return Status::Invalid(fmt::format("{}/index.json: mismatched steps: rank {} recorded {} steps, rank {} "
                                         "recorded {}, and neither recorded an error",
                                         r.dir, r.rank, r.steps, longest.rank, longest.steps));
    }
  }
  out->init_buffers_rebroadcast = TakeRebroadcastInitBuffers(out);
  // The buffers the dump records (their initial values differing between ranks while the parameters agree is
  // buffer-outside-ddp, not no-initial-broadcast: core::DiagnoseInitialState).
  nlohmann::json buffer_names = nlohmann::json::array();
  for (const auto& b : out->ranks[0].index.value("buffers", nlohmann::json::array())) {
    if (b.is_object() && b.contains("name") && b.at("name").is_string()) buffer_names.push_back(b.at("name"));
  }
  out->trace.meta["buffers"] = buffer_names;
  // A dump the recorder marked protocol-only (a model, loss, optimizer or scheduler it cannot describe, no
  // sampler): no scenario; core/dump_protocol.h checks it.
  // A forward under torch.autocast without a GradScaler (CPU autocast: bfloat16) is replayed with autocast's
  // roundings (scenario amp, grad_scaler false) when every step ran under it and the parameters are float32;
  // a run that mixes autocast and plain steps, or autocasts float64 parameters, is judged by the protocol
  // check alone (its single-process gradient check knows autocast).
  bool autocast = false, every_step_autocast = true, scaler = false;
  for (const auto& r : out->ranks) {
    for (const auto& st : r.index.at("steps")) {
      const bool a = st.contains("autocast") && st.at("autocast").is_boolean() && st.at("autocast").get<bool>();
      autocast = autocast || a;
      every_step_autocast = every_step_autocast && a;
      scaler = scaler || st.contains("scaler");
    }
  }
  const bool autocast_only = autocast && !scaler;
  if (out->uneven_join) {
    out->replay_unsupported = fmt::format(
        "the ranks ran different numbers of steps under Join (uneven inputs): the {} step(s) some ranks ran after "
        "another had joined (a reduction over fewer ranks) are not checked; the replay runs every rank for the same "
        "steps", out->join_steps_dropped);
  }
  const bool replay_autocast = autocast_only && every_step_autocast &&
                               out->ranks[0].index.value("dtype", std::string("float32")) == "float32";
  // Every rank's recorder says whether its run can be replayed (rank 1's batch indices may be what rules it out)
  bool any_not_possible = false;
  std::vector<std::string> reasons;
  for (const auto& rank : out->ranks) {
    const auto& rp = rank.index.value("replay", nlohmann::json::object());
    if (!rp.is_object() || rp.value("possible", true)) continue;
    any_not_possible = true;
    for (const auto& reason : rp.value("reasons", std::vector<std::string>{})) {
      const std::string said = rank.rank == 0 ? reason : fmt::format("rank {}: {}", rank.rank, reason);
      if (std::find(reasons.begin(), reasons.end(), reason) == reasons.end() &&
          std::find(reasons.begin(), reasons.end(), said) == reasons.end()) {
        reasons.push_back(said);
      }
    }
  }
  out->dataset_conflict = FindDatasetConflict(*out);
  if ((autocast_only && !replay_autocast) || any_not_possible || out->uneven_join) {
    for (const auto& reason : reasons) {
      out->replay_unsupported += (out->replay_unsupported.empty() ? "" : "; ") + reason;
    }
    if (autocast_only && !replay_autocast) {
      out->replay_unsupported += std::string(out->replay_unsupported.empty() ? "" : "; ") +
                                 (every_step_autocast ? "the forward of float64 parameters ran under torch.autocast"
                                                      : "some steps' forwards ran under torch.autocast, others not");
    }
    if (out->replay_unsupported.empty()) out->replay_unsupported = "the recorder marked the run protocol-only";
    out->scenario.name = "torch dump " + dir;
    out->scenario.world = out->world;
    ParseDType(out->ranks[0].index.value("dtype", std::string("float32")), &out->scenario.precision);
    // What the dump evidence rules (core/dump_check.h) read: the sampler as recorded and the batch size.
    const auto& ix = out->ranks[0].index;
    const auto sm = ix.value("sampler", nlohmann::json::object());
    out->scenario.sampler.shuffle = sm.value("shuffle", false);
    out->scenario.sampler.seed = sm.value("seed", uint64_t{0});
    out->scenario.sampler.negative_seed = RecordedSeedIsNegative(sm);
    out->scenario.sampler.drop_last = sm.value("drop_last", false);
    if (ix.contains("batch_size") && ix.at("batch_size").is_number_integer()) {
      DDPCHECK_RETURN_IF_ERROR(IndexInt(ix.at("batch_size"), "/batch_size", 1, kMaxSamples, &out->scenario.batch_size)
                                   .Prefixed(dir + "/rank0/index.json"));
    }
    if (sm.contains("len") && sm.at("len").is_number_integer()) {
      int64_t len = 0;  // read by the sampler evidence rules
      DDPCHECK_RETURN_IF_ERROR(
          IndexInt(sm.at("len"), "/sampler/len", 0, kMaxSamples, &len).Prefixed(dir + "/rank0/index.json"));
      SamplerConfig c;
      c.n = len;
      c.world = out->world;
      c.drop_last = out->scenario.sampler.drop_last;
      out->scenario.sampler.drop_last_batch = DropsLastBatch(*out, NumSamples(c), out->scenario.batch_size);
    }
    out->scenario.ddp.broadcast_buffers = ix.value("ddp", nlohmann::json::object()).value("broadcast_buffers", true);
    return Finite(*out, dir);
  }
  try {
    Status st = BuildScenario(*out, &out->scenario, &out->replay_unsupported);
    // (an error that names its own rank's file already starts with the dump's folder)
    if (!st.ok()) return st.message().rfind(dir, 0) == 0 ? st : st.Prefixed(dir + "/rank0/index.json");
    if (replay_autocast) {
      // torch 1.13's CPU autocast runs in bfloat16 only; a recorder that says otherwise names the dtype.
      const auto& ix0 = out->ranks[0].index;
      const bool named = ix0.contains("autocast_dtype") && ix0.at("autocast_dtype").is_string();
      const std::string low = named ? ix0.at("autocast_dtype").get<std::string>()
                                    : (ix0.contains("autocast_dtype") ? "(not a string)" : "bfloat16");
      if (low != "bfloat16" && low != "float16") {
        return Status::Invalid(dir + "/rank0/index.json: /autocast_dtype: expected bfloat16 or float16, got '" + low + "'");
      }
      out->scenario.amp.enabled = true;
      out->scenario.amp.grad_scaler = false;
      out->scenario.amp.dtype = low == "bfloat16" ? "bf16" : "fp16";
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(dir + "/rank0/index.json: malformed index: " + e.what());
  }
  return Finite(*out, dir);
}

}  // namespace ddpcheck::core
