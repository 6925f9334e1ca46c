// harness/gpu.h's RunGpuMatrix: the GPU report, every row a pair of harness::Check runs (against the fp64
// reference, against the CPU world) plus run-to-run determinism between them.
#include <algorithm>

#include <fmt/format.h>

#include "core/compare.h"
#include "harness/check.h"
#include "harness/gpu.h"
#include "real/device.h"
#include "real/world.h"

namespace ddpcheck::harness {

namespace {

bool SameTraces(const core::Trace& a, const core::Trace& b) {
  if (a.records().size() != b.records().size()) return false;
  for (const auto& [key, t] : a.records()) {
    const core::Tensor* o = b.Find(key);
    if (!o || !core::BitwiseEqual(t, *o)) return false;
  }
  return true;
}

// Per checkpoint the comparison's statistics; *worst: the row's summary over the checkpoints, the largest error
// relative to the reference's scale (RunReport::CheckpointSummary::max_scaled_err: |got - reference| over the
// largest |reference| at that step and checkpoint, so values near zero do not inflate it, nor a GradScaler's
// 65536x scaled gradients), the largest fraction of the budget used, and the largest ULP distance.
struct Worst {
  double scaled = 0, used = 0, ulps = 0;
  std::string scaled_at;  // the checkpoint of `scaled`
};

nlohmann::json StatsJson(const core::RunReport& r, Worst* worst) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, st] : r.result.stats) {
    j[name] = {{"compared", st.compared}, {"failed", st.failed}, {"max_abs", st.max_abs},
               {"max_rel", st.max_rel},   {"max_ulps", st.max_ulps}};
    worst->ulps = std::max(worst->ulps, st.max_ulps);
  }
  for (const auto& [name, sum] : r.checkpoint_summary) {
    if (!j.contains(name)) j[name] = nlohmann::json::object();
    j[name]["max_scaled_err"] = sum.max_scaled_err;
    j[name]["max_budget_used"] = sum.max_budget_used;
    if (sum.max_scaled_err > worst->scaled) worst->scaled = sum.max_scaled_err, worst->scaled_at = name;
    worst->used = std::max(worst->used, sum.max_budget_used);
  }
  return j;
}

struct Row {
  nlohmann::json json;
  std::string markdown;
  bool ok = true;
};

Row RunRow(const core::Scenario& base, const std::string& backend, const std::string& math_name, int world,
           std::chrono::milliseconds timeout) {
  Row row;
  row.json = {{"scenario", base.name}, {"backend", backend}, {"math", math_name}, {"world", world}};
  auto skip = [&](const std::string& why) {
    row.json["status"] = "skipped: " + why;
    row.markdown = fmt::format("| {} | {} | {} | {} | skipped: {} | | | | | | |\n", base.name, backend, math_name,
                               world, why);
    return row;
  };
  core::Scenario s = base;
  s.world = world;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = math_name == "fp16-amp" || math_name == "bf16-amp";
  if (s.amp.enabled) s.amp.dtype = math_name == "bf16-amp" ? "bf16" : "fp16";
  core::Status st = core::ValidateScenario(s);
  if (!st.ok()) return skip(st.message());
  CheckOptions o;
  o.got.kind = backend == "hybrid" ? SourceKind::kHybrid : SourceKind::kGpu;
  o.tf32 = math_name == "tf32";
  o.timeout = timeout;
  o.run_id = fmt::format("gpu-report-{}-{}-{}-{}", base.name, backend, math_name, world);
  o.oracle_precision = core::DType::kFloat64;
  core::RunReport vs_ref, vs_sim;
  core::Trace gpu1, gpu2;
  st = Check(s, o, &vs_ref, &gpu1);
  if (st.ok()) {
    o.oracle_precision.reset();
    o.want = Source{SourceKind::kSim, ""};
    o.run_id += "-b";
    st = Check(s, o, &vs_sim, &gpu2);
  }
  if (!st.ok()) {
    row.ok = false;
    row.json["status"] = "error: " + st.message();
    row.markdown = fmt::format("| {} | {} | {} | {} | error: {} | | | | | | FAILED |\n", base.name, backend,
                               math_name, world, st.message());
    return row;
  }
  const bool deterministic = SameTraces(gpu1, gpu2) && SameTraces(gpu2, gpu1);
  Worst ref, sim;
  row.json["status"] = "ran";
  row.json["vs_reference_fp64"] = StatsJson(vs_ref, &ref);
  row.json["vs_sim"] = StatsJson(vs_sim, &sim);
  row.json["pass_vs_reference_fp64"] = vs_ref.pass();
  row.json["pass_vs_sim"] = vs_sim.pass();
  row.json["deterministic"] = deterministic;
  row.json["tolerance"] = vs_ref.result.derivation;
  if (vs_ref.result.first) row.json["first_divergence_vs_reference"] = core::DescribeMismatch(*vs_ref.result.first);
  if (vs_ref.diagnosis) row.json["diagnosis"] = vs_ref.diagnosis->pattern;
  row.ok = vs_ref.pass() && vs_sim.pass() && deterministic;
  row.markdown = fmt::format("| {} | {} | {} | {} | {:.3g}{} | {:.3g} | {:.3g} | {:.3g} | {:.3g} | {} | {} |\n",
                             base.name, backend, math_name, world, ref.scaled,
                             ref.scaled_at.empty() ? "" : " (" + ref.scaled_at + ")", ref.used, ref.ulps, sim.scaled,
                             sim.used, deterministic ? "yes" : "NO", row.ok ? "OK" : "FAILED");
  return row;
}

}  // namespace

core::Status RunGpuMatrix(const GpuMatrixOptions& opts, nlohmann::json* json, std::string* markdown) {
  DDPCHECK_RETURN_IF_ERROR(real::RequireDevice());
  const real::Provenance prov = real::GetProvenance();
  nlohmann::json rows = nlohmann::json::array();
  std::string table =
      "| scenario | backend | math | W | error vs fp64 (where) | budget used vs fp64 | max ULP vs fp64 | error vs "
      "sim | budget used vs sim | deterministic | verdict (ranks bitwise equal, vs fp64, vs sim) |\n"
      "| | | | ranks | max \\|err\\| / max \\|ref\\| of a checkpoint | max \\|err\\| / budget | ULP (of the math "
      "type) | as vs fp64 | as vs fp64 | run to run | |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  bool all_ok = true;
  for (const core::Scenario& s : opts.scenarios) {
    for (const std::string& math : opts.maths) {
      real::MathMode m;
      if (!real::ParseMathMode(math, &m) || m == real::MathMode::kFp64) {
        return core::Status::Invalid("--math: expected fp32, tf32, fp16-amp or bf16-amp, got '" + math + "'");
      }
      for (const std::string& backend : opts.backends) {
        if (backend != "real" && backend != "hybrid") {
          return core::Status::Invalid("--backend: expected real or hybrid, got '" + backend + "'");
        }
        const int max_world = backend == "real" ? prov.devices : opts.max_hybrid_world;
        for (int w : {1, 2, 4, 8}) {
          if (w > max_world || (backend == "hybrid" && w == 1)) continue;
          Row row = RunRow(s, backend, math, w, opts.timeout);
          all_ok = all_ok && row.ok;
          rows.push_back(row.json);
          table += row.markdown;
        }
      }
    }
  }
  *json = {{"format", "ddpcheck-gpu-report"},
           {"version", 1},
           {"provenance", core::Provenance({{"gpu", real::ProvenanceJson(prov)}})},
           {"rows", rows},
           {"verdict", all_ok ? "OK" : "FAILED"}};
  *markdown = fmt::format("# ddpcheck GPU report\n\n{}\n\n{}\nVerdict: **{}**\n", real::ProvenanceLine(prov), table,
                          all_ok ? "OK" : "FAILED");
  return core::Status::Ok();
}

}  // namespace ddpcheck::harness
