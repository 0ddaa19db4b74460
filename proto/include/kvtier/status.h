// Status and Result<T>: how every fallible kvtier call reports failure.
//
// A failure that a caller can foresee (a full pool, an unknown session, a bad
// frame) is a returned Status; a broken invariant aborts. Codes travel on the
// wire unchanged, so values are stable: append, never renumber.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

enum class StatusCode : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,     // The request is malformed (bad count, bad geometry, ...).
  kNotFound = 2,            // The named session, lease or block does not exist.
  kResourceExhausted = 3,   // A pool, table or limit is full; retrying later may work.
  kFailedPrecondition = 4,  // The object is in a state that forbids the call (leased, moving).
  kAlreadyExists = 5,       // Something with that name exists and may not be replaced.
  kUnavailable = 6,         // The daemon is unreachable or restarted; reconnect and retry.
  kProtocolError = 7,       // A frame could not be decoded.
  kVersionMismatch = 8,     // Peer speaks another protocol or ABI version.
  kPermissionDenied = 9,    // The caller may not do this.
  kTimeout = 10,            // A deadline passed before the operation finished.
  kCorrupt = 11,            // Stored data failed validation (magic, checksum, tokens).
  kInternal = 12,           // A bug; the message says where.
};

// Stable, lower-case name of a code ("resource_exhausted"), for logs and JSON.
std::string_view StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "resource_exhausted: gpu tier full (0 of 64 slots free)".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that explains its absence.
// REQUIRES: value() is called only when ok().
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvtier

#define KVTIER_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::kvtier::Status _kvtier_st = (expr);   \
    if (!_kvtier_st.ok()) return _kvtier_st; \
  } while (0)
