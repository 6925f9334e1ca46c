// `cmake --install` of this build into a fresh prefix: the binary runs from there, and the PyTorch recorder,
// its example (beside it, so its import works), the scenarios and the docs are installed.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck {
namespace {

TEST(Install, PutsTheBinaryRecorderScenariosAndDocsUnderThePrefix) {
  testing::TempDir prefix;
  const std::string build = std::filesystem::path(DDPCHECK_BINARY).parent_path().string();
  const std::string cmd = "cmake --install '" + build + "' --prefix '" + prefix.path() + "' >" +
                          prefix.File("log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::ReadFile(prefix.File("log"));
  const std::string root = prefix.path();
  for (const char* f : {"bin/ddpcheck", "share/ddpcheck/tools/ddpcheck_torch.py",
                        "share/ddpcheck/tools/examples/ddp_example.py", "share/ddpcheck/scenarios/default.json",
                        "share/ddpcheck/scenarios/faults/loss-times-world.json", "share/doc/ddpcheck/README.md",
                        "share/doc/ddpcheck/bugs.md", "share/doc/ddpcheck/ci.md", "share/doc/ddpcheck/FORMAT.md"}) {
    EXPECT_TRUE(std::filesystem::exists(root + "/" + f)) << f;
  }
  EXPECT_EQ(::access((root + "/share/ddpcheck/tools/examples/ddp_example.py").c_str(), X_OK), 0) << "executable";
  // The installed binary runs a check on its own installed scenario.
  const std::string run = "'" + root + "/bin/ddpcheck' run '" + root +
                          "/share/ddpcheck/scenarios/faults/loss-times-world.json' -q >" + prefix.File("out") +
                          " 2>&1";
  const int status = std::system(run.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1) << testing::ReadFile(prefix.File("out"));
  EXPECT_NE(testing::ReadFile(prefix.File("out")).find("matches 'loss-times-world'"), std::string::npos);
}

}  // namespace
}  // namespace ddpcheck
