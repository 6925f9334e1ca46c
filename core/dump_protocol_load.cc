// LoadProtocolRecords: the recorder's protocol records (index keys + the tensors it names) as ProtocolRecords.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"
#include "core/json_reader.h"
#include "core/npy_archive.h"
#include "core/optimizer.h"

namespace ddpcheck::core {
namespace {

// j[key] as a string; "" when absent or null (the recorder writes null for "none").
std::string Str(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
}

Status LoadFiles(DumpTensorFiles& tensors, const nlohmann::json& files, std::map<std::string, Tensor>* out) {
  for (const auto& [name, file] : files.items()) {
    if (!file.is_string()) continue;
    DDPCHECK_RETURN_IF_ERROR(tensors.Read(file.get<std::string>(), &(*out)[name]));
  }
  return Status::Ok();
}

// A bucket marked reduced_is_grads (format version 3): its reduced gradient is the step's grads of its parameters,
// flattened and one after another in the bucket's order (the recorder wrote them once, having checked the bits).
// Errors start with the bucket's JSON pointer inside the step ("/buckets/0/reduced_is_grads: ...").
Status ReducedFromGrads(const std::vector<ProtocolParam>& params, const ProtocolStep& s, size_t b,
                        ProtocolBucket* pb) {
  Tensor flat;
  for (int i : pb->params) {
    const std::string where = fmt::format("/buckets/{}/reduced_is_grads", b);
    if (i < 0 || static_cast<size_t>(i) >= params.size()) {
      return Status::Invalid(fmt::format("{}: the bucket's parameter {} is not one of the {} parameters", where, i,
                                         params.size()));
    }
    const auto g = s.grads.find(params[i].name);
    if (g == s.grads.end()) {
      return Status::Invalid(fmt::format("{}: parameter {} ('{}') has no gradient in the step's grads to rebuild the "
                                         "bucket's reduced gradient from", where, i, params[i].name));
    }
    if (!flat.data.empty() && g->second.dtype != flat.dtype) {
      return Status::Invalid(fmt::format("{}: parameter {} ('{}') has another dtype than the bucket's others", where, i,
                                         params[i].name));
    }
    flat.dtype = g->second.dtype;
    flat.data.insert(flat.data.end(), g->second.data.begin(), g->second.data.end());
  }
  flat.shape = {static_cast<int64_t>(flat.data.size())};
  pb->reduced = std::move(flat);
  return Status::Ok();
}

// A bucket's local or reduced gradient is its parameters' gradients one after another (DDP's flat bucket): as many
// floating values as they have (QA round 16: a local bucket of 10 of its 83 values was zero-padded and reported as
// a reduction that is not the mean). A sparse parameter's bucket is not flat: not checked.
Status CheckBucketTensor(const std::vector<ProtocolParam>& params, const ProtocolBucket& pb, size_t b, const char* what,
                         const std::string& file, const Tensor& t) {
  int64_t total = 0;
  for (int i : pb.params) {
    if (i < 0 || static_cast<size_t>(i) >= params.size() || params[static_cast<size_t>(i)].sparse) return Status::Ok();
    total += params[static_cast<size_t>(i)].numel;
  }
  const std::string where = fmt::format("/buckets/{}/{}", b, what);
  if (!IsFloating(t.dtype)) {
    return Status::Invalid(fmt::format("{}: {} holds {} values; a bucket holds its parameters' gradients, floating "
                                       "values", where, file, DTypeName(t.dtype)));
  }
  if (t.numel() != total) {
    return Status::Invalid(fmt::format("{}: {} holds {} values; the bucket's {} parameter(s) have {} (a bucket is its "
                                       "parameters' gradients one after another): the file does not belong to this "
                                       "bucket or was cut short", where, file, t.numel(), pb.params.size(), total));
  }
  return Status::Ok();
}

Status LoadStep(DumpTensorFiles& tensors, const std::string& type, const std::vector<ProtocolParam>& params,
                const nlohmann::json& st, ProtocolStep* s) {
  s->step = st.at("step").get<int64_t>();
  s->epoch = st.value("epoch", int64_t{0});
  s->lrs = st.contains("lrs") ? st.at("lrs").get<std::vector<double>>()
                              : std::vector<double>{st.at("lr").get<double>()};
  s->optimizer_steps = st.value("optimizer_steps", int64_t{1});
  s->optimizer_steps_known = st.contains("optimizer_steps");
  s->lr_edited = st.value("lr_edited", false);
  s->ddp_forwards = st.value("ddp_forwards", int64_t{-1});
  s->scheduler_steps = st.value("scheduler_steps", int64_t{0});
  s->scheduler_steps_before = st.value("scheduler_steps_before", int64_t{0});
  s->ref_rows = st.value("ref_rows", int64_t{0});
  s->microbatches = st.value("microbatches", int64_t{0});
  s->autocast = st.value("autocast", false);
  s->autocast_known = st.contains("autocast");
  s->after_gap = st.value("after_gap", false);
  s->scaler = st.contains("scaler");
  for (const auto& [key, into] : {std::pair{"edited_before_step", &s->edited_before},
                                  std::pair{"edited_after_step", &s->edited_after}}) {
    if (st.contains(key)) *into = st.at(key).get<std::vector<std::string>>();  // a string array: the index schema
  }
  if (st.contains("eval_modules")) s->eval_modules = st.at("eval_modules").get<std::vector<std::string>>();
  if (st.contains("trainable")) s->trainable = st.at("trainable").get<std::string>();
  s->train_forwards = st.value("train_forwards", int64_t{-1});
  if (st.contains("loss") && st.at("loss").is_number()) s->loss = st.at("loss").get<double>();
  if (st.contains("ref_loss") && st.at("ref_loss").is_number()) s->ref_loss = st.at("ref_loss").get<double>();
  s->ref_note = Str(st, "ref_note");
  if (st.contains("ref_loss_ratio") && st.at("ref_loss_ratio").is_number()) {
    s->ref_loss_ratio = st.at("ref_loss_ratio").get<double>();  // a number: the index schema (core/dump_index.cc)
  }
  // Each group's hyper-parameters as this rank's optimizer stepped with them, but the lr (its own checks) and the
  // implementation switches that change no value: what CheckStatesAgree compares between ranks
  if (st.contains("groups") && st.at("groups").is_array()) {
    s->optimizer_settings.emplace();
    const auto& groups = st.at("groups");
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!groups[g].is_object()) continue;
      for (const auto& [key, v] : groups[g].items()) {
        if (key == "lr" || key == "initial_lr" || key == "params" || key == "foreach" || key == "fused" ||
            key == "capturable" || key == "differentiable") {
          continue;
        }
        s->optimizer_settings->emplace(fmt::format("{} (group {})", key, g), v);
      }
    }
  }
  for (const auto& g : st.value("groups", nlohmann::json::array())) {
    OptimizerSpec spec;
    if (!OptimizerSpecFromGroup(type, g, &spec).ok()) {
      s->groups.clear();
      break;
    }
    s->groups.push_back(spec);
  }
  DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, st.at("grads"), &s->grads));
  DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, st.at("params"), &s->params));
  if (st.contains("ref_grads")) DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, st.at("ref_grads"), &s->ref_grads));
  // A reference gradient has its parameter's shape, as the step's gradient (checked against /params) has
  // (QA round 15: a (100,) file for a (10, 10) weight was compared element by element and passed).
  for (const auto& [name, t] : s->ref_grads) {
    const auto g = s->grads.find(name);
    if (g != s->grads.end() && g->second.shape != t.shape) {
      return Status::Invalid(fmt::format("/ref_grads/{}: holds a tensor of shape {}, but the step's gradient "
                                         "of '{}' has shape {} (a file edited or from another recording)",
                                         name, ShapeString(t.shape), name, ShapeString(g->second.shape)));
    }
  }
  // A float64 reference that is not finite stands for nothing (an infinite one made every budget infinite and
  // passed, QA round 15): the step is left without one, and the report says so at it.
  for (const auto& [name, t] : s->ref_grads) {
    const auto bad = std::find_if(t.data.begin(), t.data.end(), [](double v) { return !std::isfinite(v); });
    if (bad == t.data.end()) continue;
    s->ref_note = fmt::format("its float64 reference gradient of {} is not finite ({} at flat index {}): a damaged "
                              "dump, or a reference that overflowed", name, *bad, bad - t.data.begin());
    s->ref_grads.clear();
    break;
  }
  // The normalisation statistics among the buffers (what CheckBufferBroadcast compares; per channel, small).
  s->forward_buffers_first = st.value("forward_buffers_first", false);  // a bool: the index schema
  for (const auto& [key, into] : {std::pair{"loss_state", &s->loss_state}, std::pair{"model_state", &s->model_state},
                                  std::pair{"outside_params", &s->outside_params}}) {
    if (!st.contains(key)) continue;  // name -> number, bool or string: the index schema
    into->emplace();
    for (const auto& [name, v] : st.at(key).items()) (*into)->emplace(name, v);
  }
  for (const auto& [key, into] : {std::pair{"forward_buffers", &s->forward_buffers}, std::pair{"buffers", &s->buffers}}) {
    if (!st.contains(key)) continue;
    nlohmann::json stats = nlohmann::json::object();
    for (const auto& [name, file] : st.at(key).items()) if (IsNormStatistic(name)) stats[name] = file;
    DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, stats, into));
  }
  const nlohmann::json optimizer_state = st.value("optimizer_state", nlohmann::json::object());  // keep it alive
  for (const auto& [state, files] : optimizer_state.items()) {
    DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, files, &s->opt_state[state]));
  }
  s->opt_counts = st.value("optimizer_step_counts", std::map<std::string, double>{});
  Tensor idx;
  DDPCHECK_RETURN_IF_ERROR(tensors.Read(st.at("indices").get<std::string>(), &idx));
  for (double v : idx.data) s->indices.push_back(static_cast<int64_t>(v));
  s->buckets_recorded = st.contains("buckets");
  const nlohmann::json buckets = st.value("buckets", nlohmann::json::array());
  for (size_t k = 0; k < buckets.size(); ++k) {
    const auto& b = buckets[k];
    ProtocolBucket pb;
    pb.index = b.at("index").get<int64_t>();
    pb.params = b.at("params").get<std::vector<int>>();
    DDPCHECK_RETURN_IF_ERROR(tensors.Read(b.at("local").get<std::string>(), &pb.local));
    DDPCHECK_RETURN_IF_ERROR(CheckBucketTensor(params, pb, k, "local", b.at("local").get<std::string>(), pb.local));
    if (b.contains("reduced") && b.at("reduced").is_string()) {
      Tensor t;
      DDPCHECK_RETURN_IF_ERROR(tensors.Read(b.at("reduced").get<std::string>(), &t));
      DDPCHECK_RETURN_IF_ERROR(CheckBucketTensor(params, pb, k, "reduced", b.at("reduced").get<std::string>(), t));
      pb.reduced = std::move(t);
    } else if (b.value("reduced_is_grads", false)) {  // its type and version checked by ReadTorchDump
      DDPCHECK_RETURN_IF_ERROR(ReducedFromGrads(params, *s, k, &pb));
    }
    s->buckets.push_back(std::move(pb));
  }
  return Status::Ok();
}

// ddpcheck's own description of every scheduler, when the recorder could give one (index "schedulers").
bool KnownSchedulers(const nlohmann::json& ix, std::vector<SchedulerSpec>* out) {
  const auto types = ix.value("scheduler_types", std::vector<std::string>{});
  const nlohmann::json known = ix.contains("schedulers") ? ix.at("schedulers") : nlohmann::json::array();
  if (!known.is_array() || known.size() != types.size()) return false;
  for (const auto& j : known) {
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
    out->push_back(sc);
  }
  return true;
}

}  // namespace

Status OptimizerSpecFromGroup(const std::string& type, const nlohmann::json& g, OptimizerSpec* out) {
  OptimizerSpec s;
  s.type = type;
  s.lr = g.value("lr", 0.0);
  s.momentum = g.value("momentum", 0.0);
  s.dampening = g.value("dampening", 0.0);
  s.weight_decay = g.value("weight_decay", 0.0);
  s.nesterov = g.value("nesterov", false);
  s.maximize = g.value("maximize", false);
  s.eps = g.value("eps", 1e-8);
  if (g.contains("betas")) {
    s.beta1 = g.at("betas").at(0).get<double>();
    s.beta2 = g.at("betas").at(1).get<double>();
  }
  s.amsgrad = g.value("amsgrad", false);
  s.alpha = g.value("alpha", 0.99);
  s.centered = g.value("centered", false);
  s.rho = g.value("rho", 0.9);
  s.lr_decay = g.value("lr_decay", 0.0);
  s.initial_accumulator_value = g.value("initial_accumulator_value", 0.0);
  DDPCHECK_RETURN_IF_ERROR(ValidateOptimizerSpec(s));
  *out = s;
  return Status::Ok();
}

Status LoadProtocolRecords(const TorchDump& dump, ProtocolRecords* out) {
  *out = ProtocolRecords();
  const nlohmann::json& ix = dump.ranks.at(0).index;
  const std::string where = dump.dir + "/rank0/index.json";
  try {
    out->world = dump.world;
    out->init_buffers_rebroadcast = dump.init_buffers_rebroadcast;
    out->dataset_conflict = dump.dataset_conflict;
    ParseDType(ix.value("dtype", std::string("float32")), &out->dtype);
    for (const auto& p : ix.at("params")) {
      ProtocolParam pp;
      pp.name = p.at("name").get<std::string>();
      pp.numel = p.value("numel", int64_t{-1});
      if (pp.numel < 0 && p.contains("shape")) {  // an index without numel (QA round 15: -1 became a huge size)
        double n = 1;  // (in double: dimensions of up to 2^48 each, per the index schema, would overflow)
        for (int64_t d : p.at("shape").get<std::vector<int64_t>>()) n *= static_cast<double>(d);
        pp.numel = n <= 9.0e15 ? static_cast<int64_t>(n) : -1;
      }
      ParseDType(p.value("dtype", ix.value("dtype", std::string("float32"))), &pp.dtype);
      pp.requires_grad = p.value("requires_grad", true);
      pp.ddp_registered = p.value("ddp_registered", pp.requires_grad);
      pp.sparse = p.value("sparse", false);
      out->params.push_back(pp);
    }
    const auto& ddp = ix.at("ddp");
    out->ddp.bucket_cap_mb = ddp.value("bucket_cap_mb", 25.0);
    out->ddp.find_unused_parameters = ddp.value("find_unused_parameters", false);
    out->ddp.broadcast_buffers = ddp.value("broadcast_buffers", true);
    out->ddp_wrapped = ddp.value("wrapped", true);
    out->ddp_iterations_before = ddp.value("iterations_before", int64_t{0});
    if (ddp.contains("comm_hook") && ddp.at("comm_hook").is_string()) out->comm_hook = ddp.at("comm_hook").get<std::string>();
    out->optimizer_type = Str(ix, "optimizer_type");
    if (out->optimizer_type.empty() && ix.contains("optimizer")) out->optimizer_type = Str(ix.at("optimizer"), "type");
    for (const auto& g : ix.value("param_groups", nlohmann::json::array())) {
      ProtocolGroup pg;
      Status st = OptimizerSpecFromGroup(out->optimizer_type, g, &pg.spec);
      if (!st.ok()) {
        out->optimizer_note = "optimizer update not checked: " + st.message() +
                              " (its parameters and state, of any shape, are compared between ranks bitwise)";
        out->groups.clear();
        break;
      }
      pg.params = g.at("params").get<std::vector<int>>();
      pg.initial_lr = g.value("initial_lr", -1.0);
      out->groups.push_back(pg);
    }
    if (!ix.contains("param_groups")) out->optimizer_note = "optimizer update not checked: no param_groups recorded";
    out->schedulers_known = KnownSchedulers(ix, &out->schedulers);
    const auto& protocol = ix.value("protocol", nlohmann::json::object());
    out->buckets_note = Str(protocol, "buckets_note");
    out->reference_note = Str(protocol, "reference_note");
    out->replayed = dump.replay_unsupported.empty();
    const auto sm = ix.value("sampler", nlohmann::json::object());
    const int64_t batch = ix.value("batch_size", nlohmann::json()).is_number_integer() ? ix.at("batch_size").get<int64_t>() : 0;
    if (sm.contains("len") && sm.at("len").is_number_integer() && batch > 0) {
      const int64_t n = sm.at("len").get<int64_t>(), w = dump.world;
      const int64_t per_rank = sm.value("drop_last", false) && n % w ? n / w : (n + w - 1) / w;
      out->steps_per_epoch = (per_rank + batch - 1) / batch;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Invalid(where + ": malformed protocol records: " + e.what());
  }
  for (const auto& r : dump.ranks) {
    ProtocolRank pr;
    pr.rank = r.rank;
    pr.failed = r.failed;
    pr.error = r.error;
    try {
      DumpTensorFiles tensors(r.dir);
      if (r.index.contains("params") && r.index.at("params").is_array()) {
        for (const auto& p : r.index.at("params")) pr.param_names.push_back(p.at("name").get<std::string>());
      }
      DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, r.index.at("init"), &pr.init));
      const nlohmann::json init_opt = r.index.value("init_optimizer_state", nlohmann::json::object());  // kept alive
      for (const auto& [state, files] : init_opt.items()) {
        DDPCHECK_RETURN_IF_ERROR(LoadFiles(tensors, files, &pr.init_optimizer.opt_state[state]));
      }
      pr.init_optimizer.opt_counts =
          r.index.value("init_optimizer_step_counts", std::map<std::string, double>{});
      if (r.index.contains("sampler")) pr.sampler = r.index.at("sampler");
      if (r.index.contains("forward_inputs")) {  // {positional: int, keywords: [str]} (the index schema)
        const auto& fi = r.index.at("forward_inputs");
        out->forward_positional = std::max(out->forward_positional, fi.value("positional", int64_t{0}));
        for (const auto& k : fi.value("keywords", std::vector<std::string>{})) out->forward_keywords.insert(k);
      }
      if (r.index.contains("mode_dependent")) {  // a string map (the index schema); any rank's counts
        if (!out->mode_dependent) out->mode_dependent.emplace();
        for (const auto& [name, why] : r.index.at("mode_dependent").items()) {
          out->mode_dependent->emplace(name, why.get<std::string>());
        }
      }
      const auto& steps = r.index.at("steps");
      for (size_t i = 0; i < steps.size(); ++i) {
        ProtocolStep s;
        Status loaded = LoadStep(tensors, out->optimizer_type, out->params, steps[i], &s);
        if (!loaded.ok() && (loaded.message().starts_with("/buckets/") || loaded.message().starts_with("/ref_grads/"))) {
          return Status::Invalid(r.dir + "/index.json: " + JsonPath("/steps", i) + loaded.message());
        }
        DDPCHECK_RETURN_IF_ERROR(loaded);
        pr.steps.push_back(std::move(s));
      }
    } catch (const nlohmann::json::exception& e) {
      return Status::Invalid(r.dir + "/index.json: malformed protocol records: " + e.what());
    }
    out->ranks.push_back(std::move(pr));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
