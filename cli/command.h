// Subcommand registry: each cli/cmd_<name>.cc registers itself with a static DDPCHECK_REGISTER_COMMAND, so
// commands are added without touching main.cc. Run functions return the process exit code
// (0 PASS/ok, 1 divergence found, 2 bad input or usage).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.h"

namespace ddpcheck::cli {

using RunFn = std::function<int()>;
// Adds one subcommand to `app` (with its options and a --help example) and returns it with its run function.
using SetupFn = std::function<std::pair<CLI::App*, RunFn>(CLI::App& app)>;

bool RegisterCommand(const std::string& name, SetupFn setup);
const std::vector<std::pair<std::string, SetupFn>>& RegisteredCommands();

// Writes `line` (a whole message, ending in a newline) to stderr in one write: the ranks of a launch share the
// launcher's stderr, and a line written piece by piece (as std::cerr's << does, stderr being unbuffered) can be
// interleaved with another rank's ("ddpcheck ddpcheck run: runI/O error: ..."), which a reader, or a script
// looking for a rank's line, cannot take apart.
void ErrLine(const std::string& line);

// A command line CLI11 could not parse: prints "ddpcheck <subcommand>: <what> (see ddpcheck <subcommand> --help)"
// as one line (CLI11's own is two, without the command) and returns 2.
int ParseFailure(const CLI::App& app, const std::string& what);

// Prints "ddpcheck <cmd>: <status>" on stderr (one write) and returns the status's exit code (core::ExitCodeFor).
int Fail(const std::string& cmd, const core::Status& status);

}  // namespace ddpcheck::cli

#define DDPCHECK_CONCAT_INNER(a, b) a##b
#define DDPCHECK_CONCAT(a, b) DDPCHECK_CONCAT_INNER(a, b)
#define DDPCHECK_REGISTER_COMMAND(name, setup) \
  static const bool DDPCHECK_CONCAT(kRegistered_, __LINE__) = ::ddpcheck::cli::RegisterCommand(name, setup)
