#include "kvtier/status.h"

namespace kvtier {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kAlreadyExists: return "already_exists";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kProtocolError: return "protocol_error";
    case StatusCode::kVersionMismatch: return "version_mismatch";
    case StatusCode::kPermissionDenied: return "permission_denied";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string out(StatusCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

}  // namespace kvtier
