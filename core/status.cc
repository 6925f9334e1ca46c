#include "core/status.h"

namespace ddpcheck::core {

namespace {
const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kIo: return "I/O error";
    case Code::kTimeout: return "timeout";
    case Code::kMismatch: return "mismatch";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}
}  // namespace

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::Prefixed(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case Code::kOk: return 0;
    case Code::kTimeout:
    case Code::kMismatch: return 1;
    case Code::kInternal: return 3;
    default: return 2;
  }
}

}  // namespace ddpcheck::core
