#include "loader/ring/ring_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

namespace nl::ring {
namespace {

Result<socklen_t> AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(addr->sun_path)) {
    return Status::InvalidArgument("socket name too long: " + name);
  }
  addr->sun_path[0] = '\0';  // abstract namespace: no file is ever made
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace

Result<Fd> ListenAbstract(const std::string& name) {
  sockaddr_un addr;
  NL_ASSIGN_OR_RETURN(socklen_t len, AbstractAddress(name, &addr));
  Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::FromErrno("socket(AF_UNIX)", errno);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) {
      return Status::AlreadyExists("another loader serve already serves this job and rank (" +
                                   name + ")");
    }
    return Status::FromErrno("bind(@" + name + ")", err);
  }
  if (::listen(fd.get(), 8) != 0) return Status::FromErrno("listen(@" + name + ")", errno);
  return fd;
}

Result<Fd> ConnectAbstract(const std::string& name) {
  sockaddr_un addr;
  NL_ASSIGN_OR_RETURN(socklen_t len, AbstractAddress(name, &addr));
  // Non-blocking: a producer whose backlog is full (stopped, or someone
  // else's socket that never accepts) must not hold the caller past its
  // timeout; the caller retries.
  Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::FromErrno("socket(AF_UNIX)", errno);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    if (err == ECONNREFUSED || err == ENOENT) {
      return Status::NotFound("no loader serve is listening on @" + name);
    }
    if (err == EAGAIN || err == EINTR) {
      return Status::NotFound("@" + name + " accepts no connection now (its backlog is full)");
    }
    return Status::FromErrno("connect(@" + name + ")", err);
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return Status::FromErrno("fcntl on the ring socket", errno);
  }
  return fd;
}

Result<Fd> Accept(int listen_fd) {
  Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
      return Status::NotFound("no pending connection");
    }
    return Status::FromErrno("accept", err);
  }
  return fd;
}

Result<PeerCred> GetPeerCred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno("getsockopt(SO_PEERCRED)", errno);
  }
  return PeerCred{cred.pid, cred.uid};
}

Message MakeMessage(MessageKind kind, const std::string& text) {
  Message m;
  m.kind = static_cast<uint32_t>(kind);
  m.pid = ::getpid();
  m.uid = ::geteuid();
  std::strncpy(m.text, text.c_str(), sizeof(m.text) - 1);
  return m;
}

Status SendMessage(int fd, const Message& m, int pass_fd) {
  iovec iov{const_cast<Message*>(&m), sizeof(m)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (pass_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  while (true) {
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(m))) return Status::Ok();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return Status::Unavailable("the peer closed the connection");
    }
    return Status::FromErrno("sendmsg on the ring socket", n < 0 ? errno : EIO);
  }
}

Status ReceiveMessage(int fd, int timeout_ms, Message* m, Fd* received) {
  pollfd p{fd, POLLIN, 0};
  while (true) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno("poll on the ring socket", errno);
    if (r == 0) return Status::DeadlineExceeded("no message within " + std::to_string(timeout_ms) + " ms");
    break;
  }
  iovec iov{m, sizeof(*m)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  // Take every descriptor that came, whatever the message: none may leak.
  bool got_fd = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed = -1;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        Fd owned(passed);  // closed here unless handed on
        if (!got_fd && received != nullptr) {
          *received = std::move(owned);
          got_fd = true;
        }
      }
    }
  }
  if (n == 0) return Status::Unavailable("the peer closed the connection");
  if (n < 0) {
    if (errno == ECONNRESET) return Status::Unavailable("the peer closed the connection");
    return Status::FromErrno("recvmsg on the ring socket", errno);
  }
  if (n != static_cast<ssize_t>(sizeof(*m)) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
      m->magic != kMessageMagic) {
    return Status::Corruption("a message on the ring socket is not one of ours (" +
                              std::to_string(n) + " bytes)");
  }
  m->text[sizeof(m->text) - 1] = '\0';
  return Status::Ok();
}

bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  const int r = ::poll(&p, 1, 0);
  return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace nl::ring
