// Shared by the fuzz targets: a scratch folder per process and the one rule every target asserts.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/status.h"

namespace ddpcheck::fuzz {

// A folder of its own under the temp dir, made once per process (libFuzzer runs one input at a time).
inline const std::string& ScratchDir() {
  // Never freed: the exit handler below still needs it after static destructors ran.
  static const std::string* dir = [] {
    auto* d = new std::string(
        (std::filesystem::temp_directory_path() / ("ddpcheck_fuzz_" + std::to_string(getpid()))).string());
    std::filesystem::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

inline void WriteBytes(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
}

// Hostile input must end as a Status naming it, never as kInternal (a bug of ddpcheck) or an empty message.
inline void ExpectInputError(const core::Status& st) {
  if (st.ok()) return;
  if (st.code() == core::Code::kInternal || st.message().empty()) {
    std::fprintf(stderr, "internal error on input: %s\n", st.ToString().c_str());
    std::abort();
  }
}

}  // namespace ddpcheck::fuzz
