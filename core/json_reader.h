// Typed reads from nlohmann::json with errors that name the JSON pointer path and say what was expected and
// what was found: "/ddp/bucket_cap_mb: must be a number, got \"25\"". Integers are read exactly as int64 or
// uint64 (never through a double). The caller prefixes the file name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace ddpcheck::core {

// The deepest nesting of arrays and objects accepted in any JSON file ddpcheck reads. A scenario nests about 4
// levels, an inline tensor adds its rank, a trace or dump index about 5; deeper input is hostile (the
// recursive printers and readers would exhaust the stack), so it is refused before anything walks it.
constexpr int kMaxJsonDepth = 64;

// Parses `text` (// and /* */ comments allowed) into *out. Errors are InvalidArgument naming `name`:
//   "s.json: JSON syntax error at line 3, column 14: ..."
//   "s.json: JSON nested 65 levels deep at line 1, column 65; ddpcheck accepts at most 64 levels of arrays and objects"
Status ParseJsonText(const std::string& text, const std::string& name, nlohmann::json* out);
// ReadFileToString + ParseJsonText.
Status ReadJsonFile(const std::string& path, nlohmann::json* out);

// `path` + "/" + key with RFC 6901 escaping (~ -> ~0, / -> ~1).
std::string JsonPath(const std::string& path, const std::string& key);
std::string JsonPath(const std::string& path, size_t index);
// A short rendering of a value for messages: its JSON text, cut to about 60 characters.
std::string DescribeJson(const nlohmann::json& v);
// InvalidArgument "<path>: <expected>, got <found>".
Status JsonError(const std::string& path, const std::string& expected, const nlohmann::json& found);
// Whether `text` holds a control character (U+0000-U+001F, U+007F).
bool HasControlCharacters(const std::string& text);
// InvalidArgument naming the first string or key of `v` (depth first, under `path`) that holds a control
// character: a name with a newline or an escape sequence forges lines of the report (QA round 16: a scenario named
// "x\nVERDICT: PASS ..." printed a PASS line above its FAIL). `free_text`: a key of `v` itself whose value is
// free text no report line prints (a scenario's description), not looked at.
Status NoControlCharacters(const nlohmann::json& v, const std::string& path, const std::string& free_text = "");

// Reads one value at `path`. Integers: JSON integers, or floats with an integral value of magnitude <= 2^53.
Status ReadInt64(const nlohmann::json& v, const std::string& path, int64_t* out);
Status ReadUint64(const nlohmann::json& v, const std::string& path, uint64_t* out);
Status ReadDouble(const nlohmann::json& v, const std::string& path, double* out);
Status ReadBool(const nlohmann::json& v, const std::string& path, bool* out);
Status ReadString(const nlohmann::json& v, const std::string& path, std::string* out);
// A number or a nested array of numbers with a rectangular shape ([[1, 2], [3, 4]] -> (2, 2); 5 -> ()).
// dtype int64 when every value is a JSON integer (and `allow_int` is set), float64 otherwise.
Status ReadTensor(const nlohmann::json& v, const std::string& path, bool allow_int, Tensor* out);
// The inverse: nested arrays in C order; integers for int dtypes.
nlohmann::json TensorToJson(const Tensor& t);

// An object whose keys are checked against a fixed list when opened; reads leave *out unchanged when the key
// is absent (so struct defaults apply) unless the key is Required.
class JsonObject {
 public:
  // Fails when `v` is not an object ("<path>: must be an object, got [1]") or has a key not in `allowed`
  // ("<path>/optimiser: unknown key; did you mean 'optimizer'?").
  static Status Open(const nlohmann::json& v, const std::string& path, const std::vector<std::string>& allowed,
                     JsonObject* out);

  bool Has(const std::string& key) const { return v_->contains(key); }
  const nlohmann::json& At(const std::string& key) const { return v_->at(key); }
  std::string PathOf(const std::string& key) const { return JsonPath(path_, key); }
  const std::string& path() const { return path_; }
  // "<path>/<key>: missing; <what it is>" when absent.
  Status Require(const std::string& key, const std::string& what) const;

  Status Int(const std::string& key, int64_t* out) const;
  Status Int(const std::string& key, int* out) const;
  Status Uint(const std::string& key, uint64_t* out) const;
  Status Double(const std::string& key, double* out) const;
  Status Bool(const std::string& key, bool* out) const;
  Status String(const std::string& key, std::string* out) const;
  // A string that must be one of `choices`: "<path>: unknown value 'adamm'; did you mean 'adam'?".
  Status Enum(const std::string& key, const std::vector<std::string>& choices, std::string* out) const;

 private:
  const nlohmann::json* v_ = nullptr;
  std::string path_;
};

}  // namespace ddpcheck::core
