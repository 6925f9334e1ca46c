// An in-process transport for Gloo: the ranks of a threads world exchange Gloo's messages by one copy from the
// sender's buffer into the receiver's, instead of through loopback TCP sockets (two copies through the kernel,
// and one event-loop thread receiving for every rank of the process).
//
// Gloo's collectives (gloo::allreduce's ring, broadcast, allgather, barrier) run unchanged on top: the same
// messages, the same slots, the same order, so the same bits. Only the wire differs. The semantics are those of
// Gloo's TCP transport (gloo/transport/tcp, Debian libgloo 0.5.0):
//   - a message on a pair is matched to the first receive posted for its slot, in the order both were posted
//     (per direction and slot), and it may be shorter than the receive (not longer: that is an error to both);
//   - a send completes once its bytes are in the receiver's buffer, which, as over TCP, needs the receive to be
//     posted (Gloo's sends wait for the peer's "receive ready" notification);
//   - waitRecv/waitSend time out with Gloo's words ("Timed out waiting N ms for recv operation to complete") and
//     then break every pair of the context ("Application timeout caused pair closure"), which the peers see as
//     a closed connection, as they see a pair that its rank closes or destroys ("Connection closed by peer").
// A pair's address names this process and the pair; connecting to an address of another process is refused
// (the ranks of a `ddpcheck launch` world are processes and connect over TCP).
#pragma once

#include <gloo/transport/device.h>

#include <memory>

namespace ddpcheck::sim {

// One device serves every context of the process (every rank of every threads world). Thread-safe.
std::shared_ptr<gloo::transport::Device> InProcessGlooDevice();

}  // namespace ddpcheck::sim
