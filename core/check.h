// Broken invariants (bugs in ddpcheck): CHECK macros that throw CheckError with both values, the rank and
// file:line, e.g. "[rank 2/4] core/reducer.cc:57: bucket.numel == expected (1000 vs 1024): bucket 3".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddpcheck::core {

class CheckError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// The rank and world of the calling thread, for messages. Set by sim/ and real/ for each rank thread.
void SetThreadRank(int rank, int world);
std::string ThreadRankPrefix();  // "[rank 2/4] " or "" when unset

namespace detail {
inline void AppendAll(std::ostringstream&) {}
template <typename T, typename... Rest>
void AppendAll(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  AppendAll(os, rest...);
}
[[noreturn]] void ThrowCheck(const char* file, int line, const std::string& what);
}  // namespace detail

}  // namespace ddpcheck::core

#define DDPCHECK_CHECK(cond, ...)                                                      \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::ostringstream _os;                                                          \
      _os << #cond;                                                                    \
      std::ostringstream _msg;                                                         \
      ::ddpcheck::core::detail::AppendAll(_msg, ##__VA_ARGS__);                        \
      if (!_msg.str().empty()) _os << ": " << _msg.str();                              \
      ::ddpcheck::core::detail::ThrowCheck(__FILE__, __LINE__, _os.str());             \
    }                                                                                  \
  } while (0)

#define DDPCHECK_CHECK_OP(a, op, b, ...)                                               \
  do {                                                                                 \
    const auto& _a = (a);                                                              \
    const auto& _b = (b);                                                              \
    if (!(_a op _b)) {                                                                 \
      std::ostringstream _os;                                                          \
      _os << #a " " #op " " #b " (" << _a << " vs " << _b << ")";                      \
      std::ostringstream _msg;                                                         \
      ::ddpcheck::core::detail::AppendAll(_msg, ##__VA_ARGS__);                        \
      if (!_msg.str().empty()) _os << ": " << _msg.str();                              \
      ::ddpcheck::core::detail::ThrowCheck(__FILE__, __LINE__, _os.str());             \
    }                                                                                  \
  } while (0)

#define DDPCHECK_CHECK_EQ(a, b, ...) DDPCHECK_CHECK_OP(a, ==, b, ##__VA_ARGS__)
#define DDPCHECK_CHECK_NE(a, b, ...) DDPCHECK_CHECK_OP(a, !=, b, ##__VA_ARGS__)
#define DDPCHECK_CHECK_LT(a, b, ...) DDPCHECK_CHECK_OP(a, <, b, ##__VA_ARGS__)
#define DDPCHECK_CHECK_LE(a, b, ...) DDPCHECK_CHECK_OP(a, <=, b, ##__VA_ARGS__)
#define DDPCHECK_CHECK_GE(a, b, ...) DDPCHECK_CHECK_OP(a, >=, b, ##__VA_ARGS__)
