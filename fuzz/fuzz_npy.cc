// .npy header and body: bytes -> ParseNpy (magic, version, header dictionary, dtype, shape, data size).
#include <string>

#include "core/npy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  core::Tensor t;
  fuzz::ExpectInputError(core::ParseNpy(std::string(reinterpret_cast<const char*>(data), size), "fuzz.npy", &t));
  return 0;
}
