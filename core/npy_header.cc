#include "core/npy_header.h"

#include <cctype>
#include <limits>
#include <set>

namespace ddpcheck::core {

namespace {

// A cursor over the header text with the few Python-literal productions numpy's header uses.
class Cursor {
 public:
  explicit Cursor(const std::string& t) : t_(t) {}

  void SkipSpace() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (i_ < t_.size() && t_[i_] == c) { ++i_; return true; }
    return false;
  }
  bool AtEnd() { SkipSpace(); return i_ >= t_.size(); }
  char Peek() { SkipSpace(); return i_ < t_.size() ? t_[i_] : '\0'; }
  size_t pos() const { return i_; }

  // A '...' or "..." string without escapes (numpy's keys and descr never contain any).
  bool String(std::string* out) {
    SkipSpace();
    if (i_ >= t_.size() || (t_[i_] != '\'' && t_[i_] != '"')) return false;
    char q = t_[i_];
    size_t end = t_.find(q, i_ + 1);
    if (end == std::string::npos) return false;
    *out = t_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return true;
  }
  bool Word(const char* w) {
    SkipSpace();
    std::string s(w);
    if (t_.compare(i_, s.size(), s) != 0) return false;
    i_ += s.size();
    return true;
  }
  // A non-negative decimal integer (Python may write 3L in very old files).
  bool Int(int64_t* out) {
    SkipSpace();
    size_t start = i_;
    int64_t v = 0;
    while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) {
      int d = t_[i_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - d) / 10) return false;
      v = v * 10 + d;
      ++i_;
    }
    if (i_ == start) return false;
    if (i_ < t_.size() && t_[i_] == 'L') ++i_;
    *out = v;
    return true;
  }
  // The raw text of the value starting here, up to the next top-level ',' or '}', for messages.
  std::string RawValue() {
    SkipSpace();
    int depth = 0;
    size_t start = i_;
    for (size_t j = i_; j < t_.size(); ++j) {
      char c = t_[j];
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) return t_.substr(start, j - start);
        --depth;
      }
      if (c == ',' && depth == 0) return t_.substr(start, j - start);
    }
    return t_.substr(start);
  }

 private:
  const std::string& t_;
  size_t i_ = 0;
};

Status Bad(const std::string& what) { return Status::Invalid("header: " + what); }

Status ParseShape(Cursor& c, std::vector<int64_t>* shape) {
  std::string raw = c.RawValue();
  auto bad = [&] { return Bad("'shape' must be a tuple of non-negative integers, got " + raw); };
  if (!c.Eat('(')) return bad();
  shape->clear();
  while (!c.Eat(')')) {
    int64_t d;
    if (!c.Int(&d)) return bad();
    shape->push_back(d);
    if (!c.Eat(',') && c.Peek() != ')') return bad();
  }
  return Status::Ok();
}

}  // namespace

Status ParseNpyHeader(const std::string& text, NpyHeader* out) {
  Cursor c(text);
  if (!c.Eat('{')) return Bad("expected a dictionary starting with '{', got '" + text.substr(0, 40) + "'");
  std::set<std::string> seen;
  while (!c.Eat('}')) {
    std::string key;
    if (!c.String(&key)) return Bad("expected a quoted key at offset " + std::to_string(c.pos()));
    if (!c.Eat(':')) return Bad("expected ':' after '" + key + "'");
    if (!seen.insert(key).second) return Bad("key '" + key + "' appears twice");
    if (key == "descr") {
      if (!c.String(&out->descr)) {
        return Bad("'descr' must be a simple dtype string such as '<f4', got " + c.RawValue() +
                   " (structured arrays are not supported)");
      }
    } else if (key == "fortran_order") {
      if (c.Word("True")) {
        out->fortran_order = true;
      } else if (c.Word("False")) {
        out->fortran_order = false;
      } else {
        return Bad("'fortran_order' must be True or False, got " + c.RawValue());
      }
    } else if (key == "shape") {
      DDPCHECK_RETURN_IF_ERROR(ParseShape(c, &out->shape));
    } else {
      return Bad("unknown key '" + key + "'; expected descr, fortran_order, shape");
    }
    if (!c.Eat(',') && c.Peek() != '}') return Bad("expected ',' or '}' at offset " + std::to_string(c.pos()));
  }
  if (!c.AtEnd()) return Bad("unexpected text after the dictionary at offset " + std::to_string(c.pos()));
  for (const char* k : {"descr", "fortran_order", "shape"}) {
    if (!seen.count(k)) return Bad(std::string("missing key '") + k + "'");
  }
  return Status::Ok();
}

std::string FormatNpyHeader(const NpyHeader& h) {
  std::string shape = "(";
  for (size_t i = 0; i < h.shape.size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(h.shape[i]);
  }
  if (h.shape.size() == 1) shape += ",";
  shape += ")";
  return "{'descr': '" + h.descr + "', 'fortran_order': " + (h.fortran_order ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

}  // namespace ddpcheck::core
