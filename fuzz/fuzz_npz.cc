// Stored-zip archives of a torch dump (s<k>.npz): bytes -> ParseStoredZip (end-of-central-directory search,
// central and local headers, every offset and size against the bytes present), then each entry's bounds, CRC-32
// and .npy parse, as core::DumpTensorFiles reads them.
#include <map>
#include <string>

#include "core/npy.h"
#include "core/npy_archive.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddpcheck;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, core::ZipEntry> entries;
  const core::Status st = core::ParseStoredZip(bytes, &entries);
  fuzz::ExpectInputError(st);
  if (!st.ok()) return 0;
  for (const auto& [name, e] : entries) {
    // ParseStoredZip promises every entry lies inside the archive.
    if (e.offset > bytes.size() || e.size > bytes.size() - e.offset) std::abort();
    const std::string body = bytes.substr(e.offset, e.size);
    if (core::Crc32(body.data(), body.size()) != e.crc) continue;  // the reader refuses it: a named error
    core::Tensor t;
    fuzz::ExpectInputError(core::ParseNpy(body, name, &t));
  }
  return 0;
}
