#include "core/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

Status ReadFileToString(const std::string& path, std::string* out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::NotFound(path + ": no such file");
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
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS and others report a full disk at close
  if (err != 0) {
    ::unlink(path.c_str());  // a truncated report would read as a whole one
    return Status::Io(IoErrorText(err, "writing", path));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
