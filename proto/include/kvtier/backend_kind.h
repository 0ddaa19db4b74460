// BackendKind: what moves kvtierd's blocks between the tiers, named once for the
// engine (tiering::Backend::kind), the wire (Welcome.backend) and the client.
// A value is also its number on the wire, so kinds are numbered from 0 without
// gaps and only ever appended.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvtier {

enum class BackendKind : uint8_t {
  kHost = 0,  // Shared memory as the GPU tier, a copy thread as the DMA engine.
  kCuda = 1,  // A CUDA device's memory, copies on CUDA streams.
};

// "host", "cuda" ("unknown" for a value with no kind).
constexpr const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kHost:
      return "host";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

// The kind BackendKindName spells `name`, or nullopt.
constexpr std::optional<BackendKind> ParseBackendKind(std::string_view name) {
  for (unsigned v = 0;; ++v) {  // Numbered from 0 without gaps: the first without a name ends them.
    const auto kind = static_cast<BackendKind>(v);
    const std::string_view known = BackendKindName(kind);
    if (known == "unknown") return std::nullopt;
    if (name == known) return kind;
  }
}

}  // namespace kvtier
