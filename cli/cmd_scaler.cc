// `ddpcheck scaler`: runs torch's GradScaler update rule over a found_inf sequence and prints, per step,
// {"scale": s, "growth_tracker": n, "skipped": bool} after that step's update(). Scales are the doubles equal
// to the float32 values, printed %.17g (exact when parsed as a double).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/grad_scaler.h"

namespace ddpcheck::cli {
namespace {

// The double equal to the float32 scale, %.17g (docs/cli.md: parses back to the exact value); null if not finite
// (only an --init-scale beyond float32's range gets there).
std::string FormatScale(float scale) {
  if (!std::isfinite(scale)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(scale));
  return buf;
}

struct Args {
  std::string found_inf;
  core::GradScalerOptions options;
};

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "scaler",
      "Run the AMP GradScaler scale update over a found_inf sequence ('1' = inf/NaN grads that step: the "
      "optimizer step is skipped); prints a JSON array, one {scale, growth_tracker, skipped} per step.\n"
      "  example: ddpcheck scaler --found-inf 0010000 --growth-interval 3");
  auto args = std::make_shared<Args>();
  sub->add_option("--found-inf", args->found_inf, "one character per step: 0 (finite grads) or 1 (inf/NaN)")
      ->required();
  sub->add_option("--init-scale", args->options.init_scale, "initial scale (stored as float32)")->capture_default_str();
  sub->add_option("--growth-factor", args->options.growth_factor, "must be > 1")->capture_default_str();
  sub->add_option("--backoff-factor", args->options.backoff_factor, "must be < 1")->capture_default_str();
  sub->add_option("--growth-interval", args->options.growth_interval, "clean steps between growths")
      ->capture_default_str();
  return {sub, [args] {
            for (size_t i = 0; i < args->found_inf.size(); ++i) {
              const char c = args->found_inf[i];
              if (c != '0' && c != '1') {
                return Fail("scaler", core::Status::Invalid("--found-inf: character " + std::to_string(i) +
                                                            " is '" + std::string(1, c) + "'; use only 0 and 1"));
              }
            }
            core::GradScaler scaler;
            core::Status st = core::GradScaler::Create(args->options, &scaler);
            if (!st.ok()) return Fail("scaler", st);
            std::string out = "[";
            for (char c : args->found_inf) {
              // One iteration: step() (its implicit unscale_ reports c) then update().
              bool skipped = false;
              st = scaler.StepOptimizer([c] { return c == '1'; }, &skipped);
              if (st.ok()) st = scaler.UpdateAfterStep();
              if (!st.ok()) return Fail("scaler", st);
              if (out.size() > 1) out += ", ";
              out += "{\"scale\": " + FormatScale(scaler.scale()) +
                     ", \"growth_tracker\": " + std::to_string(scaler.growth_tracker()) +
                     ", \"skipped\": " + (skipped ? "true" : "false") + "}";
            }
            std::cout << out << "]\n";
            return 0;
          }};
}

DDPCHECK_REGISTER_COMMAND("scaler", Setup);

}  // namespace
}  // namespace ddpcheck::cli
