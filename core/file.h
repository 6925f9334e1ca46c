// Whole-file reads and writes with Status errors that name the path.
#pragma once

#include <string>

#include "core/status.h"

namespace ddpcheck::core {

// NotFound when `path` is not a regular file; Io when it cannot be read.
Status ReadFileToString(const std::string& path, std::string* out);
// Creates or truncates `path`; Io when it cannot be written.
Status WriteStringToFile(const std::string& path, const std::string& text);

}  // namespace ddpcheck::core
