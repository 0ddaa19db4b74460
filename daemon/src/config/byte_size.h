// Sizes in the configuration: "64MiB", "2 GiB", "4096" (bytes).
#pragma once

#include <cstdint>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier::daemon {

// The largest size a key may take.
inline constexpr double kMaxByteSize = 1e15;
// "64MiB" / "2 GiB" / "4096" (bytes) -> bytes, at most kMaxByteSize (config.cc).
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace kvtier::daemon
