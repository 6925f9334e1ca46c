// The command line helps a user who mistypes: an unknown subcommand or option is named with the closest
// registered one (exit 2, nothing run), and every command's --help shows at least one example.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using testing::RunCli;

TEST(CliUsage, UnknownCommandIsNamedWithTheClosestCommand) {
  const auto r = RunCli("rnu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'rnu': did you mean 'run'?"), std::string::npos) << r.err;
}

TEST(CliUsage, FarOffCommandListsTheCommands) {
  const auto r = RunCli("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate': expected one of"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("torch-compare"), std::string::npos) << r.err;
}

TEST(CliUsage, MistypedOptionGetsADidYouMeanAndNothingRuns) {
  const auto r = RunCli("run --wrold 2 --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown option '--wrold' for 'ddpcheck run': did you mean '--world'?"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("VERDICT"), std::string::npos) << r.out;
  // one line: its value '2' is not a second "unexpected argument"
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("unexpected argument"), std::string::npos) << r.err;
}

TEST(CliUsage, MistypedOptionWithAValueAfterAnEqualsSignIsNamedWithoutTheValue) {
  const auto r = RunCli("faults --markdwn=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown option '--markdwn' for 'ddpcheck faults': did you mean '--markdown'?"),
            std::string::npos)
      << r.err;
}

// What the command-line parser refuses is one line naming the subcommand and where its help is, exit 2 (CLI11's
// own message was two lines without the command: "Could not convert: --world = four" / "Run with --help ...").
TEST(CliUsage, ParseErrorsAreOneLineNamingTheSubcommand) {
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"run --world four", "ddpcheck run: Could not convert: --world = four (see ddpcheck run --help)"},
      {"run --world 1.5", "ddpcheck run: Could not convert: --world = 1.5"},
      {"run --comm bogus", "ddpcheck run: --comm: bogus not in {gloo,local} (see ddpcheck run --help)"},
      {"run --timeout-ms -1", "ddpcheck run: --timeout-ms: Value -1 not in range"},
      {"torch-compare", "ddpcheck torch-compare: dump is required (see ddpcheck torch-compare --help)"},
      {"diff onlyone", "ddpcheck diff: want is required (see ddpcheck diff --help)"},
      {"launch --nproc 0 -- true", "ddpcheck launch: --nproc: Value 0 not in range 1 to 4096"},
      {"", "ddpcheck: A subcommand is required (see ddpcheck --help)"},
      // an empty value was taken as no value: `run --world ''` ran the scenario's W=4, `run ''` the default scenario
      {"run -q --comm local --world ''", "ddpcheck run: --world: an empty value"},
      {"run -q --comm local ''", "ddpcheck run: scenario: an empty value"},
      {"torch-compare ''", "ddpcheck torch-compare: dump: an empty value"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = RunCli(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line:\n" << r.err;
    EXPECT_EQ(r.err.rfind(c.says, 0), 0u) << r.err;
    EXPECT_EQ(r.out.find("VERDICT"), std::string::npos) << r.out;
  }
  const auto help = RunCli("run --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--world"), std::string::npos);
}

TEST(CliUsage, EveryCommandsHelpHasAnExample) {
  const auto top = RunCli("--help");
  ASSERT_EQ(top.exit_code, 0) << top.err;
  std::istringstream lines(top.out.substr(top.out.find("Subcommands:")));
  std::string line;
  int commands = 0;
  while (std::getline(lines, line)) {
    if (line.size() < 3 || line[0] != ' ' || line[1] != ' ' || line[2] == ' ') continue;  // "  name   text"
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    const auto help = RunCli(name + " --help");
    EXPECT_EQ(help.exit_code, 0) << name;
    bool example = false;  // a line "example: ... ddpcheck NAME ..."
    std::istringstream help_lines(help.out);
    for (std::string l; std::getline(help_lines, l);) {
      example = example || (l.find("example:") != std::string::npos && l.find("ddpcheck " + name) != std::string::npos);
    }
    EXPECT_TRUE(example) << name << ":\n" << help.out;
    ++commands;
  }
  EXPECT_GE(commands, 12);
}

}  // namespace
}  // namespace ddpcheck
