#include "core/file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddpcheck::core {

std::string IoErrorText(int err, const std::string& doing, const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  if (err == ENOSPC) return "disk full " + doing + " " + name + " (" + path + ": " + std::strerror(err) + ")";
  if (err == EDQUOT) return "disk quota exceeded " + doing + " " + name + " (" + path + ": " + std::strerror(err) + ")";
  return path + ": " + doing + " failed: " + std::strerror(err);
}

bool IsExecutable(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string FindInPath(const std::string& name, const std::string& unset_path) {
  const char* env = std::getenv("PATH");
  const std::string dirs = env ? env : unset_path;
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    const std::string candidate = (e > b ? dirs.substr(b, e - b) : std::string(".")) + "/" + name;
    if (IsExecutable(candidate)) return candidate;
    b = e + 1;
  }
  return "";
}

std::string ShownPath(const std::string& path) {
  if (path.size() <= 300) return path;
  return path.substr(0, 100) + "...(" + std::to_string(path.size()) + " characters)..." +
         path.substr(path.size() - 100);
}

namespace {

// What stands at `path` when it is not what was expected (`want`: "a file" or "a folder").
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a file";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file nor a folder";
}

Status Expect(const std::string& path, bool dir, const std::string& missing, const std::string& hint) {
  struct stat st {};
  const std::string shown = ShownPath(path);
  if (path.empty()) return Status::NotFound("'': " + missing + " (an empty path)" + hint);
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return Status::NotFound(shown + ": " + missing + hint);
    if (err == ELOOP) return Status::Invalid(shown + ": too many levels of symbolic links (a symlink loop?)" + hint);
    if (err == ENAMETOOLONG) {
      return Status::Invalid(shown + ": file name too long (" + std::strerror(err) + "; the OS takes at most " +
                             std::to_string(PATH_MAX - 1) + " characters, " + std::to_string(NAME_MAX) +
                             " per name)" + hint);
    }
    return Status::Invalid(shown + ": cannot be read: " + std::strerror(err) + hint);
  }
  if (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)) return Status::Ok();
  return Status::Invalid(shown + ": is " + KindOf(st.st_mode) +
                         (hint.empty() ? std::string(", expected ") + (dir ? "a folder" : "a file") : hint));
}

}  // namespace

Status ExpectFile(const std::string& path, const std::string& hint) { return Expect(path, false, "no such file", hint); }

Status ExpectDirectory(const std::string& path, const std::string& hint) { return Expect(path, true, "not found", hint); }

Status ReadFileToString(const std::string& path, std::string* out) {
  std::error_code ec;
  DDPCHECK_RETURN_IF_ERROR(ExpectFile(path));
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > static_cast<uintmax_t>(kMaxInputFileBytes)) {
    return Status::Invalid(path + ": " + std::to_string(size) + " bytes; ddpcheck reads input files of at most " +
                           std::to_string(kMaxInputFileBytes) + " bytes (1 GiB)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Io(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::Io(path + ": read error");
  *out = ss.str();
  return Status::Ok();
}

Status WriteStringToFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Io(IoErrorText(errno, "opening for writing", path));
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;  // a write that takes nothing: the device is full
      break;
    }
    done += static_cast<size_t>(n);
  }
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS and others report a full disk at close
  if (err != 0) {
    // A truncated report would read as a whole one: removed, if it is a file. Never a device or a FIFO (QA round
    // 16: a report to /dev/full, run as root, unlinked /dev/full itself).
    if (regular) ::unlink(path.c_str());
    return Status::Io(IoErrorText(err, "writing", path));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
