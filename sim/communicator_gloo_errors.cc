#include "sim/communicator_gloo_errors.h"

namespace ddpcheck::sim {

std::string GlooErrorText(const std::string& what) {
  size_t pos = 0;
  while (pos < what.size() && what[pos] == '[') {
    size_t close = what.find("] ", pos);
    if (close == std::string::npos) break;
    pos = close + 2;
  }
  return what.substr(pos);
}

bool IsGlooTimeout(const std::string& text) {
  return text.find("Timed out") != std::string::npos || text.find("timed out") != std::string::npos ||
         text.find("imeout") != std::string::npos;
}

bool IsPeerGone(const std::string& text) {
  // "Connection refused": a peer's listening pair is gone while the mesh connects (the peer gave up first, e.g. on
  // a timeout of a few ms); that is the peer's end, not an internal error (QA round 19).
  for (const char* sign : {"Connection reset", "Connection closed", "connection closed", "Broken pipe", "EOF",
                           "Read error", "Write error", "Socket closed", "Connection refused"}) {
    if (text.find(sign) != std::string::npos) return true;
  }
  return false;
}

}  // namespace ddpcheck::sim
