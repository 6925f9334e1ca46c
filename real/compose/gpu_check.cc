#include "real/compose/gpu_check.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/compare.h"
#include "core/diagnose.h"
#include "core/fault_spec.h"
#include "core/train_loop.h"
#include "real/compose/hybrid_gloo.h"
#include "real/compose/rank_setup_ref.h"
#include "real/device.h"
#include "real/world.h"
#include "reference/trainer.h"
#include "sim/check.h"
#include "sim/world.h"

namespace ddpcheck::real {

namespace {

RealOptions OptionsFor(const std::string& backend, bool tf32, std::chrono::milliseconds timeout, int world,
                       const std::string& run_id) {
  RealOptions ro;
  ro.tf32 = tf32;
  ro.timeout = timeout;
  ro.run_id = run_id;
  ro = WithReferenceSetup(ro);
  if (backend == "hybrid") ro = WithGlooHybrid(ro, world);
  return ro;
}

// The tolerance of a GPU run: derived as for the CPU world, from the unit roundoff of the GEMMs' inputs
// (TF32 and fp16 keep 10 mantissa bits, bf16 7). Bitwise only for exact scenarios in fp32/fp64.
core::TolerancePolicy GpuPolicy(const core::Scenario& s, MathMode math) {
  core::TolerancePolicy p = core::PolicyFor(s);
  p.precision = MathModeRoundoffType(math);
  if (math != MathMode::kFp32 && math != MathMode::kFp64) p.exact = false;
  return p;
}

}  // namespace

core::Status RunGpuCheck(core::Scenario s, const GpuCheckOptions& opts, core::RunReport* report,
                         core::Trace* gpu_trace) {
  DDPCHECK_RETURN_IF_ERROR(CheckModelRunsOnGpu(s));
  DDPCHECK_RETURN_IF_ERROR(RequireDevice());
  if (opts.backend != "real" && opts.backend != "hybrid") {
    return core::Status::Invalid("--backend: expected real or hybrid, got '" + opts.backend + "'");
  }
  DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&s));
  MathMode math;
  DDPCHECK_RETURN_IF_ERROR(MathModeFor(s, opts.tf32, &math));
  const core::TolerancePolicy policy = GpuPolicy(s, math);
  core::Trace ref;
  DDPCHECK_RETURN_IF_ERROR(ref::RunReference(s, &ref));
  if (!opts.dump_reference.empty()) DDPCHECK_RETURN_IF_ERROR(ref.Write(opts.dump_reference));

  const RealOptions ro = OptionsFor(opts.backend, opts.tf32, opts.timeout, s.world, "gpu-run");
  core::Trace got;
  core::Status finding;
  DDPCHECK_RETURN_IF_ERROR(RunReal(s, ro, &got, &finding));
  if (!opts.dump_trace.empty()) DDPCHECK_RETURN_IF_ERROR(got.Write(opts.dump_trace));

  report->scenario = s.name;
  report->world = s.world;
  report->precision = s.precision;
  report->backend = opts.backend == "real" ? "real (nccl, " + MathModeName(math) + ")"
                                           : "hybrid (cuda + gloo, " + MathModeName(math) + ")";
  report->against = "reference";
  for (const auto& f : s.faults) report->faults.push_back(core::FaultSpecString(f));
  report->provenance = core::Provenance({{"backend", got.meta.value("backend", "real")},
                                         {"world", s.world},
                                         {"precision", core::DTypeName(s.precision)},
                                         {"math", MathModeName(math)},
                                         {"scenario", s.name},
                                         {"gpu", ProvenanceJson(GetProvenance())}});
  report->result = sim::CompareRun(got, ref, policy);
  report->events = got.events();
  core::FillSeries(got, report);
  core::FillDivergenceMap(got, ref, policy, report);
  report->diagnosis = core::Diagnose(s, got, ref, report->result);
  if (gpu_trace) *gpu_trace = std::move(got);
  return core::Status::Ok();
}

namespace {

bool SameTraces(const core::Trace& a, const core::Trace& b) {
  if (a.records().size() != b.records().size()) return false;
  for (const auto& [key, t] : a.records()) {
    const core::Tensor* o = b.Find(key);
    if (!o || !core::BitwiseEqual(t, *o)) return false;
  }
  return true;
}

nlohmann::json StatsJson(const core::CompareResult& r, double* max_abs, double* max_rel, double* max_ulps) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, st] : r.stats) {
    j[name] = {{"compared", st.compared}, {"failed", st.failed}, {"max_abs", st.max_abs},
               {"max_rel", st.max_rel},   {"max_ulps", st.max_ulps}};
    *max_abs = std::max(*max_abs, st.max_abs);
    *max_rel = std::max(*max_rel, st.max_rel);
    *max_ulps = std::max(*max_ulps, st.max_ulps);
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
  const bool tf32 = math_name == "tf32";
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) return skip(st.message());
  MathMode math;
  if (!MathModeFor(s, tf32, &math).ok()) return skip("math mode");
  core::Scenario s64 = s;
  s64.precision = core::DType::kFloat64;
  s64.amp.enabled = false;
  core::Trace ref64, cpu, gpu1, gpu2;
  if (!(st = ref::RunReference(s64, &ref64)).ok()) return skip("reference: " + st.message());
  sim::SimOptions so;
  so.timeout = timeout;
  core::Status sim_finding;
  if (!(st = sim::RunSim(s, so, &cpu, &sim_finding)).ok()) return skip("sim: " + st.message());
  const std::string run_id = fmt::format("gpu-report-{}-{}-{}-{}", base.name, backend, math_name, world);
  core::Status f1, f2;
  st = RunReal(s, OptionsFor(backend, tf32, timeout, world, run_id + "-a"), &gpu1, &f1);
  if (st.ok()) st = RunReal(s, OptionsFor(backend, tf32, timeout, world, run_id + "-b"), &gpu2, &f2);
  if (!st.ok()) {
    row.ok = false;
    row.json["status"] = "error: " + st.message();
    row.markdown = fmt::format("| {} | {} | {} | {} | error: {} | | | | | | FAILED |\n", base.name, backend,
                               math_name, world, st.message());
    return row;
  }
  const core::TolerancePolicy policy = GpuPolicy(s, math);
  const core::CompareResult vs_ref = core::CompareTraces(gpu1, ref64, policy);
  const core::CompareResult vs_sim = core::CompareTraces(gpu1, cpu, policy);
  const core::CompareResult ranks = core::CheckRankInvariants(gpu1);
  const core::CompareResult events = core::CheckEvents(gpu1);
  const bool deterministic = SameTraces(gpu1, gpu2) && SameTraces(gpu2, gpu1);
  double ra = 0, rr = 0, ru = 0, sa = 0, sr = 0, su = 0;
  row.json["status"] = "ran";
  row.json["vs_reference_fp64"] = StatsJson(vs_ref, &ra, &rr, &ru);
  row.json["vs_sim"] = StatsJson(vs_sim, &sa, &sr, &su);
  row.json["pass_vs_reference_fp64"] = vs_ref.pass;
  row.json["pass_vs_sim"] = vs_sim.pass;
  row.json["deterministic"] = deterministic;
  row.json["rank_consistent"] = ranks.pass;
  row.json["events_clean"] = events.pass;
  row.json["tolerance"] = policy.Derivation();
  if (vs_ref.first) row.json["first_divergence_vs_reference"] = core::DescribeMismatch(*vs_ref.first);
  row.ok = vs_ref.pass && vs_sim.pass && deterministic && ranks.pass && events.pass;
  row.markdown = fmt::format("| {} | {} | {} | {} | {:.3g} | {:.3g} | {:.3g} | {:.3g} | {} | {} | {} |\n", base.name,
                             backend, math_name, world, ra, rr, ru, sa, deterministic ? "yes" : "NO",
                             ranks.pass ? "yes" : "NO", row.ok ? "OK" : "FAILED");
  return row;
}

}  // namespace

core::Status RunGpuMatrix(const MatrixOptions& opts, nlohmann::json* json, std::string* markdown) {
  DDPCHECK_RETURN_IF_ERROR(RequireDevice());
  const Provenance prov = GetProvenance();
  nlohmann::json rows = nlohmann::json::array();
  std::string table =
      "| scenario | backend | math | W | max abs vs fp64 | max rel vs fp64 | max ULP vs fp64 | max abs vs sim | "
      "deterministic | ranks bitwise equal | verdict |\n"
      "| | | | ranks | abs | rel | ULP (of the math type) | abs | run to run | after every step | |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  bool all_ok = true;
  for (const core::Scenario& s : opts.scenarios) {
    for (const std::string& math : opts.maths) {
      MathMode m;
      if (!ParseMathMode(math, &m) || m == MathMode::kFp64) {
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
           {"provenance", core::Provenance({{"gpu", ProvenanceJson(prov)}})},
           {"rows", rows},
           {"verdict", all_ok ? "OK" : "FAILED"}};
  *markdown = fmt::format("# ddpcheck GPU report\n\n{}\n\n{}\nVerdict: **{}**\n", ProvenanceLine(prov), table,
                          all_ok ? "OK" : "FAILED");
  return core::Status::Ok();
}

}  // namespace ddpcheck::real
