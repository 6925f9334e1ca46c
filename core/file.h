// Whole-file reads and writes with Status errors that name the path.
#pragma once

#include <string>

#include "core/status.h"

namespace ddpcheck::core {

// NotFound when `path` is not a regular file; Io when it cannot be read.
Status ReadFileToString(const std::string& path, std::string* out);
// Creates or truncates `path`; Io when it cannot be written, naming the cause ("disk full writing
// report.json (...)"); a partly written file is removed.
Status WriteStringToFile(const std::string& path, const std::string& text);
// The text of I/O error `err` (an errno) while `doing` ("writing") `path`: "disk full writing report.json
// (<path>: No space left on device)" for ENOSPC, else "<path>: writing failed: <strerror>".
std::string IoErrorText(int err, const std::string& doing, const std::string& path);

}  // namespace ddpcheck::core
