// Status: the channel for expected failures (bad input, I/O, a peer that never came).
// Every message says what went wrong, where (a file, a JSON path, a rank), and how to fix it when we know.
#pragma once

#include <string>
#include <utility>

namespace ddpcheck::core {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // bad input: scenario, flags, files. CLI exit code 2.
  kNotFound,         // a file or key that does not exist. CLI exit code 2.
  kIo,               // read/write failures, truncated files. CLI exit code 2.
  kTimeout,          // a collective some rank never joined. A finding: CLI exit code 1.
  kMismatch,         // ranks disagree on a collective's fingerprint or model shape. CLI exit code 1.
  kInternal,         // a bug in ddpcheck or a third-party library error.
};

class Status {
 public:
  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status Io(std::string m) { return Status(Code::kIo, std::move(m)); }
  static Status Timeout(std::string m) { return Status(Code::kTimeout, std::move(m)); }
  static Status Mismatch(std::string m) { return Status(Code::kMismatch, std::move(m)); }
  static Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: scenario.json: /world: must be >= 1, got 0"
  std::string ToString() const;
  // Prepends context: Status::Invalid("x").Prefixed("a.json") -> "a.json: x".
  Status Prefixed(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// The CLI's exit code for a status: 0 ok, 1 for findings (timeouts, mismatches), 2 for bad input.
int ExitCodeFor(const Status& s);

}  // namespace ddpcheck::core

#define DDPCHECK_RETURN_IF_ERROR(expr)                 \
  do {                                                 \
    ::ddpcheck::core::Status _ddpcheck_st = (expr);    \
    if (!_ddpcheck_st.ok()) return _ddpcheck_st;       \
  } while (0)
