// `ddpcheck faults [NAME]`: the catalog of DDP bug patterns (BUGS.md) with how to fix each one.
//   no NAME: one line per pattern (name, kind, cause); NAME: the whole guide entry (core/fault_guide.h);
//   --markdown: docs/bugs.md. An unknown NAME exits 2 naming the closest pattern.
#include <iostream>

#include <fmt/format.h>

#include "cli/command.h"
#include "core/fault_guide.h"
#include "core/suggest.h"

namespace ddpcheck::cli {
namespace {

struct Args {
  std::string name;
  bool markdown = false;
};

int Run(const Args& a) {
  if (a.markdown) {
    std::cout << core::FaultGuideMarkdown();
    return 0;
  }
  if (!a.name.empty()) {
    // "bypass-ddp@1:3" names the same pattern as "bypass-ddp".
    const std::string name = a.name.substr(0, a.name.find_first_of("@:"));
    const core::FaultInfo* info = core::FindFault(name);
    if (!info) {
      return Fail("faults", core::Status::Invalid("unknown fault '" + name + "'; " +
                                                  core::SuggestionFor(name, core::KnownFaultNames()) +
                                                  " (`ddpcheck faults` lists them)"));
    }
    std::cout << core::FormatFaultGuide(*info);
    return 0;
  }
  for (const auto& f : core::FaultCatalog()) {
    std::cout << fmt::format("{:<26} {:<20} {}\n", f.name, f.kind, f.description);
  }
  std::cout << fmt::format("\n{} patterns. `ddpcheck faults NAME` shows how to fix one; docs/bugs.md has them all.\n",
                           core::FaultCatalog().size());
  return 0;
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "faults",
      "List the DDP bug patterns ddpcheck detects and injects (--fault NAME), or show one with its fix.\n"
      "  example: ddpcheck faults                    (every pattern: name, kind, cause)\n"
      "  example: ddpcheck faults loss-times-world   (symptom, cause, how to fix, before/after, scenario)\n"
      "  example: ddpcheck faults --markdown > docs/bugs.md");
  sub->add_option("name", args->name, "A pattern name (as in --fault NAME[@RANK][:STEP])");
  sub->add_flag("--markdown", args->markdown, "Print every pattern as Markdown (docs/bugs.md)");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("faults", Setup);

}  // namespace
}  // namespace ddpcheck::cli
