// "Did you mean" for the command line: an unknown subcommand or a mistyped option named with the closest
// registered name (core/suggest.h), in one line on stderr, exit code 2.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ddpcheck::cli {

// "unknown command 'rnu': did you mean 'run'? (`ddpcheck --help` lists the commands)" when `word` is not one
// of `commands` and does not start with '-'; "" otherwise.
std::string UnknownCommandHint(const std::string& word, const std::vector<std::string>& commands);

// For each argument of `extras` (the arguments `sub` did not expect) that looks like an option: "unknown option
// '--wrold' for 'ddpcheck run': did you mean '--world'?"; other arguments: "unexpected argument 'x' for ...".
// One line per argument.
std::string UnknownOptionHints(const CLI::App& sub, const std::vector<std::string>& extras);

}  // namespace ddpcheck::cli
