// `ddpcheck randperm`: torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU, as a JSON
// array (contract: docs/cli.md).
#include <charconv>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/randperm.h"
#include "core/scenario.h"

namespace ddpcheck::cli {
namespace {

using core::Status;

struct Args {
  std::string n, seed = "0", algo = "torch1.13";
};

Status Run(const Args& a) {
  int64_t n = 0;
  const char* end = a.n.data() + a.n.size();
  auto [ptr, ec] = std::from_chars(a.n.data(), end, n);
  if (a.n.empty() || ec != std::errc() || ptr != end || n < 0) {
    return Status::Invalid("--n: '" + a.n + "' is not a non-negative integer (int64)");
  }
  if (n > core::kMaxSamples) {
    return Status::Invalid("--n: must be at most " + std::to_string(core::kMaxSamples) + " (ddpcheck's limit on "
                           "samples), got " + a.n);
  }
  uint64_t seed = 0;
  bool negative = false;
  DDPCHECK_RETURN_IF_ERROR(core::ParseTorchSeed(a.seed, &seed, &negative).Prefixed("--seed"));
  core::RandpermAlgo algo;
  if (a.algo == "torch1.13") {
    algo = core::RandpermAlgo::kForward32;
  } else if (a.algo == "torch2.7") {
    algo = core::RandpermAlgo::kTorch27;
  } else {
    return Status::Invalid("--algo: '" + a.algo + "' is not torch1.13 or torch2.7");
  }
  const std::vector<int64_t> perm = core::Randperm(n, seed, algo);
  std::string out = "[";
  for (size_t i = 0; i < perm.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(perm[i]);
  }
  std::cout << out << "]\n";
  return Status::Ok();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "randperm",
      "Print torch.randperm(n, generator=torch.Generator().manual_seed(seed)) (CPU) as a JSON array.\n"
      "  The seed is any integer torch accepts, [-2^63, 2^64-1]; only its low 32 bits matter.\n"
      "  example: ddpcheck randperm --n 10 --seed 42   ->  [2, 6, 1, 8, 4, 5, 0, 9, 3, 7]");
  sub->add_option("--n", args->n, "Length of the permutation (>= 0)")->required();
  sub->add_option("--seed", args->seed, "Generator seed (default 0; -1 means 2^64-1, as torch)");
  sub->add_option("--algo", args->algo,
                  "torch1.13 (default; also every torch < 2.7, and 2.7+ below n = 214748364) or torch2.7 "
                  "(the 64-bit inside-out shuffle for n >= 214748364)");
  return {sub, [args] {
            Status st = Run(*args);
            return st.ok() ? 0 : Fail("randperm", st);
          }};
}

DDPCHECK_REGISTER_COMMAND("randperm", Setup);

}  // namespace
}  // namespace ddpcheck::cli
