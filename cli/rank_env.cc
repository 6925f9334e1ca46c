#include "cli/rank_env.h"

#include "core/scenario.h"

#include <gloo/rendezvous/store.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>


namespace ddpcheck::cli {

namespace {

struct VarSet {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;
};
constexpr VarSet kVarSets[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

std::string Get(const GetEnvFn& getenv_fn, const char* name) {
  const char* v = getenv_fn(name);
  return v ? v : "";
}

core::Status ParseInt(const GetEnvFn& getenv_fn, const char* name, int* out) {
  const std::string v = Get(getenv_fn, name);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 0 || n > 1 << 20) {
    return core::Status::Invalid(std::string(name) + ": expected a non-negative integer, got '" + v + "'");
  }
  *out = static_cast<int>(n);
  return core::Status::Ok();
}

const char* RealGetEnv(const char* name) { return std::getenv(name); }

// Ends this rank within a second of its launcher's death (torchrun, srun, a shell script: whatever started
// it; `ddpcheck launch` also sets PR_SET_PDEATHSIG): the parent changes when the process is re-parented.
// DDPCHECK_NO_PARENT_WATCH=1 turns it off (a rank deliberately left running by a launcher that exits).
void WatchLauncher(int rank) {
  const pid_t parent = getppid();
  const char* off = std::getenv("DDPCHECK_NO_PARENT_WATCH");
  if (parent <= 1 || (off && std::string(off) == "1")) return;
  std::thread([parent, rank] {
    while (getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "ddpcheck run: rank %d: its launcher (process %d) ended; this rank ends too\n", rank,
                 static_cast<int>(parent));
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

core::Status DetectRankEnv(const GetEnvFn& getenv_fn, std::optional<RankEnv>* out) {
  out->reset();
  for (const VarSet& v : kVarSets) {
    const bool has_rank = !Get(getenv_fn, v.rank).empty();
    const bool has_world = !Get(getenv_fn, v.world).empty();
    if (!has_rank && !has_world) continue;
    if (!has_rank || !has_world) {
      return core::Status::Invalid(std::string(v.source) + " variables incomplete: " + v.rank + " and " + v.world +
                                   " must both be set");
    }
    RankEnv env;
    env.source = v.source;
    DDPCHECK_RETURN_IF_ERROR(ParseInt(getenv_fn, v.rank, &env.rank));
    DDPCHECK_RETURN_IF_ERROR(ParseInt(getenv_fn, v.world, &env.world));
    if (!Get(getenv_fn, v.local_rank).empty())
      DDPCHECK_RETURN_IF_ERROR(ParseInt(getenv_fn, v.local_rank, &env.local_rank));
    if (env.world > core::kMaxWorld) {
      return core::Status::Invalid(std::string(v.world) + "=" + std::to_string(env.world) + ": ddpcheck runs at most " +
                                   std::to_string(core::kMaxWorld) + " ranks");
    }
    if (env.world < 1 || env.rank >= env.world) {
      return core::Status::Invalid(std::string(v.rank) + "=" + std::to_string(env.rank) + " is not a rank of " +
                                   v.world + "=" + std::to_string(env.world));
    }
    *out = env;
    return core::Status::Ok();
  }
  return core::Status::Ok();
}

std::string DeriveRunId(const std::string& flag, const GetEnvFn& getenv_fn) {
  std::string id = flag;
  if (id.empty()) id = Get(getenv_fn, "DDPCHECK_RUN_ID");
  if (id.empty() && Get(getenv_fn, "TORCHELASTIC_RUN_ID") != "none") id = Get(getenv_fn, "TORCHELASTIC_RUN_ID");
  if (id.empty() && !Get(getenv_fn, "SLURM_JOB_ID").empty()) {
    id = "slurm-" + Get(getenv_fn, "SLURM_JOB_ID") + "." + Get(getenv_fn, "SLURM_STEP_ID");
  }
  if (id.empty() && !Get(getenv_fn, "OMPI_MCA_ess_base_jobid").empty()) {
    id = "ompi-" + Get(getenv_fn, "OMPI_MCA_ess_base_jobid");
  }
  if (id.empty()) id = Get(getenv_fn, "PMIX_NAMESPACE");
  if (id.empty()) id = "ddpcheck";
  for (char& c : id) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) c = '-';
  }
  return id;
}

core::Status DeriveRendezvous(const std::string& flag, const GetEnvFn& getenv_fn, std::string* url) {
  *url = flag;
  if (url->empty()) *url = Get(getenv_fn, "DDPCHECK_RENDEZVOUS");
  if (url->empty() && !Get(getenv_fn, "DDPCHECK_STORE").empty()) *url = "file://" + Get(getenv_fn, "DDPCHECK_STORE");
  if (url->empty()) {
    return core::Status::Invalid(
        "ranks as processes need a rendezvous store: --rendezvous redis://HOST:PORT | file:///shared/dir, or "
        "DDPCHECK_RENDEZVOUS, or DDPCHECK_STORE=/shared/dir (MASTER_ADDR/MASTER_PORT name torchrun's own store and "
        "are not used; see docs/multi-host.md)");
  }
  return core::Status::Ok();
}

void RankFlags::Add(CLI::App* app) {
  app->add_option("--rendezvous", rendezvous,
                  "Ranks as processes (under torchrun, mpirun, srun, ddpcheck launch): the store where they meet, "
                  "redis://HOST:PORT or file:///shared/dir (default $DDPCHECK_RENDEZVOUS, file://$DDPCHECK_STORE)");
  app->add_option("--run-id", run_id,
                  "Ranks as processes: namespace of this run's keys in the store (default $DDPCHECK_RUN_ID or the "
                  "launcher's job id)");
  app->add_option("--gloo-host", gloo_host,
                  "Ranks as processes: address this rank's Gloo TCP device binds and advertises (default "
                  "$DDPCHECK_GLOO_HOST, else 127.0.0.1)");
}

bool RankFlags::Active() const {
  std::optional<RankEnv> env;
  return !DetectRankEnv(RealGetEnv, &env).ok() || env.has_value() || !rendezvous.empty();
}

core::Status RunCheckAsRank(ScenarioFlags scenario, const RankFlags& flags, harness::CheckOptions opts,
                            core::RunReport* report, bool* reporter) {
  *reporter = false;
  std::optional<RankEnv> env;
  DDPCHECK_RETURN_IF_ERROR(DetectRankEnv(RealGetEnv, &env));
  if (!env) {
    return core::Status::Invalid(
        "--rendezvous given but no rank: set RANK and WORLD_SIZE (or run under "
        "ddpcheck launch, torchrun, mpirun or srun)");
  }
  if (scenario.world && *scenario.world != env->world) {
    return core::Status::Invalid("--world " + std::to_string(*scenario.world) + " disagrees with the launcher's " +
                                 "world size " + std::to_string(env->world) + " (" + env->source + ")");
  }
  scenario.world = env->world;
  WatchLauncher(env->rank);
  core::Scenario s;
  DDPCHECK_RETURN_IF_ERROR(scenario.Resolve(&s));
  // 0: the scenario's ddp.timeout_ms, as RunSim resolves it; the store connection and rank 0's wait for the
  // shards need the number too.
  if (opts.timeout.count() <= 0) opts.timeout = std::chrono::milliseconds(s.ddp.timeout_ms);
  std::string url;
  DDPCHECK_RETURN_IF_ERROR(DeriveRendezvous(flags.rendezvous, RealGetEnv, &url));
  opts.run_id = DeriveRunId(flags.run_id, RealGetEnv);
  opts.gloo_host = flags.gloo_host;
  core::Status st = harness::CheckAsRank(std::move(s), opts, env->rank, url, report, reporter);
  if (!st.ok()) {
    return core::Status(st.code(), "rank " + std::to_string(env->rank) + " of " + std::to_string(env->world) + " (" +
                                       env->source + ", run '" + opts.run_id + "'): " + st.message());
  }
  return st;
}

}  // namespace ddpcheck::cli
