#include "core/json_reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/file.h"
#include "core/suggest.h"

namespace ddpcheck::core {

using nlohmann::json;

namespace {

// The first place where `text` nests arrays/objects deeper than kMaxJsonDepth, skipping strings and
// comments; false when it never does. Line and column are 1-based, as nlohmann's syntax errors count them.
bool FindTooDeep(const std::string& text, size_t* line, size_t* column) {
  int depth = 0;
  *line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++*line;
      line_start = i + 1;
    } else if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      i = std::min(text.find('\n', i), text.size()) - 1;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      i = std::min(text.find("*/", i + 2), text.size()) + 1;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        *column = i - line_start + 1;
        return true;
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

Status ParseJsonText(const std::string& text, const std::string& name, json* out) {
  size_t line = 0, column = 0;
  if (FindTooDeep(text, &line, &column)) {
    return Status::Invalid(name + ": JSON nested " + std::to_string(kMaxJsonDepth + 1) + " levels deep at line " +
                           std::to_string(line) + ", column " + std::to_string(column) + "; ddpcheck accepts at most " +
                           std::to_string(kMaxJsonDepth) + " levels of arrays and objects");
  }
  // A key twice in one object: the parser keeps the last silently, so an edited file could hide a value (QA round
  // 16: a dump index with "steps" twice passed on the second). Named with its JSON pointer: each open object or
  // array is a frame holding its keys so far, or the index of the element being read.
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
    std::set<std::string> keys;
  };
  std::vector<Frame> frames;
  std::string twice, twice_at;
  const auto element_done = [&] {
    if (!frames.empty() && frames.back().array) ++frames.back().index;
  };
  const json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames.push_back(Frame{}); break;
      case json::parse_event_t::array_start: frames.push_back(Frame{true}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        element_done();
        break;
      case json::parse_event_t::value: element_done(); break;  // (primitives only: containers end above)
      case json::parse_event_t::key:
        if (frames.empty() || !parsed.is_string()) break;
        frames.back().key = parsed.get<std::string>();
        if (twice.empty() && !frames.back().keys.insert(frames.back().key).second) {
          twice = frames.back().key;
          for (const Frame& f : frames) twice_at = f.array ? JsonPath(twice_at, f.index) : JsonPath(twice_at, f.key);
        }
        break;
    }
    return true;
  };
  try {
    *out = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    // parse_error: "[json.exception.parse_error.101] parse error at line 3, column 14: syntax error ...";
    // out_of_range (a number beyond a double, 1e400): "[json.exception.out_of_range.406] number overflow ...".
    std::string what = e.what();
    size_t at = what.find("at line ");
    if (at != std::string::npos) return Status::Invalid(name + ": JSON syntax error at " + what.substr(at + 3));
    size_t close = what.find("] ");
    // Where: the token the message quotes ("number overflow parsing '1e400'"), first found in the text (QA round
    // 16: the message named no line).
    std::string where;
    const size_t q0 = what.find('\''), q1 = q0 == std::string::npos ? q0 : what.find('\'', q0 + 1);
    if (q1 != std::string::npos && q1 > q0 + 1) {
      const size_t pos = text.find(what.substr(q0 + 1, q1 - q0 - 1));
      if (pos != std::string::npos) {
        const size_t ln = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
        const size_t bol = text.rfind('\n', pos == 0 ? 0 : pos - 1);
        const size_t col = pos - (bol == std::string::npos || pos == 0 ? 0 : bol + 1) + 1;
        where = " at line " + std::to_string(ln) + ", column " + std::to_string(col);
      }
    }
    return Status::Invalid(name + ": JSON error" + where + ": " +
                           (close == std::string::npos ? what : what.substr(close + 2)) + " (numbers must fit a double)");
  }
  if (!twice.empty()) {
    return Status::Invalid(name + ": " + twice_at + ": the key " + json(twice).dump() + " is in its object twice (JSON "
                           "keeps only the last): an edited file? keep one");
  }
  return Status::Ok();
}

Status ReadJsonFile(const std::string& path, json* out) {
  std::string text;
  DDPCHECK_RETURN_IF_ERROR(ReadFileToString(path, &text));
  return ParseJsonText(text, path, out);
}

std::string JsonPath(const std::string& path, const std::string& key) {
  std::string escaped;
  for (char c : key) {
    if (c == '~') escaped += "~0";
    else if (c == '/') escaped += "~1";
    else escaped += c;
  }
  return path + "/" + escaped;
}

std::string JsonPath(const std::string& path, size_t index) { return path + "/" + std::to_string(index); }

std::string DescribeJson(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

bool HasControlCharacters(const std::string& text) {
  return std::any_of(text.begin(), text.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

Status NoControlCharacters(const json& v, const std::string& path, const std::string& free_text) {
  // Depth first with an explicit stack: a hostile document nests deeper than the call stack would go. Only strings
  // and containers are visited (a scenario's inline data is millions of numbers).
  std::vector<std::pair<const json*, std::string>> todo{{&v, path}};
  const auto visit = [&](const json& child, std::string at) {
    if (child.is_string() || child.is_structured()) todo.emplace_back(&child, std::move(at));
  };
  while (!todo.empty()) {
    auto [node, at] = todo.back();
    todo.pop_back();
    if (node->is_string()) {
      if (HasControlCharacters(node->get_ref<const std::string&>())) {
        return JsonError(at.empty() ? "/" : at, "must not hold control characters (a newline, a tab or an escape "
                                                "sequence would forge lines of the report)", *node);
      }
    } else if (node->is_object()) {
      for (const auto& item : node->items()) {
        if (HasControlCharacters(item.key())) {
          return Status::Invalid(fmt::format("{}: a key holds a control character: {}", at.empty() ? "/" : at,
                                             json(item.key()).dump()));
        }
        if (node == &v && !free_text.empty() && item.key() == free_text) continue;
        visit(item.value(), JsonPath(at, item.key()));
      }
    } else if (node->is_array()) {
      for (size_t i = 0; i < node->size(); ++i) visit((*node)[i], JsonPath(at, i));
    }
  }
  return Status::Ok();
}

Status JsonError(const std::string& path, const std::string& expected, const json& found) {
  return Status::Invalid(path + ": " + expected + ", got " + DescribeJson(found));
}

namespace {
// An integral float within the range where doubles are exact.
bool IntegralFloat(const json& v, double* d) {
  if (!v.is_number_float()) return false;
  *d = v.get<double>();
  return std::isfinite(*d) && *d == std::floor(*d) && std::fabs(*d) <= 0x1p53;
}
}  // namespace

Status ReadInt64(const json& v, const std::string& path, int64_t* out) {
  double d;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    *out = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return JsonError(path, "must be an integer below 2^63", v);
    }
    *out = static_cast<int64_t>(u);
  } else if (IntegralFloat(v, &d)) {
    *out = static_cast<int64_t>(d);
  } else {
    return JsonError(path, "must be an integer", v);
  }
  return Status::Ok();
}

Status ReadUint64(const json& v, const std::string& path, uint64_t* out) {
  double d;
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {  // (a document built in code: signed 3)
    *out = static_cast<uint64_t>(v.get<int64_t>());
  } else if (v.is_number_integer() || (IntegralFloat(v, &d) && d < 0)) {
    return JsonError(path, "must be a non-negative integer", v);
  } else if (IntegralFloat(v, &d)) {
    *out = static_cast<uint64_t>(d);
  } else {
    return JsonError(path, "must be a non-negative integer", v);
  }
  return Status::Ok();
}

Status ReadDouble(const json& v, const std::string& path, double* out) {
  if (!v.is_number()) return JsonError(path, "must be a number", v);
  *out = v.get<double>();
  return Status::Ok();
}

Status ReadBool(const json& v, const std::string& path, bool* out) {
  if (!v.is_boolean()) return JsonError(path, "must be true or false", v);
  *out = v.get<bool>();
  return Status::Ok();
}

Status ReadString(const json& v, const std::string& path, std::string* out) {
  if (!v.is_string()) return JsonError(path, "must be a string", v);
  *out = v.get<std::string>();
  return Status::Ok();
}

namespace {

// Appends the values of `v` (shape `shape` from depth `depth` on) in C order.
Status Flatten(const json& v, const std::string& path, const std::vector<int64_t>& shape, size_t depth,
               std::vector<double>* values, bool* all_int) {
  if (depth == shape.size()) {
    if (!v.is_number()) return JsonError(path, "must be a number", v);
    if (!v.is_number_integer()) *all_int = false;
    if (v.is_number_integer()) {
      int64_t i = 0;
      DDPCHECK_RETURN_IF_ERROR(ReadInt64(v, path, &i));
      if (i > (int64_t{1} << 53) || i < -(int64_t{1} << 53)) {
        return JsonError(path, "must be an integer of magnitude <= 2^53", v);
      }
      values->push_back(static_cast<double>(i));
    } else {
      values->push_back(v.get<double>());
    }
    return Status::Ok();
  }
  if (!v.is_array() || static_cast<int64_t>(v.size()) != shape[depth]) {
    return JsonError(path, "must be an array of " + std::to_string(shape[depth]) + " (rows must have equal lengths)",
                     v);
  }
  for (size_t i = 0; i < v.size(); ++i) {
    DDPCHECK_RETURN_IF_ERROR(Flatten(v[i], JsonPath(path, i), shape, depth + 1, values, all_int));
  }
  return Status::Ok();
}

}  // namespace

Status ReadTensor(const json& v, const std::string& path, bool allow_int, Tensor* out) {
  std::vector<int64_t> shape;
  for (const json* cur = &v; cur->is_array(); cur = &(*cur)[0]) {
    shape.push_back(static_cast<int64_t>(cur->size()));
    if (cur->empty()) break;
  }
  if (!v.is_array() && !v.is_number()) return JsonError(path, "must be a number or a nested array of numbers", v);
  std::vector<double> values;
  bool all_int = true;
  if (NumelOf(shape) > 0 || shape.empty()) DDPCHECK_RETURN_IF_ERROR(Flatten(v, path, shape, 0, &values, &all_int));
  DType dtype = allow_int && all_int && !values.empty() ? DType::kInt64 : DType::kFloat64;
  *out = Tensor(dtype, shape, std::move(values));
  return Status::Ok();
}

namespace {
json TensorToJsonFrom(const Tensor& t, size_t depth, size_t* next) {
  if (depth == t.shape.size()) {
    double v = t.data[(*next)++];
    if (!IsFloating(t.dtype)) return json(static_cast<int64_t>(v));
    return json(v);
  }
  json a = json::array();
  for (int64_t i = 0; i < t.shape[depth]; ++i) a.push_back(TensorToJsonFrom(t, depth + 1, next));
  return a;
}
}  // namespace

json TensorToJson(const Tensor& t) {
  size_t next = 0;
  return TensorToJsonFrom(t, 0, &next);
}

Status JsonObject::Open(const json& v, const std::string& path, const std::vector<std::string>& allowed,
                        JsonObject* out) {
  if (!v.is_object()) return JsonError(path.empty() ? "/" : path, "must be an object", v);
  for (const auto& item : v.items()) {
    bool known = false;
    for (const auto& a : allowed) known = known || a == item.key();
    if (!known) {
      return Status::Invalid(JsonPath(path, item.key()) + ": unknown key; " + SuggestionFor(item.key(), allowed));
    }
  }
  out->v_ = &v;
  out->path_ = path;
  return Status::Ok();
}

Status JsonObject::Require(const std::string& key, const std::string& what) const {
  if (Has(key)) return Status::Ok();
  return Status::Invalid(PathOf(key) + ": missing; " + what);
}

Status JsonObject::Int(const std::string& key, int64_t* out) const {
  return Has(key) ? ReadInt64(At(key), PathOf(key), out) : Status::Ok();
}

Status JsonObject::Int(const std::string& key, int* out) const {
  if (!Has(key)) return Status::Ok();
  int64_t v = 0;
  DDPCHECK_RETURN_IF_ERROR(ReadInt64(At(key), PathOf(key), &v));
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return JsonError(PathOf(key), "must be a 32-bit integer", At(key));
  }
  *out = static_cast<int>(v);
  return Status::Ok();
}

Status JsonObject::Uint(const std::string& key, uint64_t* out) const {
  return Has(key) ? ReadUint64(At(key), PathOf(key), out) : Status::Ok();
}

Status JsonObject::Double(const std::string& key, double* out) const {
  return Has(key) ? ReadDouble(At(key), PathOf(key), out) : Status::Ok();
}

Status JsonObject::Bool(const std::string& key, bool* out) const {
  return Has(key) ? ReadBool(At(key), PathOf(key), out) : Status::Ok();
}

Status JsonObject::String(const std::string& key, std::string* out) const {
  return Has(key) ? ReadString(At(key), PathOf(key), out) : Status::Ok();
}

Status JsonObject::Enum(const std::string& key, const std::vector<std::string>& choices, std::string* out) const {
  if (!Has(key)) return Status::Ok();
  std::string s;
  DDPCHECK_RETURN_IF_ERROR(ReadString(At(key), PathOf(key), &s));
  for (const auto& c : choices) {
    if (c == s) { *out = s; return Status::Ok(); }
  }
  return Status::Invalid(PathOf(key) + ": unknown value '" + s + "'; " + SuggestionFor(s, choices));
}

}  // namespace ddpcheck::core
