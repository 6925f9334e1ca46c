// The loss half of CheckProtocol: a single process computes its loss with one set of settings, so everything that
// parameterises the loss (the recorder's loss_state, taken at every rec.step(): a loss module's plain settings,
// buffers, parameters and tensor attributes, a loss function's closure variables, defaults, globals and partial
// arguments; tools/ddpcheck_torch_protocol.py loss_state) must be the same on every rank at every step. A
// pos_weight or class weights computed from a rank's own shard, or an alpha set per rank, give each rank another
// loss while every gradient still matches its own rank's float64 reference: no other check sees it. Settings that
// change over the steps the same on every rank (a temperature schedule) agree at each step; a rank's own number
// (a closure over `rank`) is no setting. A recording without loss_state (an older recorder, or a loss named by a
// string) is not checked for it.
// The model's half the same way (model_state, tools/ddpcheck_torch_protocol.py model_state): DDP broadcasts
// parameters and buffers, never what a submodule holds as a plain attribute, so a graph's edge_index, a mask or a
// lookup table built from a per-rank seed (self.edge_index = ...) gives each rank another model while every
// gradient matches its own rank's reference (attribute-per-rank). Values that change from step to step on a rank
// are the loop's data (the last batch's graph), not a setting: they are not compared; an int every rank holds as
// its own rank number neither.
// Two more the same way: the parameters the optimizer steps beside DDP's module (outside_params, after each step:
// DDP never all-reduces their gradients; param-outside-ddp) and each param group's hyper-parameters but the lr
// (optimizer_settings, from the recorder's groups; optimizer-settings-per-rank). CheckStatesAgree runs all four.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/dump_protocol.h"
#include "core/dump_protocol_util.h"

namespace ddpcheck::core {
namespace {

// "closure:crit.attr:pos_weight" -> {"closure variable", "crit.pos_weight"}: the outermost kind in words and the
// path without the inner kinds.
std::pair<std::string, std::string> Describe(const std::string& name) {
  static const std::map<std::string, std::string> kinds = {
      {"attr", "attribute"},          {"closure", "closure variable"}, {"global", "global variable"},
      {"default", "default argument"}, {"partial", "functools.partial argument"},
      {"self", "attribute of the bound object"}, {"settings", "settings of submodule"},
      {"param", "parameter"}};
  std::string kind, path;
  size_t at = 0;
  while (at <= name.size()) {
    size_t dot = name.find('.', at);
    if (dot == std::string::npos) dot = name.size();
    std::string part = name.substr(at, dot - at);
    const size_t colon = part.find(':');
    if (colon != std::string::npos) {
      if (kind.empty()) {
        const auto k = kinds.find(part.substr(0, colon));
        kind = k == kinds.end() ? part.substr(0, colon) : k->second;
      }
      part = part.substr(colon + 1);
    }
    path += (path.empty() ? "" : ".") + part;
    at = dot + 1;
  }
  return {kind.empty() ? "setting" : kind, path};
}

std::string Show(const nlohmann::json* v) {
  if (v == nullptr) return "(not recorded)";
  return v->is_string() ? v->get<std::string>() : v->dump();
}

// A value every rank holds as its own rank number (a closure over `rank` for y.to(rank)), or, where `strings`, a
// string that is the same on every rank once each rank's number in it is left out (a run name "exp-rank1"): no
// setting of the loss.
bool IsPerRankName(const std::vector<const ProtocolRank*>& at, const std::vector<const nlohmann::json*>& values,
                   bool strings) {
  bool numbers = true;
  std::string common;
  for (size_t k = 0; k < at.size(); ++k) {
    const nlohmann::json* v = values[k];
    numbers = numbers && v != nullptr && v->is_number_integer() && v->get<int64_t>() == at[k]->rank;
    strings = strings && v != nullptr && v->is_string() && !v->get<std::string>().starts_with("tensor ");
    if (!strings) continue;
    std::string s = v->get<std::string>();
    const std::string own = std::to_string(at[k]->rank);
    for (size_t i = s.find(own); i != std::string::npos; i = s.find(own, i + 1)) s.replace(i, own.size(), "#");
    strings = k == 0 || s == common;
    common = s;
  }
  return numbers || strings;
}

using State = std::optional<std::map<std::string, nlohmann::json>>;

// What one state check compares and how it names what it finds.
struct StateCheck {
  State ProtocolStep::*state;
  Checkpoint checkpoint;
  const char* prefix;       // of the finding's tensor name: "loss_fn."
  const char* pattern;
  const char* differs;      // "the loss differs between ranks: its"
  const char* explanation;  // after the message
  const char* checked;
  bool strings_per_rank;    // a string that differs only by each rank's number is no setting
  bool data_exempt;         // a name whose value changes between steps on one rank is data the loop sets
};

// The names whose value changes from one step to another on some rank: what the loop sets every step (the last
// batch's graph, a logged loss), not a setting built once.
std::set<std::string> ChangingNames(const ProtocolRecords& r, const StateCheck& c) {
  std::set<std::string> changing;
  for (const auto& rank : r.ranks) {
    std::map<std::string, const nlohmann::json*> last;
    for (const auto& st : rank.steps) {
      if (!(st.*c.state)) continue;
      for (const auto& [name, v] : *(st.*c.state)) {
        const auto [it, fresh] = last.emplace(name, &v);
        if (!fresh && *it->second != v) changing.insert(name);
        it->second = &v;
      }
    }
  }
  return changing;
}

void CheckState(const ProtocolRecords& r, const StateCheck& c, ProtocolResult* out,
                std::vector<ProtocolFinding>* f) {
  bool checked = false;
  const std::set<std::string> changing = c.data_exempt ? ChangingNames(r, c) : std::set<std::string>{};
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    const auto at = RanksAt(r, s, [&](const ProtocolStep& st) { return (st.*c.state).has_value(); });
    if (at.size() < 2) continue;
    checked = true;
    std::set<std::string> names;
    for (const auto* rank : at) {
      for (const auto& [name, v] : *(rank->steps[s].*c.state)) names.insert(name);
    }
    std::vector<std::string> differ;
    std::optional<ProtocolFinding> first;
    for (const auto& name : names) {
      if (changing.contains(name)) continue;
      std::vector<const nlohmann::json*> values;
      for (const auto* rank : at) {
        const auto& state = *(rank->steps[s].*c.state);
        const auto it = state.find(name);
        values.push_back(it == state.end() ? nullptr : &it->second);
      }
      // the ranks grouped by value; the largest group (the lowest rank's among equals) is what most computed
      std::vector<std::vector<size_t>> groups;
      for (size_t k = 0; k < values.size(); ++k) {
        auto g = std::find_if(groups.begin(), groups.end(), [&](const std::vector<size_t>& g) {
          const auto* a = values[g[0]];
          const auto* b = values[k];
          return a == b || (a != nullptr && b != nullptr && *a == *b);
        });
        if (g == groups.end()) groups.push_back({k});
        else g->push_back(k);
      }
      if (groups.size() < 2 || IsPerRankName(at, values, c.strings_per_rank)) continue;
      differ.push_back(name);
      if (first) continue;
      const auto most = std::max_element(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
        return a.size() < b.size();  // the first of the largest: the lowest rank's group
      });
      size_t odd = 0;  // the lowest rank outside the largest group
      while (std::find(most->begin(), most->end(), odd) != most->end()) ++odd;
      const size_t base = (*most)[0];
      const auto [kind, path] = Describe(name);
      std::string each;
      for (size_t k = 0; k < at.size() && k < 4; ++k) {
        each += fmt::format("{}{} on rank {}", k ? ", " : "", Show(values[k]), at[k]->rank);
      }
      if (at.size() > 4) each += fmt::format(", ... ({} ranks)", at.size());
      Mismatch m;
      m.key = {at[odd]->steps[s].step, c.checkpoint, c.prefix + path, at[odd]->rank};
      m.kind = "rank-divergent";
      m.against = fmt::format("rank {}", at[base]->rank);
      if (values[odd] && values[base] && values[odd]->is_number() && values[base]->is_number()) {
        m.got = values[odd]->get<double>();
        m.want = values[base]->get<double>();
        m.abs_err = std::abs(m.got - m.want);
        m.rel_err = m.want != 0 ? m.abs_err / std::abs(m.want) : INFINITY;
      }
      m.message = fmt::format("{} {} {} is {}", c.differs, kind, path, each);
      first = ProtocolFinding{m, c.pattern, "", 0};
    }
    if (!first) continue;
    if (differ.size() > 1) {
      std::string others;
      for (size_t i = 1; i < differ.size() && i <= 4; ++i) others += (i > 1 ? ", " : "") + Describe(differ[i]).second;
      if (differ.size() > 5) others += ", ...";
      first->mismatch.message += fmt::format(" ({} more setting(s) differ: {})", differ.size() - 1, others);
    }
    first->explanation = first->mismatch.message + c.explanation;
    f->push_back(*first);
    break;  // the first step is the finding; later steps follow from it
  }
  if (checked) out->checked.push_back(c.checked);
}

}  // namespace

namespace {

const StateCheck kLossState{
    &ProtocolStep::loss_state, Checkpoint::kLoss, "loss_fn.", "loss-per-rank", "the loss differs between ranks: its",
    ": each rank computes another loss (a pos_weight or class weights from the rank's own shard, a distillation alpha "
    "or temperature set per rank), so the averaged gradient is no single process's",
    "the loss's settings (the recorder's loss_state: a loss module's attributes and tensors, a loss function's "
    "closure, defaults and globals) the same on every rank at every step",
    true, false};

const StateCheck kModelState{
    &ProtocolStep::model_state, Checkpoint::kForwardBuffers, "model.", "attribute-per-rank",
    "the model differs between ranks: its",
    ": DDP broadcasts parameters and buffers, never plain attributes, so each rank's forward runs another model (a "
    "graph, a mask or a table built from a per-rank seed) and the averaged gradient is no single process's",
    "the model's plain attributes (the recorder's model_state: tensors its submodules hold outside their parameters "
    "and buffers, their plain settings) the same on every rank at every step",
    false, true};

const StateCheck kOutsideParams{
    &ProtocolStep::outside_params, Checkpoint::kParams, "optimizer.", "param-outside-ddp",
    "a parameter the optimizer steps outside DDP's module differs between ranks after the step: its",
    ": DDP all-reduces the gradients of the module it wraps only; a parameter the optimizer holds beside it (a "
    "learnable loss weight, an uncertainty-weighting module) keeps each rank's own gradient, so the ranks' copies "
    "part at their first step",
    "the parameters the optimizer steps outside DDP's module (the recorder's outside_params) the same on every rank "
    "after every step",
    false, false};

const StateCheck kOptimizerSettings{
    &ProtocolStep::optimizer_settings, Checkpoint::kLr, "optimizer.", "optimizer-settings-per-rank",
    "the optimizer differs between ranks at the step: its",
    ": each rank steps its parameters with other hyper-parameters (a weight decay, momentum or betas set per rank, "
    "or changed on one rank), so the ranks' parameters part although their gradients are averaged",
    "each param group's hyper-parameters but the lr (weight decay, momentum, betas, eps: the recorder's groups) the "
    "same on every rank at every step",
    false, false};

}  // namespace

void CheckStatesAgree(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  for (const StateCheck* c : {&kLossState, &kModelState, &kOutsideParams, &kOptimizerSettings}) CheckState(r, *c, out, f);
}

}  // namespace ddpcheck::core
