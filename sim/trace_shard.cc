#include "sim/trace_shard.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <string>

namespace ddpcheck::sim {

namespace {

template <typename T>
void Append(std::vector<char>* out, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof(T));
}

}  // namespace

core::Status PackTrace(const core::Trace& trace, std::vector<char>* out) {
  // The files a trace folder would hold, framed (name length, name, size, bytes), all in memory: a shard of
  // thousands of tensors is not written to and read back from disk file by file.
  std::map<std::string, std::string> files;
  DDPCHECK_RETURN_IF_ERROR(trace.Encode(&files));
  out->clear();
  for (const auto& [name, bytes] : files) {
    Append<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out->insert(out->end(), name.begin(), name.end());
    Append<uint64_t>(out, bytes.size());
    out->insert(out->end(), bytes.begin(), bytes.end());
  }
  return core::Status::Ok();
}

core::Status UnpackTrace(const std::vector<char>& blob, core::Trace* out) {
  std::map<std::string, std::string> files;
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
    files[name].assign(blob.data() + at, size);
    at += size;
  }
  return core::Trace::Decode(files, "trace shard", out);
}

void MergeShard(const core::Trace& shard, core::Trace* world) {
  for (const auto& [key, value] : shard.records()) world->Add(key, value.ptr());  // shared, not copied
  for (const auto& event : shard.events()) world->AddEvent(event);
}

}  // namespace ddpcheck::sim
