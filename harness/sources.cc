#include "harness/sources.h"

#include "core/finite.h"

#include "core/faults.h"
#include "core/train_loop.h"
#include "harness/gpu.h"
#include "reference/trainer.h"
#include "sim/world.h"

namespace ddpcheck::harness {

std::string SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kReference: return "reference";
    case SourceKind::kSim: return "sim";
    case SourceKind::kGpu: return "real";
    case SourceKind::kHybrid: return "hybrid";
    case SourceKind::kTorchDump: return "torch dump";
    case SourceKind::kStoredTrace: return "stored trace";
  }
  return "?";
}

std::optional<core::Scenario> ScenarioFromMeta(const core::Trace& trace) {
  if (!trace.meta.contains("scenario_spec")) return std::nullopt;
  core::Scenario s;
  if (!core::ParseScenario(trace.meta["scenario_spec"], "trace metadata", ".", &s).ok()) return std::nullopt;
  if (!core::ValidateScenario(s).ok()) return std::nullopt;
  return s;
}

void StampScenario(const core::Scenario& unmaterialised, core::Trace* trace) {
  trace->meta["scenario_spec"] = core::ScenarioToJson(unmaterialised);
}

core::Status Produce(const Source& src, const core::Scenario* s, const CheckOptions& opts, Produced* out) {
  const bool needs_scenario =
      src.kind == SourceKind::kReference || src.kind == SourceKind::kSim || src.kind == SourceKind::kGpu ||
      src.kind == SourceKind::kHybrid;
  if (needs_scenario && !s) {
    return core::Status::Invalid("a " + SourceKindName(src.kind) + " run needs a scenario");
  }
  switch (src.kind) {
    case SourceKind::kReference:
      out->name = "reference";
      return ref::RunReference(core::OracleScenario(*s), &out->trace);
    case SourceKind::kSim: {
      sim::SimOptions so;
      so.comm = opts.comm;
      so.timeout = opts.timeout;
      so.run_id = opts.run_id;
      so.gloo_host = opts.gloo_host;
      so.gloo_transport = opts.gloo_transport;
      so.progress = opts.progress;
      so.record_bucket_contents = !opts.dump_trace.empty();  // only a written trace shows them
      out->name = "sim (" + opts.comm + ")";
      out->provenance["backend"] = "sim/" + opts.comm;
      if (opts.comm == "gloo") out->provenance["gloo_transport"] = opts.gloo_transport == "tcp" ? "tcp" : "in-process";
      core::Status finding;  // also recorded as the trace's events, which Compare reads
      return sim::RunSim(*s, so, &out->trace, &finding);
    }
    case SourceKind::kGpu:
    case SourceKind::kHybrid: {
      GpuWorldOptions go;
      go.hybrid = src.kind == SourceKind::kHybrid;
      go.tf32 = opts.tf32;
      go.timeout = opts.timeout.count() > 0 ? opts.timeout : std::chrono::milliseconds(s->ddp.timeout_ms);
      go.run_id = opts.run_id;
      return RunGpuWorld(*s, go, &out->trace, &out->name, &out->provenance);
    }
    case SourceKind::kTorchDump: {
      core::TorchDump dump;
      DDPCHECK_RETURN_IF_ERROR(core::ReadTorchDump(src.path, &dump));
      out->name = "torch (recorded)";
      out->provenance["backend"] = "torch " + dump.ranks[0].index.value("torch_version", "?");
      out->provenance["dump"] = src.path;
      out->trace = dump.trace;
      // The frame of a report without a scenario (a dump the replay cannot rebuild) comes from these.
      out->trace.meta["world"] = static_cast<int>(dump.ranks.size());
      out->trace.meta["precision"] = dump.ranks[0].index.value("dtype", std::string("float32"));
      out->trace.meta["scenario"] = dump.ranks[0].index.value("module_type", std::string("torch run")) + " (" +
                                    src.path + ")";
      out->scenario = dump.scenario;
      // The protocol check (any nn.Module: sampler, buckets, mean, single-process gradient, lr, optimizer) is
      // a pure function of the records: the whole verdict of a dump that cannot be replayed.
      core::ProtocolRecords records;
      DDPCHECK_RETURN_IF_ERROR(core::LoadProtocolRecords(dump, &records));
      out->protocol = core::CheckProtocol(records);
      out->dump = std::move(dump);
      return core::Status::Ok();
    }
    case SourceKind::kStoredTrace:
      out->name = src.path;
      DDPCHECK_RETURN_IF_ERROR(core::Trace::Read(src.path, &out->trace));
      // What frames the comparison: a trace written by --dump-trace records both (QA round 16: one without was
      // read as W=1, float64, and passed).
      for (const char* k : {"world", "precision"}) {
        if (!out->trace.meta.contains(k)) {
          return core::Status::Invalid(src.path + "/index.json: /meta/" + k + ": missing; a trace written by "
                                       "--dump-trace records its world and precision (write it again)");
        }
      }
      // NaN/inf recorded: a finding (exit 1), never a PASS (NaN against the same NaN would compare equal).
      DDPCHECK_RETURN_IF_ERROR(core::CheckFinite(out->trace, src.path));
      out->scenario = ScenarioFromMeta(out->trace);
      return core::Status::Ok();
  }
  return core::Status::Invalid("unknown source");
}

}  // namespace ddpcheck::harness
