#include "sim/trace_shard.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace ddpcheck::sim {

namespace fs = std::filesystem;

namespace {

// A fresh temporary folder, removed with everything in it by the destructor.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddpcheck-shard-XXXXXX").string();
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

template <typename T>
void Append(std::vector<char>* out, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

}  // namespace

core::Status PackTrace(const core::Trace& trace, std::vector<char>* out) {
  ScratchDir dir;
  if (dir.path().empty()) return core::Status::Io("cannot make a temporary folder for a trace shard");
  DDPCHECK_RETURN_IF_ERROR(trace.Write(dir.path()));
  out->clear();
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    std::ifstream in(entry.path(), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) return core::Status::Io(entry.path().string() + ": read failed");
    Append<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out->insert(out->end(), name.begin(), name.end());
    Append<uint64_t>(out, bytes.size());
    out->insert(out->end(), bytes.begin(), bytes.end());
  }
  return core::Status::Ok();
}

core::Status UnpackTrace(const std::vector<char>& blob, core::Trace* out) {
  ScratchDir dir;
  if (dir.path().empty()) return core::Status::Io("cannot make a temporary folder for a trace shard");
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (blob.size() - at < n) return false;
    std::memcpy(dst, blob.data() + at, n);
    at += n;
    return true;
  };
  while (at < blob.size()) {
    uint32_t name_len = 0;
    uint64_t size = 0;
    std::string name;
    if (!take(&name_len, sizeof(name_len)) || name_len == 0 || name_len > 255) {
      return core::Status::Invalid("trace shard: bad file name length at byte " + std::to_string(at));
    }
    name.resize(name_len);
    if (!take(name.data(), name_len) || name.find('/') != std::string::npos || name[0] == '.') {
      return core::Status::Invalid("trace shard: bad file name at byte " + std::to_string(at));
    }
    if (!take(&size, sizeof(size)) || blob.size() - at < size) {
      return core::Status::Invalid("trace shard: " + name + " is truncated");
    }
    std::ofstream file(dir.path() + "/" + name, std::ios::binary);
    file.write(blob.data() + at, static_cast<std::streamsize>(size));
    if (!file) return core::Status::Io(dir.path() + "/" + name + ": write failed");
    at += size;
  }
  return core::Trace::Read(dir.path(), out);
}

void MergeShard(const core::Trace& shard, core::Trace* world) {
  for (const auto& [key, value] : shard.records()) world->Add(key, value);
  for (const auto& event : shard.events()) world->AddEvent(event);
}

}  // namespace ddpcheck::sim
