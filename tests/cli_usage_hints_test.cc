// The command line helps a user who mistypes: an unknown subcommand or option is named with the closest
// registered one (exit 2, nothing run), and every command's --help shows at least one example.
#include <sstream>
#include <string>

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
}

TEST(CliUsage, MistypedOptionWithAValueAfterAnEqualsSignIsNamedWithoutTheValue) {
  const auto r = RunCli("faults --markdwn=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown option '--markdwn' for 'ddpcheck faults': did you mean '--markdown'?"),
            std::string::npos)
      << r.err;
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
