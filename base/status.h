// Status and Result<T>: the one error type of formats/ and loader/.
//
// A Status is ok (cheap: no allocation) or carries a code and a message that
// says what failed and where (file, shard, record index). Result<T> holds
// either a T or a non-ok Status.
//
//   Result<Image> img = DecodeImage(bytes, limits);
//   if (!img.ok()) return img.status().WithContext("record 17 of train/shard-00000");
//   Use(*img);
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace nl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something impossible
  kNotFound,           // a file, key or split does not exist
  kCorruption,         // stored bytes fail a check (bad magic, CRC, bounds)
  kIOError,            // the OS or a library failed to read or write
  kUnsupported,        // well-formed input we do not handle (e.g. BMP)
  kResourceExhausted,  // an input exceeds a configured limit
  kAlreadyExists,
  kAborted,             // interrupted (signal, cancellation)
  kOutOfRange,          // past the end (e.g. a loader run has no more batches)
  kFailedPrecondition,  // a call made in the wrong state (e.g. a second consumer)
  kInternal,
  kDeadlineExceeded,  // a wait ran out of time while its peer was alive (stuck, stopped)
  kUnavailable,       // the peer is gone (its process died or closed the connection)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status IOError(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  // errno-based I/O error: "<what>: <strerror(err)>".
  static Status FromErrno(std::string what, int err);
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status DeadlineExceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
  }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "Corruption: <message>", or "OK".
  std::string ToString() const;

  // Prefixes the message with where it happened: "<context>: <message>".
  // An ok status stays ok.
  Status WithContext(std::string_view context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when ok; shared so copies are cheap
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result constructed from an ok Status without a value");
    if (status_.ok()) status_ = Status::Internal("Result built from ok Status without value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace nl

// Returns early from the enclosing function when `expr` is not ok.
#define NL_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::nl::Status nl_status_ = (expr);        \
    if (!nl_status_.ok()) return nl_status_; \
  } while (0)

#define NL_CONCAT_INNER(a, b) a##b
#define NL_CONCAT(a, b) NL_CONCAT_INNER(a, b)
// NL_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its error.
#define NL_ASSIGN_OR_RETURN(lhs, rexpr)                                                       \
  auto NL_CONCAT(nl_result_, __LINE__) = (rexpr);                                             \
  if (!NL_CONCAT(nl_result_, __LINE__).ok()) return NL_CONCAT(nl_result_, __LINE__).status(); \
  lhs = std::move(NL_CONCAT(nl_result_, __LINE__)).value()
