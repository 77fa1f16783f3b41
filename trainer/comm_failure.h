// Why a c10d/Gloo call failed, as a value: the one place that tells a
// timeout from a lost peer. By type where LibTorch 1.13 gives one
// (c10d::TimeoutError, gloo::IoException, std::system_error's code); where
// it gives only text (c10::Error's "Operation timed out!", Gloo's "Timed out
// waiting ...ms for recv operation to complete", "Connection closed by peer
// [host]:port"), the text is matched here and nowhere else.
#pragma once

#include <exception>
#include <string>

namespace nl::trainer {

enum class CommFailure {
  kTimeout,   // a collective, a store call or a connection waited past its timeout
  kPeerLost,  // the connection to a peer (or the store) closed or reset
  kOther,     // anything else: a bug, a mismatch, memory
};
const char* CommFailureName(CommFailure f);  // "timeout", "peer lost", "other"

CommFailure ClassifyCommFailure(const std::exception& e);

// The exception's message without LibTorch's backtrace (c10::Error's
// what_without_backtrace; what() otherwise). May span lines.
std::string FailureText(const std::exception& e);

}  // namespace nl::trainer
