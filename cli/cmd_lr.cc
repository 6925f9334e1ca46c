// `ddpcheck lr`: the learning rate of one param group under a chain of torch LR schedulers, as a JSON array
// of epochs + 1 numbers (contract: docs/cli.md).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/lr_scheduler.h"

namespace ddpcheck::cli {
namespace {

using core::Status;

struct Args {
  std::string lr, epochs;
  std::vector<std::string> schedulers;
};

// 17 significant digits: parsing the text as a double gives back the exact value.
std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Status Run(const Args& a) {
  double lr = 0;
  {
    const char* end = a.lr.data() + a.lr.size();
    auto [ptr, ec] = std::from_chars(a.lr.data(), end, lr);
    if (a.lr.empty() || ec != std::errc() || ptr != end || !(lr >= 0) || !std::isfinite(lr)) {
      return Status::Invalid("--lr: '" + a.lr + "' is not a finite number >= 0");
    }
  }
  int64_t epochs = 0;
  {
    const char* end = a.epochs.data() + a.epochs.size();
    auto [ptr, ec] = std::from_chars(a.epochs.data(), end, epochs);
    if (a.epochs.empty() || ec != std::errc() || ptr != end || epochs < 0 || epochs > 100000000) {
      return Status::Invalid("--epochs: '" + a.epochs + "' is not an integer in [0, 100000000]");
    }
  }
  std::vector<core::SchedulerSpec> specs;
  for (const std::string& text : a.schedulers) {
    core::SchedulerSpec s;
    DDPCHECK_RETURN_IF_ERROR(core::ParseSchedulerSpec(text, &s).Prefixed("--scheduler"));
    specs.push_back(s);
  }
  core::LrSchedule sched(lr, specs);
  std::string out = "[" + Number(sched.lr());
  for (int64_t e = 0; e < epochs; ++e) {
    sched.Step();
    out += ", " + Number(sched.lr());
  }
  std::cout << out << "]\n";
  return Status::Ok();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "lr",
      "Print the lr of an SGD param group under torch LR schedulers as a JSON array: element 0 is the lr after\n"
      "  the schedulers are constructed (in the order given), element k after epoch k's scheduler.step() calls\n"
      "  (in the same order). SPEC is TYPE[:key=value,...]:\n"
      "    step:step_size=S[,gamma=0.1]   multistep:milestones=A|B|C[,gamma=0.1]   exponential:gamma=G\n"
      "    cosine:t_max=T[,eta_min=0]     linear[:start_factor=1/3,end_factor=1,total_iters=5]\n"
      "  example: ddpcheck lr --lr 0.01 --epochs 100 --scheduler exponential:gamma=0.9 --scheduler cosine:t_max=50");
  sub->add_option("--lr", args->lr, "The optimizer's initial lr")->required();
  sub->add_option("--epochs", args->epochs, "Number of epochs (scheduler steps)")->required();
  sub->add_option("--scheduler", args->schedulers, "A scheduler SPEC; repeat to chain them")->required();
  return {sub, [args] {
            Status st = Run(*args);
            return st.ok() ? 0 : Fail("lr", st);
          }};
}

DDPCHECK_REGISTER_COMMAND("lr", Setup);

}  // namespace
}  // namespace ddpcheck::cli
