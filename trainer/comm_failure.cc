#include "trainer/comm_failure.h"

#include <c10/util/Exception.h>
#include <gloo/common/error.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <cerrno>
#include <string_view>
#include <system_error>

namespace nl::trainer {
namespace {

bool Contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

CommFailure ByErrno(int code) {
  switch (code) {
    case ETIMEDOUT:
      return CommFailure::kTimeout;
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case EHOSTUNREACH:
    case ENETUNREACH:
      return CommFailure::kPeerLost;
    default:
      return CommFailure::kOther;
  }
}

// The wordings of LibTorch 1.13 and Gloo (Debian's libtorch 1.13, libgloo
// 0.0~git20220518): timeouts first, since a timeout's text may also say the
// pair was closed.
CommFailure ByText(std::string_view t) {
  for (std::string_view timeout : {
           "Operation timed out!",                     // c10d::Work::wait(timeout)
           "Timed out waiting ",                       // gloo unbound buffer: "...ms for recv operation to complete"
           "Application timeout caused pair closure",  // gloo pair, after a timeout
           "Read timeout ", "Write timeout ", "Connect timeout ", "Send timeout ",  // gloo tcp pair
           "Socket Timeout",                           // c10d TCPStore
           "Wait timeout",                             // c10d stores' wait
           "Timeout waiting for key",                  // c10d stores' get
           "has timed out after",                      // c10d socket connect
       }) {
    if (Contains(t, timeout)) return CommFailure::kTimeout;
  }
  for (std::string_view lost : {
           "Connection closed by peer",  // gloo tcp pair
           "Connection reset by peer",   // strerror(ECONNRESET), in gloo's "Read error [peer]: ..."
           "Socket closed",              // gloo tcp pair
           "Socket unexpectedly closed",
           "Broken pipe",                // strerror(EPIPE)
           "Connection refused",         // strerror(ECONNREFUSED)
           "NCCL communicator was aborted",  // ProcessGroupNCCL, after another rank's failure
       }) {
    if (Contains(t, lost)) return CommFailure::kPeerLost;
  }
  return CommFailure::kOther;
}

}  // namespace

const char* CommFailureName(CommFailure f) {
  switch (f) {
    case CommFailure::kTimeout:
      return "timeout";
    case CommFailure::kPeerLost:
      return "peer lost";
    case CommFailure::kOther:
      return "other";
  }
  return "other";
}

std::string FailureText(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

CommFailure ClassifyCommFailure(const std::exception& e) {
  if (dynamic_cast<const c10d::TimeoutError*>(&e)) return CommFailure::kTimeout;
  if (const auto* s = dynamic_cast<const std::system_error*>(&e)) {
    if (s->code().category() == std::generic_category() || s->code().category() == std::system_category()) {
      if (const CommFailure f = ByErrno(s->code().value()); f != CommFailure::kOther) return f;
    }
  }
  const CommFailure by_text = ByText(FailureText(e));
  // Every gloo::IoException is the failure of a connection with a peer.
  if (by_text == CommFailure::kOther && dynamic_cast<const gloo::IoException*>(&e)) {
    return CommFailure::kPeerLost;
  }
  return by_text;
}

}  // namespace nl::trainer
