// The ring's UNIX domain socket: abstract namespace (no file), SOCK_SEQPACKET
// (message boundaries kept, and a close is seen at once by the peer), the
// segment's descriptor passed with SCM_RIGHTS, the peer's uid from SO_PEERCRED.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "base/fd.h"
#include "base/status.h"

namespace nl::ring {

using nl::Fd;  // an owned descriptor (base/fd.h)

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
};

// Binds and listens on the abstract name. AlreadyExists when it is taken.
Result<Fd> ListenAbstract(const std::string& name);
// Connects to the abstract name. NotFound when no one listens.
Result<Fd> ConnectAbstract(const std::string& name);
// Accepts one pending connection (non-blocking listener: NotFound when none).
Result<Fd> Accept(int listen_fd);
Result<PeerCred> GetPeerCred(int fd);

// The messages (fixed size, one per packet).
inline constexpr uint64_t kMessageMagic = 0x47534d474e52444cull;  // "LDRNGMSG"
enum class MessageKind : uint32_t {
  kSegment = 1,   // producer -> consumer: here is the segment (descriptor attached)
  kRefused = 2,   // either way: refused, text says why
  kDetach = 3,    // consumer -> producer: goodbye, exit cleanly
};
struct Message {
  uint64_t magic = kMessageMagic;
  uint32_t kind = 0;
  uint32_t version = 0;
  int32_t pid = 0;
  uint32_t uid = 0;
  uint64_t segment_bytes = 0;
  char text[480] = {};
};
static_assert(sizeof(Message) == 512);

Message MakeMessage(MessageKind kind, const std::string& text);
// Sends one message, with `pass_fd` attached when >= 0. Never raises SIGPIPE.
Status SendMessage(int fd, const Message& m, int pass_fd = -1);
// Receives one message within timeout_ms (< 0: no limit). A descriptor that
// came with it lands in *received (always taken, so none leaks). Unavailable
// when the peer closed; DeadlineExceeded on timeout.
Status ReceiveMessage(int fd, int timeout_ms, Message* m, Fd* received);

// Non-blocking: whether the peer has closed its end (or the socket failed).
// A pending message is read into *pending when given (else left).
bool PeerClosed(int fd);

}  // namespace nl::ring
