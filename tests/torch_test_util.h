// Helpers for the live PyTorch cross-checks (ctest label `torch`): whether Debian's torch is importable, and
// running tools/examples/ddp_example.py into a dump folder.
#pragma once

#include <atomic>
#include <cstdlib>
#include <functional>
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

// Runs a torch recording, `make_cmd(port)` (a shell command whose output goes to `log`), and returns its exit
// code. A run that failed for torch's own reasons -- its port taken by another test ("Address already in use"),
// or torch 1.13's gloo aborting a process as the process groups are torn down at the end ("terminate called
// without an active exception", SIGABRT) -- is run once more under another port (the recorder rewrites its
// dump); any other failure is returned as it is.
inline int RunTorchRecording(const std::function<std::string(int port)>& make_cmd, int port, const std::string& log) {
  int code = -1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int status = std::system(make_cmd(20000 + (port - 20000 + attempt * 7919) % 20000).c_str());
    code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == 0) break;
    // Another port where the rendezvous itself failed: the port was taken, or another process's server on it
    // reset the connection (session 16, under a second process's load: "Connection reset by peer" raised in
    // _create_c10d_store), before any training ran.
    const std::string text = ReadFile(log);
    if (text.find("terminate called without an active exception") == std::string::npos &&
        text.find("Address already in use") == std::string::npos &&
        text.find("_create_c10d_store") == std::string::npos) {
      break;
    }
  }
  return code;
}

// Runs the example DDP script with `flags` (e.g. "--world 2 --model bn"), writing the dump to `out`.
// Returns the script's exit code; its output goes to out + ".log".
inline int RunDdpExample(const std::string& out, const std::string& flags) {
  static std::atomic<int> counter{0};
  const int port = 20000 + static_cast<int>((static_cast<unsigned>(getpid()) * 131u + 977u * counter++) % 20000u);
  return RunTorchRecording(
      [&](int p) {
        return "/usr/bin/python3 " + std::string(DDPCHECK_SOURCE_DIR) + "/tools/examples/ddp_example.py --out '" + out +
               "' --port " + std::to_string(p) + " " + flags + " > '" + out + ".log' 2>&1";
      },
      port, out + ".log");
}

}  // namespace ddpcheck::testing
