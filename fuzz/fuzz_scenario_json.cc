// Scenario JSON: text -> ParseJsonText -> ParseScenario (parsing and every validation rule). Scenarios that
// name .npy files are not followed (the .npy parser has its own target).
#include <nlohmann/json.hpp>

#include "core/json_reader.h"
#include "core/scenario.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  nlohmann::json j;
  core::Status st = core::ParseJsonText(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json", &j);
  fuzz::ExpectInputError(st);
  if (!st.ok()) return 0;
  for (const char* section : {"/data/kind", "/init/kind"}) {
    const auto p = nlohmann::json::json_pointer(section);
    if (j.is_object() && j.contains(p) && j.at(p) == "npy") return 0;
  }
  core::Scenario s;
  fuzz::ExpectInputError(core::ParseScenario(j, "fuzz.json", fuzz::ScratchDir(), &s));
  return 0;
}
