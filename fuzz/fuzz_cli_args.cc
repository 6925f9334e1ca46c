// The scenario flags of `ddpcheck run` (cli/scenario_flags.cc): the input split at newlines into argv, parsed
// by CLI11 as the command does, then resolved (the default scenario, or a scenario file the input names) and
// validated. Usage errors must be CLI11 ParseErrors (exit 2), the rest Status errors.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/scenario_flags.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  std::vector<std::string> args = {"run"};
  std::string cur;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CLI::App app("fuzz");
  cli::ScenarioFlags flags;
  flags.Add(&app);
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return 0;
  }
  core::Scenario s;
  fuzz::ExpectInputError(flags.Resolve(&s));
  return 0;
}
