#include "core/npy_archive.h"

#include <array>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/json_reader.h"
#include "core/npy.h"

namespace ddpcheck::core {

namespace {

constexpr uint32_t kLocalSignature = 0x04034b50, kCentralSignature = 0x02014b50, kEndSignature = 0x06054b50;
constexpr uint64_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kMaxComment = 65535;

uint64_t Le(const std::string& b, uint64_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

constexpr std::array<uint32_t, 256> CrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kCrcTable = CrcTable();

// Where the end-of-central-directory record starts: the last signature whose comment ends the file exactly.
bool FindEnd(const std::string& b, uint64_t* at) {
  const uint64_t lowest = b.size() > kEndSize + kMaxComment ? b.size() - kEndSize - kMaxComment : 0;
  for (uint64_t p = b.size() - kEndSize + 1; p-- > lowest;) {
    if (Le(b, p, 4) == kEndSignature && p + kEndSize + Le(b, p + 20, 2) == b.size()) {
      *at = p;
      return true;
    }
  }
  return false;
}

}  // namespace

uint32_t Crc32(const char* data, uint64_t n) {
  uint32_t c = 0xffffffffu;
  for (uint64_t i = 0; i < n; ++i) c = kCrcTable[(c ^ static_cast<unsigned char>(data[i])) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

Status ParseStoredZip(const std::string& b, std::map<std::string, ZipEntry>* out) {
  out->clear();
  uint64_t end = 0;
  if (b.size() < kEndSize || !FindEnd(b, &end)) {
    return Status::Io(fmt::format("truncated or not a zip archive: no end-of-central-directory record in its {} "
                                  "bytes (the recorder writes it last: was the write cut short?)", b.size()));
  }
  const uint64_t disk = Le(b, end + 4, 2), cd_disk = Le(b, end + 6, 2), here = Le(b, end + 8, 2),
                 count = Le(b, end + 10, 2), cd_size = Le(b, end + 12, 4), cd_offset = Le(b, end + 16, 4);
  if (count == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
    return Status::Invalid("a zip64 archive; ddpcheck reads zips under 4 GiB and 65535 entries (the recorder "
                           "writes a larger tensor as a .npy file of its own)");
  }
  if (disk != 0 || cd_disk != 0 || here != count) return Status::Invalid("a multi-disk zip archive: not supported");
  if (cd_offset + cd_size > end) {
    return Status::Io(fmt::format("truncated or malformed zip archive: its central directory (bytes {} to {}) runs "
                                  "past its end record at byte {}", cd_offset, cd_offset + cd_size, end));
  }
  uint64_t p = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (p + kCentralSize > cd_end || Le(b, p, 4) != kCentralSignature) {
      return Status::Invalid(fmt::format("malformed zip archive: central directory entry {} of {} (byte {}) is "
                                         "missing or has no signature", i, count, p));
    }
    const uint64_t flags = Le(b, p + 8, 2), method = Le(b, p + 10, 2), crc = Le(b, p + 16, 4),
                   packed = Le(b, p + 20, 4), size = Le(b, p + 24, 4), name_len = Le(b, p + 28, 2),
                   extra_len = Le(b, p + 30, 2), comment_len = Le(b, p + 32, 2), local = Le(b, p + 42, 4);
    if (p + kCentralSize + name_len + extra_len + comment_len > cd_end) {
      return Status::Invalid(fmt::format("malformed zip archive: central directory entry {} of {} runs past the "
                                         "directory's end", i, count));
    }
    const std::string name = b.substr(p + kCentralSize, name_len);
    p += kCentralSize + name_len + extra_len + comment_len;
    const std::string what = "entry '" + name + "'";
    if (flags & 1) return Status::Invalid(what + " is encrypted: not supported");
    if (method != 0) {
      return Status::Invalid(fmt::format("{} is compressed (method {}); ddpcheck reads stored entries (np.savez "
                                         "writes them, np.savez_compressed does not)", what, method));
    }
    if (packed == 0xffffffff || size == 0xffffffff || local == 0xffffffff) {
      return Status::Invalid(what + " has zip64 sizes or offset: not supported");
    }
    if (packed != size) {
      return Status::Invalid(fmt::format("{} is stored but says {} bytes packed and {} unpacked", what, packed, size));
    }
    if (local + kLocalSize > cd_offset || Le(b, local, 4) != kLocalSignature) {
      return Status::Invalid(fmt::format("{}: no local header at byte {} (the central directory starts at byte {})",
                                         what, local, cd_offset));
    }
    const uint64_t data = local + kLocalSize + Le(b, local + 26, 2) + Le(b, local + 28, 2);
    if (data + size > cd_offset) {
      return Status::Io(fmt::format("{}: truncated: its {} bytes of data at byte {} run past the central directory "
                                    "at byte {}", what, size, data, cd_offset));
    }
    if (Le(b, local + 26, 2) != name_len || b.compare(local + kLocalSize, name_len, name) != 0) {
      return Status::Invalid(what + ": its local header names another entry (malformed zip archive)");
    }
    if (!out->emplace(name, ZipEntry{data, size, static_cast<uint32_t>(crc)}).second) {
      return Status::Invalid(what + " appears twice (malformed zip archive)");
    }
  }
  return Status::Ok();
}

Status DumpTensorFiles::Read(const std::string& name, Tensor* out) {
  // (QA round 16: a NUL inside a name cut it short, and "s0.npz\0x.npy" was read as the archive itself)
  if (HasControlCharacters(name)) {
    return Status::Invalid(fmt::format("{}: tensor {}: a file name with a control character", dir_,
                                       nlohmann::json(name).dump()));
  }
  // "../rank<k>/ARCHIVE.npz/ENTRY.npy" (format version 3, checked by ReadTorchDump): rank k's archive entry.
  std::string dir = dir_, local = name;
  if (name.starts_with("../")) {
    const size_t peer_end = name.find('/', 3);
    const std::string peer = peer_end == std::string::npos ? std::string() : name.substr(3, peer_end - 3);
    local = peer_end == std::string::npos ? std::string() : name.substr(peer_end + 1);
    const bool rank_folder = peer.size() > 4 && peer.starts_with("rank") &&
                             peer.find_first_not_of("0123456789", 4) == std::string::npos;
    const size_t cut = dir_.find_last_of('/');
    if (!rank_folder || local.find('/') == std::string::npos || local.starts_with(".") || cut == std::string::npos) {
      return Status::Invalid(fmt::format("{}: tensor '{}': another rank's entry must be named "
                                         "../rank<k>/ARCHIVE.npz/ENTRY.npy", dir_, name));
    }
    dir = dir_.substr(0, cut) + "/" + peer;
  }
  const size_t slash = local.find('/');
  const std::string archive = slash == std::string::npos ? std::string() : local.substr(0, slash);
  if (archive.size() <= 4 || archive.compare(archive.size() - 4, 4, ".npz") != 0) {
    if (dir != dir_) {
      return Status::Invalid(fmt::format("{}: tensor '{}': another rank's tensor must be an archive entry "
                                         "(../rank<k>/ARCHIVE.npz/ENTRY.npy)", dir_, name));
    }
    // A .npy file of its own (the per-tensor layout): a name inside this rank's folder (QA round 16: "/dev/zero",
    // "." and "" were read as paths, "rank0//dev/zero: no such file").
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos || name.size() <= 4 ||
        !name.ends_with(".npy")) {
      return Status::Invalid(fmt::format("{}: tensor '{}': must name a .npy file in this rank's folder (FILE.npy) or "
                                         "an archive entry (ARCHIVE.npz/ENTRY.npy)", dir_, name));
    }
    return ReadNpy(dir_ + "/" + name, out);
  }
  const std::string entry = local.substr(slash + 1), path = dir + "/" + archive;
  const std::string where = path + ": entry '" + entry + "'";
  auto it = cache_.begin();
  while (it != cache_.end() && it->name != path) ++it;
  if (it == cache_.end()) {
    Archive a;
    a.name = path;
    Status st = ReadFileToString(path, &a.bytes);
    if (!st.ok()) return Status(st.code(), st.message() + " (the index names its entry '" + entry + "')");
    st = ParseStoredZip(a.bytes, &a.entries);
    if (!st.ok()) {  // names the entry it found wrong; else the one asked for
      const bool named = st.message().find("'" + entry + "'") != std::string::npos;
      return Status(st.code(), path + ": " + st.message() + (named ? "" : " (reading entry '" + entry + "')"));
    }
    if (cache_.size() == 3) cache_.pop_back();
    cache_.push_front(std::move(a));
    it = cache_.begin();
  }
  const auto e = it->entries.find(entry);
  if (e == it->entries.end()) {
    return Status::NotFound(fmt::format("{}: no such entry (the archive holds {} entries)", where, it->entries.size()));
  }
  const ZipEntry& z = e->second;
  const uint32_t crc = Crc32(it->bytes.data() + z.offset, z.size);
  if (crc != z.crc) {
    return Status::Io(fmt::format("{}: CRC-32 {:08x} of its data differs from the {:08x} recorded: the archive is "
                                  "damaged", where, crc, z.crc));
  }
  return ParseNpy(it->bytes.substr(z.offset, z.size), where, out);
}

}  // namespace ddpcheck::core
