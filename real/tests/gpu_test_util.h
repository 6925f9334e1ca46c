// What the GPU tests share beside their main (gpu_test_main.cc).
#pragma once

#include <string>

namespace ddpcheck::real {

// The source tree (scenarios/ and the rest), wherever ctest runs a test from: this header's path, cut at real/tests/.
inline std::string SourceDir() {
  const std::string here = __FILE__;
  return here.substr(0, here.rfind("/real/tests/"));
}

}  // namespace ddpcheck::real
