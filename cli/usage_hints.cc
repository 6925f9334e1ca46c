#include "cli/usage_hints.h"

#include <algorithm>
#include <utility>

#include "core/suggest.h"

namespace ddpcheck::cli {

std::string UnknownCommandHint(const std::string& word, const std::vector<std::string>& commands) {
  if (word.empty() || word[0] == '-') return "";
  if (std::find(commands.begin(), commands.end(), word) != commands.end()) return "";
  return "unknown command '" + word + "': " + core::SuggestionFor(word, commands) +
         " (`ddpcheck --help` lists the commands)";
}

std::string UnknownOptionHints(const CLI::App& sub, const std::vector<std::string>& extras) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : sub.get_options()) {
    for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    for (const auto& s : opt->get_snames()) names.push_back("-" + s);
  }
  const std::string where = "'ddpcheck " + sub.get_name() + "'";
  std::string out;
  bool value_may_follow = false;  // an unknown option written without '=': the next word is its value
  for (const auto& arg : extras) {
    if (arg.size() > 1 && arg[0] == '-') {
      const std::string flag = arg.substr(0, arg.find('='));  // --wrold=8 -> --wrold
      const std::string hint = core::SuggestionFor(flag, names);  // "expected one of" all options: too long
      out += "unknown option '" + flag + "' for " + where + (hint.rfind("did you mean", 0) == 0 ? ": " + hint : "") +
             " (`ddpcheck " + sub.get_name() + " --help` lists the options)\n";
      value_may_follow = arg.find('=') == std::string::npos;
    } else if (std::exchange(value_may_follow, false)) {
      continue;  // (`--wrold 8`: one line for the option, not a second for its value)
    } else {
      out += "unexpected argument '" + arg + "' for " + where + " (`ddpcheck " + sub.get_name() +
             " --help` shows the usage)\n";
    }
  }
  return out;
}

}  // namespace ddpcheck::cli
