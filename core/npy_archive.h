// The tensors a torch dump's index names (docs/torch.md, "Dump format"): "NAME.npy" is a .npy file in the rank's
// folder (the per-tensor layout, every recording before the archives and any tensor too large for one),
// "ARCHIVE.npz/ENTRY.npy" is the entry ENTRY.npy of ARCHIVE.npz there: a zip of stored (uncompressed) .npy
// files, as np.savez writes and np.load reads (the recorder writes one per rank and step).
//
// The zip reader is strict and bounded by the file's own size: no zip64, no compression, no encryption, no
// multi-disk archives; every offset and size is checked against the bytes present before it is used and each
// entry's CRC-32 is verified. Every error is one line naming the archive and the entry:
// "DUMP/rank1/s3.npz: entry 's3.param.0.weight.npy': CRC-32 ... differs ...", "DUMP/rank1/s3.npz: truncated or not
// a zip archive: ... (reading entry 's3.indices.npy')".
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

struct ZipEntry {
  uint64_t offset = 0;  // of the entry's data in the archive
  uint64_t size = 0;
  uint32_t crc = 0;
};

// The entries of the stored zip `bytes`, by name. Errors (InvalidArgument; Io for a truncated archive) say what
// is wrong without naming the archive (the caller prefixes it), e.g. "entry 'x.npy' is compressed (method 8)".
Status ParseStoredZip(const std::string& bytes, std::map<std::string, ZipEntry>* out);

// CRC-32 (the zip and zlib polynomial) of n bytes.
uint32_t Crc32(const char* data, uint64_t n);

// Reads the tensors of one rank's folder by the names its index gives, "../rank<k>/ARCHIVE.npz/ENTRY.npy" (format
// version 3) from rank k's folder beside it; the three archives read last are kept (a step's tensors come from its
// archive and rank 0's, a deferred reference from the next step's).
class DumpTensorFiles {
 public:
  explicit DumpTensorFiles(std::string dir) : dir_(std::move(dir)) {}
  // `name` as the index gives it; errors name the file (and the entry), as ReadNpy's do.
  Status Read(const std::string& name, Tensor* out);

 private:
  struct Archive {
    std::string name;  // its path
    std::string bytes;
    std::map<std::string, ZipEntry> entries;
  };
  std::string dir_;
  std::deque<Archive> cache_;
};

}  // namespace ddpcheck::core
