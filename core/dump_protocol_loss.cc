// The loss half of CheckProtocol: a single process computes its loss with one set of settings, so everything that
// parameterises the loss (the recorder's loss_state, taken at every rec.step(): a loss module's plain settings,
// buffers, parameters and tensor attributes, a loss function's closure variables, defaults, globals and partial
// arguments; tools/ddpcheck_torch_protocol.py loss_state) must be the same on every rank at every step. A
// pos_weight or class weights computed from a rank's own shard, or an alpha set per rank, give each rank another
// loss while every gradient still matches its own rank's float64 reference: no other check sees it. Settings that
// change over the steps the same on every rank (a temperature schedule) agree at each step; a rank's own number
// (a closure over `rank`) is no setting. A recording without loss_state (an older recorder, or a loss named by a
// string) is not checked for it.
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
      {"self", "attribute of the bound object"}};
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

// A value every rank holds as its own rank number (a closure over `rank` for y.to(rank)), or a string that is the
// same on every rank once each rank's number in it is left out (a run name "exp-rank1"): no setting of the loss.
bool IsPerRankName(const std::vector<const ProtocolRank*>& at, const std::vector<const nlohmann::json*>& values) {
  bool numbers = true, strings = true;
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

}  // namespace

void CheckLossState(const ProtocolRecords& r, ProtocolResult* out, std::vector<ProtocolFinding>* f) {
  bool checked = false;
  for (size_t s = 0; s < MaxSteps(r); ++s) {
    const auto at = RanksAt(r, s, [](const ProtocolStep& st) { return st.loss_state.has_value(); });
    if (at.size() < 2) continue;
    checked = true;
    std::set<std::string> names;
    for (const auto* rank : at) {
      for (const auto& [name, v] : *rank->steps[s].loss_state) names.insert(name);
    }
    std::vector<std::string> differ;
    std::optional<ProtocolFinding> first;
    for (const auto& name : names) {
      std::vector<const nlohmann::json*> values;
      for (const auto* rank : at) {
        const auto& state = *rank->steps[s].loss_state;
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
      if (groups.size() < 2 || IsPerRankName(at, values)) continue;
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
      m.key = {at[odd]->steps[s].step, Checkpoint::kLoss, "loss_fn." + path, at[odd]->rank};
      m.kind = "rank-divergent";
      m.against = fmt::format("rank {}", at[base]->rank);
      if (values[odd] && values[base] && values[odd]->is_number() && values[base]->is_number()) {
        m.got = values[odd]->get<double>();
        m.want = values[base]->get<double>();
        m.abs_err = std::abs(m.got - m.want);
        m.rel_err = m.want != 0 ? m.abs_err / std::abs(m.want) : INFINITY;
      }
      m.message = fmt::format("the loss differs between ranks: its {} {} is {}", kind, path, each);
      first = ProtocolFinding{m, "loss-per-rank", "", 0};
    }
    if (!first) continue;
    if (differ.size() > 1) {
      std::string others;
      for (size_t i = 1; i < differ.size() && i <= 4; ++i) others += (i > 1 ? ", " : "") + Describe(differ[i]).second;
      if (differ.size() > 5) others += ", ...";
      first->mismatch.message += fmt::format(" ({} more setting(s) differ: {})", differ.size() - 1, others);
    }
    first->explanation = first->mismatch.message +
                         ": each rank computes another loss (a pos_weight or class weights from the rank's own "
                         "shard, a distillation alpha or temperature set per rank), so the averaged gradient is no "
                         "single process's";
    f->push_back(*first);
    break;  // the first step is the finding; later steps follow from it
  }
  if (checked) {
    out->checked.push_back("the loss's settings (the recorder's loss_state: a loss module's attributes and tensors, a "
                           "loss function's closure, defaults and globals) the same on every rank at every step");
  }
}

}  // namespace ddpcheck::core
