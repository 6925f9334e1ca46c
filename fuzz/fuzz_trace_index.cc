// Trace index (what `ddpcheck diff` reads): bytes as DIR/index.json -> Trace::Read -> CheckFinite.
#include <filesystem>

#include "core/finite.h"
#include "core/npy.h"
#include "core/trace.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  static const std::string dir = [] {
    const std::string d = fuzz::ScratchDir() + "/trace";
    std::filesystem::create_directories(d);
    core::WriteNpy(d + "/t0.npy", core::Tensor(core::DType::kFloat64, {2, 2}, {1, 2, 3, 4}));
    return d;
  }();
  fuzz::WriteBytes(dir + "/index.json", data, size);
  core::Trace t;
  core::Status st = core::Trace::Read(dir, &t);
  fuzz::ExpectInputError(st);
  if (st.ok()) fuzz::ExpectInputError(core::CheckFinite(t, dir));
  return 0;
}
