// The ddpcheck command: parses the subcommand, runs it, and turns every failure into a message and an exit
// code (0 PASS, 1 divergence found, 2 bad input or usage, 3 internal error).
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>

#include "cli/command.h"
#include "cli/gpu_handover.h"
#include "cli/usage_hints.h"
#include "core/check.h"
#include "core/file.h"
#include "core/version.h"

namespace ddpcheck::cli {

namespace {
std::vector<std::pair<std::string, SetupFn>>& Registry() {
  static std::vector<std::pair<std::string, SetupFn>> registry;
  return registry;
}
}  // namespace

bool RegisterCommand(const std::string& name, SetupFn setup) {
  Registry().emplace_back(name, std::move(setup));
  return true;
}

const std::vector<std::pair<std::string, SetupFn>>& RegisteredCommands() { return Registry(); }

void ErrLine(const std::string& text) {
  // One line, never a screenful: a value echoed whole (a 100 KB layer type, fault name or flag in an "unknown value"
  // message, QA round 15) is cut in the middle, keeping what was wrong and where (the start) and the fix (the end).
  constexpr size_t kMax = 2000;
  const std::string line = text.size() <= kMax ? text
                                               : text.substr(0, 1200) + "...(" + std::to_string(text.size() - 1700) +
                                                     " characters cut)..." + text.substr(text.size() - 500);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to say it
    done += static_cast<size_t>(n);
  }
}

// "ddpcheck" and the subcommands parsed so far: "ddpcheck run".
std::string CommandName(const CLI::App& app) {
  std::string name = "ddpcheck";
  for (const CLI::App* a = &app;;) {
    const auto subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    name += " " + a->get_name();
  }
  return name;
}

int ParseFailure(const CLI::App& app, const std::string& what) {
  const std::string name = CommandName(app);
  std::string line = what;
  std::replace(line.begin(), line.end(), '\n', ' ');
  ErrLine(name + ": " + line + " (see " + name + " --help)\n");
  return 2;
}

int Fail(const std::string& cmd, const core::Status& status) {
  ErrLine("ddpcheck " + cmd + ": " + status.ToString() + "\n");
  return core::ExitCodeFor(status);
}

}  // namespace ddpcheck::cli

int main(int argc, char** argv) {
  using namespace ddpcheck;
  cli::HandOverGpuCommands(argc, argv);
  // A check makes and drops tensors of the model's size every step (a trace's values, the replay's bounds).
  // glibc maps each large one afresh and unmaps it when freed, so the next is page-faulted and zeroed again:
  // a third of a large model's check went to the kernel. Freed memory stays with the process instead (it is
  // reused; the peak is the same, measured in bench/README.md), unless the user tunes malloc themselves (a
  // glibc.malloc tunable in GLIBC_TUNABLES; an empty one, or one that tunes something else, is not that). One
  // arena for every thread: a worker thread's arena is a 64 MB heap of its own, unmapped whole when its
  // tensors are freed (the trim threshold does not hold it) and mapped and faulted afresh by the next worker
  // (the replay's and the comparisons' threads): 15 % fewer page faults and a fifth off the replay of the
  // 10M-parameter check (bench/README.md). The threads allocate per tensor, not per element: one lock is cheap.
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables == nullptr || std::strstr(tunables, "glibc.malloc.") == nullptr) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    mallopt(M_ARENA_MAX, 1);
  }
  CLI::App app{
      "ddpcheck: does a distributed (DDP) training step do exactly what a single process would do?\n"
      "Runs the same steps on a reference, a simulated CPU world (Gloo) and GPUs, and names the first difference.",
      "ddpcheck"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(core::Version()) + " (" + core::GitCommit() + ")");
  std::vector<std::pair<CLI::App*, cli::RunFn>> commands;
  // Register in name order so --help is stable whatever the link order.
  auto registered = cli::RegisteredCommands();
  std::sort(registered.begin(), registered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> names;
  for (const auto& [name, setup] : registered) {
    commands.push_back(setup(app));
    names.push_back(name);
  }
  if (argc > 1) {
    if (const std::string hint = cli::UnknownCommandHint(argv[1], names); !hint.empty()) {
      cli::ErrLine("ddpcheck: " + hint + "\n");
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    for (auto& [sub, run] : commands) {
      if (sub->count() > 0 && !sub->remaining().empty()) {
        cli::ErrLine("ddpcheck: " + cli::UnknownOptionHints(*sub, sub->remaining()));
        return 2;
      }
    }
    return cli::ParseFailure(app, e.what());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return cli::ParseFailure(app, e.what());
  }
  // A value given as '' ("--world ''", a scenario path ''): CLI11 takes it as not given (the default ran).
  for (const CLI::App* sub = &app; sub != nullptr;) {
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->count() == 0 || opt->get_type_size_max() == 0) continue;  // absent, or a flag
      for (const std::string& v : opt->results()) {
        if (v.empty()) {
          return cli::ParseFailure(app, opt->get_name(!opt->nonpositional()) + ": an empty value; give one or leave the option out");
        }
      }
    }
    const auto subs = sub->get_subcommands();
    sub = subs.empty() ? nullptr : subs.front();
  }
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const std::filesystem::filesystem_error& e) {
    // A std::filesystem call on a path the user gave that the OS refused (a symlink loop, a name too long): bad
    // input, said in one line with the path and the OS's reason. The readers check their paths without throwing
    // (core/file.h ExpectFile); this is the net under any that does not.
    const std::string path = e.path1().string();
    cli::ErrLine(cli::CommandName(app) + ": " + (path.empty() ? std::string() : core::ShownPath(path) + ": ") +
                 e.code().message() + "\n");
    return 2;
  } catch (const core::CheckError& e) {
    cli::ErrLine(std::string("ddpcheck: internal invariant broken (a bug in ddpcheck, please report): ") + e.what() +
                 "\n");
    return 3;
  } catch (const std::exception& e) {
    cli::ErrLine(std::string("ddpcheck: error: ") + e.what() + "\n");
    return 3;
  }
  return 2;
}
