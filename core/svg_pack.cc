#include "core/svg_pack.h"

#include <cctype>
#include <map>
#include <set>
#include <vector>

namespace ddpcheck::core {

namespace {

// Presentation attributes that mean the same as CSS properties (lengths get "px": CSS needs a unit).
const std::set<std::string>& StyleAttributes() {
  static const std::set<std::string> names = {"fill", "color", "stroke", "stroke-width", "stroke-linecap",
                                              "stroke-linejoin", "font-family", "font-size", "text-anchor"};
  return names;
}

bool IsLength(const std::string& name) { return name == "stroke-width" || name == "font-size"; }

std::string DropTitleAndDesc(std::string s) {
  for (const char* tag : {"title", "desc"}) {
    const std::string open = std::string("<") + tag + ">", close = std::string("</") + tag + ">";
    for (size_t a = s.find(open); a != std::string::npos; a = s.find(open, a)) {
      const size_t b = s.find(close, a);
      if (b == std::string::npos) break;
      s.erase(a, b + close.size() - a);
    }
  }
  return s;
}

// Whitespace between tags (gnuplot's text lives inside <text> elements, never between tags).
std::string DropWhitespaceBetweenTags(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] != '>') continue;
    size_t j = i + 1;
    while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j < s.size() && s[j] == '<') i = j - 1;
  }
  return out;
}

// Inside tags only (never in text): no spaces around '=', runs of spaces as one, also inside attribute values
// (lists of points and rgb() colours, where any whitespace separates alike), none before '>' or "/>".
std::string PackTags(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool in_tag = false;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (!in_tag) {
      in_tag = c == '<';
      out += c;
      continue;
    }
    if (quote) {
      if (c == quote) quote = 0;
      if (c == ' ') {
        const size_t next = s.find_first_not_of(' ', i);
        if (out.back() == ' ' || out.back() == '(' || next == std::string::npos || s[next] == quote) continue;
      }
      out += c;
      continue;
    }
    if (c == ' ' || c == '\n' || c == '\t') {
      const char next = i + 1 < s.size() ? s[i + 1] : '>';
      if (out.back() == ' ' || out.back() == '=' || next == '=' || next == '>' || next == '/' || next == ' ' ||
          next == '\n') {
        continue;
      }
      out += ' ';
      continue;
    }
    if (c == '"' || c == '\'') quote = c;
    if (c == '>') in_tag = false;
    out += c;
  }
  return out;
}

std::string DropEmptyGroups(std::string s) {
  for (size_t before = 0; before != s.size();) {  // until none is left: removing one can empty its parent
    before = s.size();
    for (size_t g = s.find("<g "); g != std::string::npos; g = s.find("<g ", g)) {
      const size_t close = s.find('>', g);
      if (close != std::string::npos && s.compare(close + 1, 4, "</g>") == 0) s.erase(g, close + 5 - g);
      else ++g;
    }
  }
  return s;
}

// Parses the attributes of one start tag body ("fill=\"none\" stroke='x'"); false when it cannot.
bool ParseAttributes(const std::string& body, std::vector<std::pair<std::string, std::string>>* out) {
  size_t i = 0;
  while (i < body.size()) {
    while (i < body.size() && body[i] == ' ') ++i;
    if (i >= body.size()) break;
    const size_t eq = body.find('=', i);
    if (eq == std::string::npos || eq + 1 >= body.size()) return false;
    const char q = body[eq + 1];
    if (q != '"' && q != '\'') return false;
    const size_t end = body.find(q, eq + 2);
    if (end == std::string::npos) return false;
    out->emplace_back(body.substr(i, eq - i), body.substr(eq + 2, end - eq - 2));
    i = end + 1;
  }
  return true;
}

// <g ...> start tags: their style attributes become a class.
std::string GroupStylesToClasses(const std::string& s, const std::string& prefix) {
  std::map<std::string, std::string> classes;  // CSS declarations -> class name
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t g = s.find("<g "); g != std::string::npos; g = s.find("<g ", pos)) {
    const size_t close = s.find('>', g);
    if (close == std::string::npos) break;
    out.append(s, pos, g - pos);
    pos = close + 1;
    std::vector<std::pair<std::string, std::string>> attrs;
    if (!ParseAttributes(s.substr(g + 3, close - g - 3), &attrs)) {
      out.append(s, g, close + 1 - g);
      continue;
    }
    std::string css, rest;
    for (const auto& [name, value] : attrs) {
      if (StyleAttributes().count(name) && value.find_first_of(";{}") == std::string::npos) {
        const bool number = !value.empty() && (std::isdigit(static_cast<unsigned char>(value.back())));
        css += name + ":" + value + (IsLength(name) && number ? "px" : "") + ";";
      } else {
        rest += " " + name + "=\"" + value + "\"";
      }
    }
    if (css.empty()) {
      out.append(s, g, close + 1 - g);
      continue;
    }
    auto [it, inserted] = classes.emplace(css, prefix + "g" + std::to_string(classes.size()));
    out += "<g class=\"" + it->second + "\"" + rest + ">";
  }
  out.append(s, pos, std::string::npos);
  if (classes.empty()) return out;
  std::string style = "<style>";
  for (const auto& [css, name] : classes) style += "." + name + "{" + css + "}";
  style += "</style>";
  const size_t svg_open = out.find("<svg");
  const size_t svg_end = svg_open == std::string::npos ? std::string::npos : out.find('>', svg_open);
  if (svg_end == std::string::npos) return s;  // not an SVG: leave it as it was
  return out.insert(svg_end + 1, style);
}

}  // namespace

std::string PackSvg(const std::string& svg, const std::string& prefix) {
  return GroupStylesToClasses(DropEmptyGroups(PackTags(DropWhitespaceBetweenTags(DropTitleAndDesc(svg)))), prefix);
}

}  // namespace ddpcheck::core
