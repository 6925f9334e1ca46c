#include "core/check.h"

#include <cstring>

namespace ddpcheck::core {

namespace {
thread_local int t_rank = -1;
thread_local int t_world = -1;
}  // namespace

void SetThreadRank(int rank, int world) {
  t_rank = rank;
  t_world = world;
}

std::string ThreadRankPrefix() {
  if (t_rank < 0) return "";
  return "[rank " + std::to_string(t_rank) + "/" + std::to_string(t_world) + "] ";
}

namespace detail {
[[noreturn]] void ThrowCheck(const char* file, int line, const std::string& what) {
  // Paths relative to the project: keep from the folder name on.
  const char* rel = file;
  for (const char* dir : {"/core/", "/reference/", "/sim/", "/real/", "/cli/", "/tests/", "/props/", "/bench/"}) {
    if (const char* p = std::strstr(file, dir)) { rel = p + 1; break; }
  }
  throw CheckError(ThreadRankPrefix() + rel + ":" + std::to_string(line) + ": " + what);
}
}  // namespace detail

}  // namespace ddpcheck::core
