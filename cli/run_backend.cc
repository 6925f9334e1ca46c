#include "cli/run_backend.h"

#include <utility>

namespace ddpcheck::cli {
namespace {
std::map<std::string, RunBackendFn>& Registry() {
  static std::map<std::string, RunBackendFn> backends;
  return backends;
}
}  // namespace

bool RegisterRunBackend(const std::string& name, RunBackendFn fn) {
  Registry()[name] = std::move(fn);
  return true;
}

const std::map<std::string, RunBackendFn>& RunBackends() { return Registry(); }

}  // namespace ddpcheck::cli
