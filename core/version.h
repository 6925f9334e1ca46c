// The version and git commit this binary was built from. Defined in a file generated at configure time
// (cmake/version.cc.in), so a new commit recompiles one file instead of every file that sees a -D flag.
#pragma once

namespace ddpcheck::core {

const char* Version();    // "0.1.0"
const char* GitCommit();  // the short commit hash, or "unknown" outside a git checkout

}  // namespace ddpcheck::core
