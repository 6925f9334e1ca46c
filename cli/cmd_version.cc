// `ddpcheck version`: prints version, commit and the libraries it was built with, as JSON.
#include <iostream>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/version.h"

namespace ddpcheck::cli {
namespace {

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand("version", "Print version and build provenance as JSON.\n  example: ddpcheck version");
  return {sub, [] {
            nlohmann::json j = {{"ddpcheck", core::Version()},
                                {"git_commit", core::GitCommit()},
                                {"eigen", std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
                                              "." + std::to_string(EIGEN_MINOR_VERSION)}};
            std::cout << j.dump() << "\n";
            return 0;
          }};
}

DDPCHECK_REGISTER_COMMAND("version", Setup);

}  // namespace
}  // namespace ddpcheck::cli
