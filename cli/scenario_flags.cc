#include "cli/scenario_flags.h"

#include "core/fault_spec.h"

namespace ddpcheck::cli {

void ScenarioFlags::Add(CLI::App* app) {
  app->add_option("scenario", path, "Scenario JSON file (docs/scenario.md); default: the built-in default scenario");
  app->add_option("--world,-w", world, "World size W (ranks)");
  app->add_option("--epochs", epochs, "Number of epochs");
  app->add_option("--steps", steps, "Stop after this many optimizer steps");
  app->add_option("--batch-size", batch_size, "Batch size per rank");
  app->add_option("--precision", precision, "fp64 | fp32");
  app->add_option("--amp", amp,
                  "Mixed precision: fp16 | bf16 (autocast and a GradScaler) | fp16-autocast | bf16-autocast "
                  "(autocast alone, no loss scaling) | off");
  app->add_option("--fault", faults, "Inject a fault NAME[@RANK][:STEP] (repeatable; the 22 names: docs/scenario.md#faults)");
  app->add_flag("--no-faults", no_faults, "Drop the scenario's faults");
}

namespace {

// A flag's integer against its limit, named as the user typed it: "--batch-size: must be in [1, 16777216], got 0".
core::Status FlagIn(const char* flag, const std::optional<int64_t>& v, int64_t lo, int64_t hi) {
  if (!v || (*v >= lo && *v <= hi)) return core::Status::Ok();
  return core::Status::Invalid(std::string(flag) + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                               "], got " + std::to_string(*v));
}

}  // namespace

core::Status ScenarioFlags::Resolve(core::Scenario* out) const {
  // Flags first, before the scenario is loaded, so a bad flag is named as a flag.
  DDPCHECK_RETURN_IF_ERROR(FlagIn("--world", world ? std::optional<int64_t>(*world) : std::nullopt, 1, core::kMaxWorld));
  DDPCHECK_RETURN_IF_ERROR(FlagIn("--epochs", epochs, 1, core::kMaxEpochs));
  DDPCHECK_RETURN_IF_ERROR(FlagIn("--steps", steps, -1, core::kMaxSteps));
  if (steps && *steps == 0) return core::Status::Invalid("--steps: 0 trains no step: give at least 1 (or -1: every step)");
  DDPCHECK_RETURN_IF_ERROR(FlagIn("--batch-size", batch_size, 1, core::kMaxSamples));
  core::Scenario s;
  if (path.empty()) {
    s = core::DefaultScenario();
  } else {
    DDPCHECK_RETURN_IF_ERROR(core::LoadScenario(path, &s));
  }
  if (world) {
    s.world = *world;
    // Per-rank init seeds follow the new world: seeds[r] = seeds[0] + r (a single seed stays shared).
    if (s.init.kind == "seed" && s.init.seeds.size() > 1 && s.init.seeds.size() != static_cast<size_t>(s.world)) {
      const uint64_t base = s.init.seeds[0];
      s.init.seeds.clear();
      for (int r = 0; r < s.world; ++r) s.init.seeds.push_back(base + static_cast<uint64_t>(r));
    }
  }
  if (epochs) s.epochs = *epochs;
  if (steps) s.steps = *steps;
  if (batch_size) s.batch_size = *batch_size;
  if (precision) {
    core::DType d;
    if (!core::ParseDType(*precision, &d) || (d != core::DType::kFloat32 && d != core::DType::kFloat64)) {
      return core::Status::Invalid("--precision: expected fp64 or fp32, got '" + *precision + "'");
    }
    s.precision = d;
  }
  if (amp) {
    if (*amp == "off") {
      s.amp.enabled = false;
    } else if (*amp == "fp16" || *amp == "bf16" || *amp == "fp16-autocast" || *amp == "bf16-autocast") {
      s.amp.enabled = true;
      s.amp.dtype = amp->substr(0, 4);
      s.amp.grad_scaler = amp->size() == 4;
      // AMP keeps fp32 master weights: --amp switches the precision to fp32 unless --precision says otherwise
      // (then validation names the conflict).
      if (!precision) s.precision = core::DType::kFloat32;
    } else {
      return core::Status::Invalid("--amp: expected fp16, bf16, fp16-autocast, bf16-autocast or off, got '" + *amp +
                                   "'");
    }
  }
  if (no_faults) s.faults.clear();
  for (const auto& f : faults) {
    core::FaultSpec spec;
    DDPCHECK_RETURN_IF_ERROR(core::ParseFaultSpec(f, &spec).Prefixed("--fault " + f));
    s.faults.push_back(spec);
  }
  core::Status st = core::ValidateScenario(s);  // (prefixed with the scenario's file)
  if (st.ok()) st = core::CheckTrainsSomeStep(s).Prefixed(s.source.empty() ? "<scenario>" : s.source);
  const std::string where = path.empty() ? "default scenario" : path;
  if (!st.ok()) return st.message().rfind(where, 0) == 0 ? st : st.Prefixed(where);  // (the file named once)
  *out = std::move(s);
  return core::Status::Ok();
}

}  // namespace ddpcheck::cli
