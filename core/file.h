// Whole-file reads and writes with Status errors that name the path.
#pragma once

#include <string>

#include "core/status.h"

namespace ddpcheck::core {

// The largest file ddpcheck reads (a scenario, a .npy, an index): 1 GiB, above every tensor the scenario
// limits allow (core/scenario.h), so a path to a huge file is refused before it is read into memory.
constexpr long long kMaxInputFileBytes = 1LL << 30;

// Ok when `path` is a regular file (symlinks followed). Otherwise one line naming the path and the OS's reason:
// NotFound "<path>: no such file<hint>" when nothing is there (or a dangling symlink); InvalidArgument
// "<path>: is a directory, expected a file" (a FIFO, a socket, a device alike), "<path>: too many levels of
// symbolic links (a symlink loop)", "<path>: file name too long" (the path shortened), or the strerror text.
// A non-empty `hint` replaces ", expected a file" after the kind. Never throws (std::filesystem's status() throws
// on ELOOP and ENAMETOOLONG).
Status ExpectFile(const std::string& path, const std::string& hint = "");
// The same for a folder: NotFound "<path>: not found<hint>", "<path>: is a file, expected a folder<hint>".
Status ExpectDirectory(const std::string& path, const std::string& hint = "");
// `path` for a message: paths longer than 300 characters keep their first and last 100 ("/tmp/aaa...aaa/x").
std::string ShownPath(const std::string& path);

// ExpectFile, then NotFound when `path` is not a regular file; InvalidArgument when it is larger than kMaxInputFileBytes; Io
// when it cannot be read.
Status ReadFileToString(const std::string& path, std::string* out);
// Creates or truncates `path`; Io when it cannot be written, naming the cause ("disk full writing
// report.json (...)"); a partly written file is removed.
Status WriteStringToFile(const std::string& path, const std::string& text);
// The text of I/O error `err` (an errno) while `doing` ("writing") `path`: "disk full writing report.json
// (<path>: No space left on device)" for ENOSPC, else "<path>: writing failed: <strerror>".
std::string IoErrorText(int err, const std::string& doing, const std::string& path);

// True when `path` is a regular file (symlinks followed) this process may execute.
bool IsExecutable(const std::string& path);
// The first executable `name` in $PATH's folders as execvp looks (an empty entry is "."), or "" when there is none;
// `unset_path` stands for PATH when it is not set.
std::string FindInPath(const std::string& name, const std::string& unset_path);

}  // namespace ddpcheck::core
