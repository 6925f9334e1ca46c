// main() of every GPU test: exits 77 (CTest's SKIP_RETURN_CODE) when the machine has no CUDA device, so the
// tests compile and are reported SKIPPED on the CPU build machines.
#include <cstdio>

#include <gtest/gtest.h>

#include "real/device.h"

int main(int argc, char** argv) {
  if (ddpcheck::real::DeviceCount() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                ddpcheck::real::ProvenanceLine(ddpcheck::real::GetProvenance()).c_str());
    return ddpcheck::real::kSkipExitCode;
  }
  std::printf("GPU: %s\n", ddpcheck::real::ProvenanceLine(ddpcheck::real::GetProvenance()).c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
