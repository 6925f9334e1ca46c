#include "core/file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddpcheck::core {

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
  std::ofstream out(path, std::ios::binary);
  if (!out) return Status::Io(path + ": cannot write");
  out << text;
  return out ? Status::Ok() : Status::Io(path + ": write failed");
}

}  // namespace ddpcheck::core
