// `ddpcheck sampler`: every rank's indices of torch's DistributedSampler for one epoch, as JSON
// {"num_samples": n, "total_size": t, "ranks": [[...], ...]} (contract: docs/cli.md).
#include <charconv>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/sampler.h"
#include "core/scenario.h"

namespace ddpcheck::cli {
namespace {

using core::Status;

struct Args {
  std::string len, world, seed = "0", epoch = "0";
  bool no_shuffle = false, drop_last = false;
};

// A whole-string base-10 int64.
Status ParseInt(const std::string& flag, const std::string& text, int64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return Status::Invalid(flag + ": '" + text + "' is not an integer (int64)");
  }
  return Status::Ok();
}

Status Run(const Args& a) {
  core::SamplerConfig c;
  DDPCHECK_RETURN_IF_ERROR(ParseInt("--len", a.len, &c.n));
  if (c.n < 0 || c.n > core::kMaxSamples) {
    return Status::Invalid("--len: must be in [0, " + std::to_string(core::kMaxSamples) + "] (ddpcheck's limit on "
                           "samples), got " + a.len);
  }
  int64_t world = 0;
  DDPCHECK_RETURN_IF_ERROR(ParseInt("--world", a.world, &world));
  if (world < 1 || world > 1 << 20) {
    return Status::Invalid("--world: must be in [1, 1048576], got " + a.world +
                           " (torch: Invalid rank 0, rank should be in the interval [0, " +
                           std::to_string(world - 1) + "])");
  }
  c.world = static_cast<int>(world);
  DDPCHECK_RETURN_IF_ERROR(core::ParseTorchSeed(a.seed, &c.seed, &c.negative_seed).Prefixed("--seed"));
  DDPCHECK_RETURN_IF_ERROR(ParseInt("--epoch", a.epoch, &c.epoch));
  c.shuffle = !a.no_shuffle;
  c.drop_last = a.drop_last;
  std::vector<std::vector<int64_t>> ranks;
  DDPCHECK_RETURN_IF_ERROR(core::AllShardIndices(c, &ranks));
  nlohmann::ordered_json j = {
      {"num_samples", core::NumSamples(c)}, {"total_size", core::TotalSize(c)}, {"ranks", ranks}};
  std::cout << j.dump() << "\n";
  return Status::Ok();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "sampler",
      "Print each rank's indices from torch's DistributedSampler for one epoch, as JSON\n"
      "  {\"num_samples\": n, \"total_size\": t, \"ranks\": [[rank 0...], [rank 1...], ...]}.\n"
      "  example: ddpcheck sampler --len 10 --world 3 --seed 0 --epoch 0\n"
      "    -> {\"num_samples\":4,\"total_size\":12,\"ranks\":[[4,5,0,2],[1,3,8,4],[7,9,6,1]]}");
  sub->add_option("--len", args->len, "len(dataset) (>= 0)")->required();
  sub->add_option("--world", args->world, "num_replicas (>= 1)")->required();
  sub->add_option("--seed", args->seed, "Sampler seed (default 0; any integer in [-2^63, 2^64-1])");
  sub->add_option("--epoch", args->epoch, "The value passed to set_epoch (default 0; may be negative)");
  sub->add_flag("--no-shuffle", args->no_shuffle, "shuffle=False");
  sub->add_flag("--drop-last", args->drop_last, "drop_last=True");
  return {sub, [args] {
            Status st = Run(*args);
            return st.ok() ? 0 : Fail("sampler", st);
          }};
}

DDPCHECK_REGISTER_COMMAND("sampler", Setup);

}  // namespace
}  // namespace ddpcheck::cli
