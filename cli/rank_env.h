// One rank of a world whose ranks are processes: who am I (from the launcher's environment), where do the
// ranks meet (the rendezvous store) and under which run id. `ddpcheck run` takes this branch whenever a
// launcher's variables are set; `ddpcheck launch` sets them for its children like torchrun does.
//
// Rank and world, first match wins:
//   RANK, WORLD_SIZE, LOCAL_RANK                       torchrun, `ddpcheck launch`
//   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK           OpenMPI's mpirun
//   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID                MPICH / Intel MPI (Hydra)
//   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID          srun
// Rendezvous: --rendezvous URL, else $DDPCHECK_RENDEZVOUS, else file://$DDPCHECK_STORE; never derived from
// MASTER_ADDR/MASTER_PORT, which name torchrun's own c10d TCPStore (another protocol). See docs/multi-host.md.
// Run id: --run-id, else $DDPCHECK_RUN_ID, else the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID +
// SLURM_STEP_ID, OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE), else "ddpcheck" (a second run on the same store
// then fails at rendezvous, asking for a fresh run id: runs never mix).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>

#include "cli/scenario_flags.h"
#include "core/report.h"
#include "core/status.h"
#include "harness/check.h"

namespace ddpcheck::cli {

using GetEnvFn = std::function<const char*(const char*)>;

struct RankEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string source;  // "torchrun", "openmpi", "mpich", "slurm"
};

// The launcher's rank variables, or nullopt when none is set. Invalid when a set is incomplete or out of range
// (RANK without WORLD_SIZE, rank >= world, not a number).
core::Status DetectRankEnv(const GetEnvFn& getenv_fn, std::optional<RankEnv>* out);
// The run id (see above), made safe for store keys ([A-Za-z0-9._-], others become '-').
std::string DeriveRunId(const std::string& flag, const GetEnvFn& getenv_fn);
// The store URL (see above); Invalid naming the three ways when there is none.
core::Status DeriveRendezvous(const std::string& flag, const GetEnvFn& getenv_fn, std::string* url);

// Flags of `ddpcheck run` for ranks as processes.
struct RankFlags {
  std::string rendezvous;  // file:///dir | redis://host:port
  std::string run_id;
  std::string gloo_host;  // address this rank's Gloo device binds and advertises

  void Add(CLI::App* app);
  // True when this process is one rank of a world of processes (a launcher's variables are set).
  bool Active() const;
};

// Runs this process's rank (world = the launcher's world size; an explicit --world must agree) with `opts`
// (backend, comm, timeout, dumps from `run`'s flags) and, on rank 0, fills *report and sets *reporter.
// Other ranks return their finding, prefixed "rank R of W", or OK.
core::Status RunCheckAsRank(ScenarioFlags scenario, const RankFlags& flags, harness::CheckOptions opts,
                            core::RunReport* report, bool* reporter);

}  // namespace ddpcheck::cli
