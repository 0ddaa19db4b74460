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

std::string PlaceName(uint8_t place, std::span<const std::string> stores) {
  if (place < kTierCount) return TierName(static_cast<Tier>(place));
  if (place == kPlaceNowhere) return "nowhere";
  if (place == kPlaceUnknown) return "unknown";
  if (place >= kPlaceStoreBase) {
    const size_t i = place - kPlaceStoreBase;
    return i < stores.size() ? stores[i] : "store" + std::to_string(i);
  }
  return "tier" + std::to_string(place);
}

}  // namespace kvtier
