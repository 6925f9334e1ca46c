#include "core/dump_index.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

#include "core/json_reader.h"
#include "core/scenario.h"

namespace ddpcheck::core {

namespace {

using nlohmann::json;

enum class Is { kString, kInt, kNumber, kBool, kObject, kArray, kStringMap, kIntArray, kStringArray, kWholeNumber, kNumberArray, kNumberMap, kScalarMap, kNumberOrNull, kIntOrNull, kArrayOrNull, kStringOrNull, kObjectOrNull };

bool Matches(const json& v, Is is) {
  switch (is) {
    case Is::kString: return v.is_string();
    case Is::kInt: return v.is_number_integer();
    case Is::kNumber: return v.is_number();
    case Is::kBool: return v.is_boolean();
    case Is::kObject: return v.is_object();
    case Is::kArray: return v.is_array();
    case Is::kArrayOrNull: return v.is_array() || v.is_null();
    case Is::kObjectOrNull: return v.is_object() || v.is_null();
    case Is::kStringOrNull: return v.is_string() || v.is_null();
    case Is::kNumberOrNull: return v.is_number() || v.is_null();
    case Is::kIntOrNull: return v.is_number_integer() || v.is_null();
    case Is::kStringMap:
      if (!v.is_object()) return false;
      for (const auto& item : v.items()) {
        if (!item.value().is_string()) return false;
      }
      return true;
    case Is::kIntArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_number_integer()) return false;
      }
      return true;
    case Is::kStringArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_string()) return false;
      }
      return true;
    case Is::kWholeNumber:  // 1 or 1.0 (torch takes StepLR(opt, 1.0), as the Transformer tutorial writes it)
      return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                       v.get<double>() == std::floor(v.get<double>()) &&
                                       std::abs(v.get<double>()) < 0x1p62);
    case Is::kNumberArray:
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!e.is_number()) return false;
      }
      return true;
    case Is::kNumberMap:
      if (!v.is_object()) return false;
      for (const auto& item : v.items()) {
        if (!item.value().is_number()) return false;
      }
      return true;
    case Is::kScalarMap:
      if (!v.is_object()) return false;
      for (const auto& item : v.items()) {
        if (!item.value().is_number() && !item.value().is_boolean() && !item.value().is_string()) return false;
      }
      return true;
  }
  return false;
}

const char* Describe(Is is) {
  switch (is) {
    case Is::kString: return "must be a string";
    case Is::kInt: return "must be an integer";
    case Is::kNumber: return "must be a number";
    case Is::kBool: return "must be true or false";
    case Is::kObject: return "must be an object";
    case Is::kArray: return "must be an array";
    case Is::kArrayOrNull: return "must be an array or null";
    case Is::kObjectOrNull: return "must be an object or null";
    case Is::kStringOrNull: return "must be a string or null";
    case Is::kNumberOrNull: return "must be a number or null";
    case Is::kIntOrNull: return "must be an integer or null";
    case Is::kStringMap: return "must be an object of name -> tensor file (strings: \"s3.npz/s3.x.npy\" or \"s3.x.npy\")";
    case Is::kIntArray: return "must be an array of integers";
    case Is::kNumberArray: return "must be an array of numbers";
    case Is::kWholeNumber: return "must be a whole number";
    case Is::kStringArray: return "must be an array of strings";
    case Is::kNumberMap: return "must be an object of name -> number";
    case Is::kScalarMap: return "must be an object of name -> number, bool or string";
  }
  return "";
}

struct Field {
  const char* key;
  Is is;
  bool required = false;
};

// Checks the listed keys of object `o` at `path` (which must itself be an object).
Status Fields(const json& o, const std::string& path, std::initializer_list<Field> fields) {
  if (!o.is_object()) return JsonError(path.empty() ? "/" : path, "must be an object", o);
  for (const Field& f : fields) {
    if (!o.contains(f.key)) {
      if (f.required) return Status::Invalid(JsonPath(path, f.key) + ": missing; " + Describe(f.is));
      continue;
    }
    if (!Matches(o.at(f.key), f.is)) return JsonError(JsonPath(path, f.key), Describe(f.is), o.at(f.key));
  }
  return Status::Ok();
}

// The largest count or epoch an index may hold (a step's forwards, optimizer or scheduler steps, an epoch, a
// join round): 2^31 - 1. No run reaches it; a larger value was edited (2^32 read through a 32-bit int wraps).
constexpr int64_t kMaxIndexCount = (int64_t{1} << 31) - 1;
// Cumulative counts since the run began (scheduler steps before a step, DDP iterations before the recorder): the
// documented bound on steps (core/scenario.h kMaxSteps); the protocol check steps a scheduler that many times.
constexpr int64_t kMaxIndexCumulative = kMaxSteps;
// A tensor's element count or dimension as the index names it (2^48 elements: 1 PiB of float32).
constexpr int64_t kMaxIndexNumel = int64_t{1} << 48;

// Value `v` at `path` (a number, its type checked by Fields) lies in [lo, hi]; `what` says what it is.
Status Within(const json& v, const std::string& path, int64_t lo, int64_t hi, const char* what) {
  const double d = v.get<double>();  // an unsigned 2^64 - 1 or a float compares right as a double
  if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi))) {
    return JsonError(path, fmt::format("must be in [{}, {}] ({})", lo, hi, what), v);
  }
  return Status::Ok();
}

// Each of `keys` that object `o` at `path` holds (as a number, Fields checked its type) lies in [lo, hi].
Status InRange(const json& o, const std::string& path, std::initializer_list<const char*> keys, int64_t lo,
               int64_t hi, const char* what) {
  for (const char* key : keys) {
    if (o.contains(key) && o.at(key).is_number()) DDPCHECK_RETURN_IF_ERROR(Within(o.at(key), JsonPath(path, key), lo, hi, what));
  }
  return Status::Ok();
}

// Every element of the integer array at `key` of `o` (if present) lies in [lo, hi].
Status ElementsInRange(const json& o, const std::string& path, const char* key, int64_t lo, int64_t hi,
                       const char* what) {
  if (!o.contains(key) || !o.at(key).is_array()) return Status::Ok();
  const json& a = o.at(key);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].is_number()) DDPCHECK_RETURN_IF_ERROR(Within(a[i], JsonPath(JsonPath(path, key), i), lo, hi, what));
  }
  return Status::Ok();
}

// An optimizer's settings (the index's /optimizer, a /param_groups entry, a step's groups entry): the values
// torch's optimizers refuse at construction (lr, momentum, weight_decay, eps < 0; a beta outside [0, 1]) cannot
// have been recorded. Keys an optimizer ddpcheck does not know keeps are not looked at; values that differ
// between ranks are the protocol check's findings, not bad input.
Status CheckOptimizerValues(const json& o, const std::string& path) {
  if (!o.is_object()) return Status::Ok();
  // The settings the replay and the protocol check read: numbers and flags of torch's types (QA round 16: a string
  // momentum or a null lr ended in the json library's text, naming no pointer).
  DDPCHECK_RETURN_IF_ERROR(Fields(o, path,
                                  {{"type", Is::kString},
                                   {"lr", Is::kNumber},
                                   {"momentum", Is::kNumber},
                                   {"dampening", Is::kNumber},
                                   {"weight_decay", Is::kNumber},
                                   {"eps", Is::kNumber},
                                   {"alpha", Is::kNumber},
                                   {"lr_decay", Is::kNumber},
                                   {"initial_accumulator_value", Is::kNumber},
                                   {"rho", Is::kNumber},
                                   {"momentum_decay", Is::kNumber},
                                   {"nesterov", Is::kBool},
                                   {"maximize", Is::kBool},
                                   {"amsgrad", Is::kBool},
                                   {"centered", Is::kBool},
                                   {"betas", Is::kNumberArray}}));
  for (const char* key : {"lr", "momentum", "weight_decay", "eps", "alpha", "lr_decay", "initial_accumulator_value"}) {
    if (o.contains(key) && o.at(key).is_number() && !(o.at(key).get<double>() >= 0)) {
      return JsonError(JsonPath(path, key), "must be >= 0 (torch's optimizers refuse a negative value)", o.at(key));
    }
  }
  if (o.contains("betas") && o.at("betas").is_array()) {
    const json& b = o.at("betas");
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i].is_number() && !(b[i].get<double>() >= 0 && b[i].get<double>() <= 1)) {
        return JsonError(JsonPath(JsonPath(path, "betas"), i), "must be in [0, 1] (torch refuses another beta)", b[i]);
      }
    }
  }
  return Status::Ok();
}

Status CheckStep(const json& st, const std::string& p, int64_t n_params) {
  DDPCHECK_RETURN_IF_ERROR(Fields(st, p,
                                  {{"step", Is::kInt, true},
                                   {"indices", Is::kString, true},
                                   {"loss", Is::kNumberOrNull},
                                   {"lr", Is::kNumber, true},
                                   {"forward_buffers", Is::kStringMap},
                                   {"grads", Is::kStringMap, true},
                                   {"params", Is::kStringMap, true},
                                   {"buffers", Is::kStringMap, true},
                                   {"optimizer_state", Is::kObject},
                                   {"ref_loss", Is::kNumberOrNull},
                                   {"ddp_forwards", Is::kInt},
                                   {"module_forwards", Is::kInt},
                                   {"epoch", Is::kInt},
                                   {"lrs", Is::kNumberArray},
                                   {"optimizer_steps", Is::kInt},
                                   {"scheduler_steps", Is::kInt},
                                   {"scheduler_steps_before", Is::kInt},
                                   {"ref_grads", Is::kStringMap},
                                   {"ref_rows", Is::kInt},
                                   {"microbatches", Is::kInt},
                                   {"autocast", Is::kBool},
                                   {"eval_modules", Is::kStringArray},
                                   {"trainable", Is::kString},
                                   {"train_forwards", Is::kInt},
                                   {"join", Is::kBool},
                                   {"join_round", Is::kInt},
                                   {"after_gap", Is::kBool},
                                   {"edited_before_step", Is::kStringArray},
                                   {"edited_after_step", Is::kStringArray},
                                   {"lr_edited", Is::kBool},
                                   {"ref_note", Is::kString},
                                   {"ref_loss_ratio", Is::kNumber},
                                   {"forward_buffers_first", Is::kBool},
                                   {"loss_state", Is::kScalarMap},
                                   {"model_state", Is::kScalarMap},
                                   {"outside_params", Is::kScalarMap},
                                   {"groups", Is::kArray},
                                   {"optimizer_step_counts", Is::kNumberMap},
                                   {"buckets", Is::kArray}}));
  if (st.contains("buckets")) {
    const json& buckets = st.at("buckets");
    for (size_t b = 0; b < buckets.size(); ++b) {
      const std::string q = JsonPath(JsonPath(p, "buckets"), b);
      DDPCHECK_RETURN_IF_ERROR(Fields(buckets[b], q,
                                      {{"index", Is::kInt, true},
                                       {"params", Is::kIntArray, true},
                                       {"local", Is::kString, true},
                                       {"reduced", Is::kStringOrNull},
                                       {"reduced_is_grads", Is::kBool}}));
      // A bucket holds at least one parameter, so there are no more buckets than parameters; its parameters are
      // indices into the index's /params (a 64-bit index read as 32 bits named another parameter).
      const int64_t n = n_params >= 0 ? n_params : kMaxIndexCount;
      DDPCHECK_RETURN_IF_ERROR(InRange(buckets[b], q, {"index"}, 0, std::max<int64_t>(n, 1) - 1,
                                       n_params >= 0 ? "a DDP bucket index: at most one bucket per parameter of /params"
                                                     : "a DDP bucket index"));
      DDPCHECK_RETURN_IF_ERROR(ElementsInRange(buckets[b], q, "params", 0, std::max<int64_t>(n, 1) - 1,
                                               n_params >= 0 ? "a parameter's index in the index's /params"
                                                             : "a parameter's index"));
      // Each parameter once, and at least one (QA round 16: an empty list crashed the protocol check).
      const json& bp = buckets[b].at("params");
      if (bp.empty()) {
        return JsonError(JsonPath(q, "params"), "must name at least one parameter (a DDP bucket is never empty)", bp);
      }
      std::set<int64_t> held;
      for (size_t i = 0; i < bp.size(); ++i) {
        if (!held.insert(bp[i].get<int64_t>()).second) {
          return JsonError(JsonPath(JsonPath(q, "params"), i), "must name each parameter once (DDP puts a parameter "
                                                               "in one bucket)", bp[i]);
        }
      }
    }
  }
  DDPCHECK_RETURN_IF_ERROR(InRange(st, p, {"step"}, 0, kMaxSteps, "a step number"));
  // counts: never negative, and no larger than a run makes them (an epoch is the sampler's, which a resumed run
  // may set anywhere from 0; the sampler seeds torch's generator with seed + epoch)
  DDPCHECK_RETURN_IF_ERROR(InRange(st, p,
                                   {"optimizer_steps", "scheduler_steps", "microbatches", "ddp_forwards",
                                    "module_forwards", "train_forwards", "join_round"},
                                   0, kMaxIndexCount, "a count of one step"));
  DDPCHECK_RETURN_IF_ERROR(InRange(st, p, {"epoch"}, 0, kMaxIndexCount, "the sampler's epoch"));
  DDPCHECK_RETURN_IF_ERROR(InRange(st, p, {"ref_rows"}, 0, kMaxSamples, "rows of a batch"));
  DDPCHECK_RETURN_IF_ERROR(InRange(st, p, {"scheduler_steps_before"}, 0, kMaxIndexCumulative,
                                   "the lr scheduler's steps since it was made"));
  if (st.contains("groups")) {
    const json& gs = st.at("groups");
    for (size_t g = 0; g < gs.size(); ++g) {
      DDPCHECK_RETURN_IF_ERROR(CheckOptimizerValues(gs[g], JsonPath(JsonPath(p, "groups"), g)));
    }
  }
  if (st.contains("lrs") && st.at("lrs").empty()) {
    return JsonError(JsonPath(p, "lrs"), "must hold each param group's lr (at least one)", st.at("lrs"));
  }
  if (st.contains("optimizer_state")) {
    for (const auto& item : st.at("optimizer_state").items()) {
      const std::string q = JsonPath(JsonPath(p, "optimizer_state"), item.key());
      if (!Matches(item.value(), Is::kStringMap)) return JsonError(q, Describe(Is::kStringMap), item.value());
    }
  }
  return Status::Ok();
}

}  // namespace

bool RecordedSeedIsNegative(const json& sampler) {
  return sampler.contains("seed") && sampler.at("seed").is_number_integer() && sampler.at("seed").get<int64_t>() < 0;
}

Status CheckTorchDumpIndexTypes(const json& ix) {
  // What the report prints of a recording: its module's type and its tensors' names (not the free text torch
  // wrote, an error's traceback or a loss's repr, which no report line holds raw).
  if (ix.is_object()) {
    for (const char* key : {"module_type", "model", "params", "buffers", "init"}) {
      if (ix.contains(key)) DDPCHECK_RETURN_IF_ERROR(NoControlCharacters(ix.at(key), JsonPath("", key)));
    }
  }
  DDPCHECK_RETURN_IF_ERROR(Fields(ix, "",
                                  {{"format", Is::kString, true},
                                   {"rank", Is::kInt, true},
                                   {"world_size", Is::kInt, true},
                                   {"model", Is::kArrayOrNull, true},  // null: a model the replay cannot rebuild
                                   {"loss", Is::kStringOrNull},
                                   {"dtype", Is::kString},
                                   {"ddp", Is::kObject, true},
                                   {"optimizer", Is::kObjectOrNull, true},  // null: one the replay cannot run
                                   {"schedulers", Is::kArray},
                                   {"init", Is::kStringMap, true},
                                   {"params", Is::kArray},
                                   {"steps", Is::kArray, true},
                                   {"sampler", Is::kObject},
                                   {"dataset", Is::kObject},
                                   {"batch_size", Is::kIntOrNull},
                                   {"error", Is::kObject},
                                   {"torch_version", Is::kString},
                                   {"init_optimizer_state", Is::kObject},
                                   {"join", Is::kBool},
                                   {"mode_dependent", Is::kStringMap},
                                   {"init_optimizer_step_counts", Is::kNumberMap},
                                   {"module_type", Is::kString},
                                   {"scheduler_types", Is::kStringArray},
                                   {"replay", Is::kObject},
                                   {"forward_inputs", Is::kObject}}));
  if (ix.contains("forward_inputs")) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("forward_inputs"), "/forward_inputs",
                                    {{"positional", Is::kInt}, {"keywords", Is::kStringArray}}));
    DDPCHECK_RETURN_IF_ERROR(InRange(ix.at("forward_inputs"), "/forward_inputs", {"positional"}, 0, kMaxIndexCount,
                                     "a count of arguments"));
  }
  if (ix.contains("replay")) {
    DDPCHECK_RETURN_IF_ERROR(
        Fields(ix.at("replay"), "/replay", {{"possible", Is::kBool}, {"reasons", Is::kStringArray}}));
    // The recorder replays only a run with a DistributedSampler (it notes "no DistributedSampler was passed"):
    // a replayable index without /sampler was edited, and its replay would draw a default sampler's batches (QA
    // round 16: a FAIL naming no pattern).
    const json& rp = ix.at("replay");
    if (rp.contains("possible") && rp.at("possible") == true && !ix.contains("sampler")) {
      return JsonError("/replay/possible", "must be false where no /sampler was recorded (the recorder replays only "
                       "a run with a DistributedSampler): an edited index? record the run again", rp.at("possible"));
    }
  }
  // The header's sizes, on every rank's index alike (rank r > 0's was read but not checked: a sampler length of
  // 2^40 there allocated that many indices)
  DDPCHECK_RETURN_IF_ERROR(InRange(ix, "", {"world_size"}, 1, kMaxWorld, "the number of ranks"));
  DDPCHECK_RETURN_IF_ERROR(InRange(ix, "", {"rank"}, 0, kMaxWorld - 1, "this rank's number"));
  if (ix.at("rank").get<double>() >= ix.at("world_size").get<double>()) {
    return JsonError("/rank", fmt::format("must be a rank in [0, world_size {})", DescribeJson(ix.at("world_size"))),
                     ix.at("rank"));
  }
  DDPCHECK_RETURN_IF_ERROR(InRange(ix, "", {"batch_size"}, 1, kMaxSamples, "DataLoader's batch_size"));
  if (ix.contains("init_optimizer_state")) {
    for (const auto& item : ix.at("init_optimizer_state").items()) {
      const std::string q = JsonPath("/init_optimizer_state", item.key());
      if (!Matches(item.value(), Is::kStringMap)) return JsonError(q, Describe(Is::kStringMap), item.value());
    }
  }
  const json& model = ix.at("model");
  for (size_t i = 0; model.is_array() && i < model.size(); ++i) {
    const std::string p = JsonPath("/model", i);
    DDPCHECK_RETURN_IF_ERROR(Fields(model[i], p,
                                    {{"type", Is::kString, true},
                                     {"in", Is::kInt},
                                     {"out", Is::kInt},
                                     {"features", Is::kInt},
                                     {"bias", Is::kBool},
                                     {"eps", Is::kNumber},
                                     {"momentum", Is::kNumberOrNull},
                                     {"affine", Is::kBool},
                                     {"track_running_stats", Is::kBool},
                                     {"p", Is::kNumber}}));
    DDPCHECK_RETURN_IF_ERROR(InRange(model[i], p, {"in", "out", "features"}, 1, kMaxWidth, "a layer's width"));
    const std::string type = model[i].at("type").get<std::string>();
    const std::vector<std::string> needed = type == "linear" ? std::vector<std::string>{"in", "out"}
                                            : type == "batchnorm1d" || type == "syncbatchnorm1d"
                                                ? std::vector<std::string>{"features"}
                                                : std::vector<std::string>{};
    for (const std::string& k : needed) {
      if (!model[i].contains(k)) {
        return Status::Invalid(JsonPath(p, k) + ": missing; a " + type + " layer needs it (a damaged dump? record it again)");
      }
    }
    if (model[i].contains("p") && !(model[i].at("p").get<double>() >= 0 && model[i].at("p").get<double>() <= 1)) {
      return JsonError(JsonPath(p, "p"), "must be a dropout probability in [0, 1]", model[i].at("p"));
    }
  }
  DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("ddp"), "/ddp",
                                  {{"bucket_cap_mb", Is::kNumber},
                                   {"broadcast_buffers", Is::kBool},
                                   {"find_unused_parameters", Is::kBool},
                                   {"gradient_as_bucket_view", Is::kBool},
                                   {"wrapped", Is::kBool},
                                   {"iterations_before", Is::kInt}}));
  DDPCHECK_RETURN_IF_ERROR(InRange(ix.at("ddp"), "/ddp", {"iterations_before"}, 0, kMaxIndexCumulative,
                                   "DDP's iterations before the recorder"));
  if (ix.at("ddp").contains("bucket_cap_mb") &&
      !(ix.at("ddp").at("bucket_cap_mb").get<double>() >= 0 && ix.at("ddp").at("bucket_cap_mb").get<double>() <= kMaxBucketCapMb)) {
    return JsonError("/ddp/bucket_cap_mb", fmt::format("must be in [0, {}] (DDP's bucket size in MiB)", kMaxBucketCapMb),
                     ix.at("ddp").at("bucket_cap_mb"));
  }
  if (!ix.at("optimizer").is_null()) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("optimizer"), "/optimizer",
                                    {{"type", Is::kString, true},
                                     {"lr", Is::kNumber, true},
                                     {"weight_decay", Is::kNumber},
                                     {"maximize", Is::kBool},
                                     {"momentum", Is::kNumber},
                                     {"dampening", Is::kNumber},
                                     {"nesterov", Is::kBool},
                                     {"eps", Is::kNumber},
                                     {"betas", Is::kArray}}));
    const json& opt = ix.at("optimizer");
    // (the recorder writes the optimizers the replay runs; any other is null: QA round 15's "str" was read as Adam)
    if (opt.at("type") != "sgd" && opt.at("type") != "adam" && opt.at("type") != "adamw") {
      return JsonError("/optimizer/type", "must be sgd, adam or adamw (the recorder writes null for another optimizer)",
                       opt.at("type"));
    }
    DDPCHECK_RETURN_IF_ERROR(CheckOptimizerValues(opt, "/optimizer"));
    if (opt.at("type") == "adam" || opt.at("type") == "adamw") {
      if (!opt.contains("betas") || opt.at("betas").size() != 2 || !opt.at("betas")[0].is_number() ||
          !opt.at("betas")[1].is_number()) {
        return JsonError("/optimizer/betas", "must be [beta1, beta2] for adam and adamw", opt.value("betas", json()));
      }
      if (!opt.contains("eps")) return Status::Invalid("/optimizer/eps: missing; adam and adamw need it");
    }
  }
  if (ix.contains("schedulers")) {
    const json& ss = ix.at("schedulers");
    for (size_t i = 0; i < ss.size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(Fields(ss[i], JsonPath("/schedulers", i),
                                      {{"type", Is::kString, true},
                                       {"step_size", Is::kWholeNumber},
                                       {"milestones", Is::kIntArray},
                                       {"gamma", Is::kNumber},
                                       {"t_max", Is::kWholeNumber},
                                       {"eta_min", Is::kNumber},
                                       {"start_factor", Is::kNumber},
                                       {"end_factor", Is::kNumber},
                                       {"total_iters", Is::kWholeNumber}}));
      const std::string q = JsonPath("/schedulers", i);
      DDPCHECK_RETURN_IF_ERROR(InRange(ss[i], q, {"step_size", "t_max"}, 1, kMaxSteps, "a scheduler period"));  // divisors
      DDPCHECK_RETURN_IF_ERROR(InRange(ss[i], q, {"total_iters"}, 0, kMaxSteps, "a scheduler period"));
      DDPCHECK_RETURN_IF_ERROR(ElementsInRange(ss[i], q, "milestones", 0, kMaxSteps, "a scheduler epoch"));
    }
  }
  if (ix.contains("param_groups")) {
    const json& gs = ix.at("param_groups");
    if (!gs.is_array()) return JsonError("/param_groups", "must be an array", gs);
    const size_t n = ix.contains("params") && ix.at("params").is_array() ? ix.at("params").size() : 0;
    for (size_t g = 0; g < gs.size(); ++g) {
      const std::string q = JsonPath("/param_groups", g);
      DDPCHECK_RETURN_IF_ERROR(Fields(gs[g], q, {{"params", Is::kIntArray, true}, {"lr", Is::kNumber}}));
      DDPCHECK_RETURN_IF_ERROR(CheckOptimizerValues(gs[g], q));
      const json& idx = gs[g].at("params");
      for (size_t k = 0; k < idx.size(); ++k) {
        // -1: a parameter the optimizer holds outside the DDP module (a frozen EMA target in the optimizer)
        if (!(idx[k].get<double>() >= -1 && idx[k].get<double>() < static_cast<double>(n))) {
          return JsonError(JsonPath(JsonPath(q, "params"), k),
                           fmt::format("must be a parameter's index in [0, {}) (the index's /params), or -1 for one "
                                       "outside the module", n), idx[k]);
        }
      }
    }
  }
  if (ix.contains("params")) {
    const json& ps = ix.at("params");
    for (size_t i = 0; i < ps.size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(Fields(ps[i], JsonPath("/params", i),
                                      {{"name", Is::kString, true},
                                       {"numel", Is::kInt},
                                       {"dtype", Is::kString},
                                       {"requires_grad", Is::kBool},
                                       {"ddp_registered", Is::kBool},
                                       {"sparse", Is::kBool},
                                       {"shape", Is::kIntArray}}));
      DDPCHECK_RETURN_IF_ERROR(InRange(ps[i], JsonPath("/params", i), {"numel"}, 0, kMaxIndexNumel, "an element count"));
      DDPCHECK_RETURN_IF_ERROR(
          ElementsInRange(ps[i], JsonPath("/params", i), "shape", 0, kMaxIndexNumel, "a tensor dimension"));
    }
  }
  const int64_t n_params = ix.contains("params") ? static_cast<int64_t>(ix.at("params").size()) : -1;
  const json& steps = ix.at("steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    DDPCHECK_RETURN_IF_ERROR(CheckStep(steps[i], JsonPath("/steps", i), n_params));
  }
  if (ix.contains("sampler")) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("sampler"), "/sampler",
                                    {{"type", Is::kString},
                                     {"shuffle", Is::kBool},
                                     {"seed", Is::kInt},
                                     {"drop_last", Is::kBool},
                                     {"set_epoch_calls", Is::kIntArray},
                                     {"indices_outside", Is::kBool},
                                     {"len", Is::kIntOrNull},
                                     {"num_replicas", Is::kInt},
                                     {"rank", Is::kInt}}));
    const json& sm = ix.at("sampler");
    DDPCHECK_RETURN_IF_ERROR(InRange(sm, "/sampler", {"num_replicas"}, 1, kMaxWorld, "a world size"));
    DDPCHECK_RETURN_IF_ERROR(InRange(sm, "/sampler", {"len"}, 0, kMaxSamples, "len(dataset)"));
    DDPCHECK_RETURN_IF_ERROR(
        ElementsInRange(sm, "/sampler", "set_epoch_calls", -kMaxIndexCount, kMaxIndexCount, "an epoch"));
    if (sm.contains("rank") && (sm.at("rank").get<int64_t>() < 0 ||
                                (sm.contains("num_replicas") && sm.at("rank").get<int64_t>() >= sm.at("num_replicas").get<int64_t>()))) {
      return JsonError("/sampler/rank", "must be a rank in [0, num_replicas)", sm.at("rank"));
    }
  }
  if (ix.contains("dataset")) {
    DDPCHECK_RETURN_IF_ERROR(Fields(ix.at("dataset"), "/dataset",
                                    {{"x", Is::kString, true},
                                     {"y", Is::kString, true},
                                     {"complete", Is::kBool},
                                     {"rows_seen", Is::kIntArray},
                                     {"rows_redrawn", Is::kInt},
                                     {"rows_changed", Is::kInt}}));
  }
  if (ix.contains("error")) {
    DDPCHECK_RETURN_IF_ERROR(
        Fields(ix.at("error"), "/error", {{"type", Is::kString}, {"step", Is::kInt}, {"message", Is::kString}}));
    DDPCHECK_RETURN_IF_ERROR(InRange(ix.at("error"), "/error", {"step"}, 0, kMaxSteps, "a step number"));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
