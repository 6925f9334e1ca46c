// Turning Gloo's exception texts into parts of ddpcheck messages.
#pragma once

#include <string>

namespace ddpcheck::sim {

// Gloo's what() without its leading "[path/file.cc:81] " location prefixes:
//   "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 500ms for recv operation to complete"
//   -> "Timed out waiting 500ms for recv operation to complete"
std::string GlooErrorText(const std::string& what);

// True when the text says a Gloo or store wait ran out of time ("Timed out", "timeout").
bool IsGlooTimeout(const std::string& text);
// True when Gloo's error text says a peer's connection broke (reset, closed, EOF, broken pipe): the peer's
// process is likely gone.
bool IsPeerGone(const std::string& text);

}  // namespace ddpcheck::sim
