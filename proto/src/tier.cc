#include "kvtier/tier.h"

namespace kvtier {

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return "gpu";
    case Tier::kHost: return "host";
  }
  return "unknown";
}

std::optional<Tier> ParseTier(std::string_view name) {
  for (Tier t : kTiers) {
    if (name == TierName(t)) return t;
  }
  return std::nullopt;
}

}  // namespace kvtier
