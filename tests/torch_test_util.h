// Helpers for the live PyTorch cross-checks (ctest label `torch`): whether Debian's torch is importable, and
// running tools/examples/ddp_example.py into a dump folder.
#pragma once

#include <atomic>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::testing {

// True when `/usr/bin/python3 -c "import torch"` works (checked once).
inline bool TorchAvailable() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

#define DDPCHECK_REQUIRE_TORCH()                                                                   \
  do {                                                                                             \
    if (!::ddpcheck::testing::TorchAvailable()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch"; \
  } while (0)

// Runs the example DDP script with `flags` (e.g. "--world 2 --model bn"), writing the dump to `out`.
// Returns the script's exit code; its output goes to out + ".log".
inline int RunDdpExample(const std::string& out, const std::string& flags) {
  static std::atomic<int> counter{0};
  const int port = 20000 + static_cast<int>((static_cast<unsigned>(getpid()) * 131u + 977u * counter++) % 20000u);
  const std::string cmd = "/usr/bin/python3 " + std::string(DDPCHECK_SOURCE_DIR) + "/tools/examples/ddp_example.py --out '" +
                          out + "' --port " + std::to_string(port) + " " + flags + " > '" + out + ".log' 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ddpcheck::testing
