// Tier: where a block's bytes live, and a small array indexed by it.
//
// The engine, the wire format and the shared index all name tiers by this one
// enum. Tiers are ordered fastest first; a value is also the tier's number on
// the wire and in the index (IndexSlot::tier), so enumerators are only ever
// appended. Code that holds something per tier uses PerTier<T> and iterates
// kTiers instead of casting to int, so that adding a tier (a local disk or a
// remote store) is an added enumerator and an added name, not a rewrite.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

enum class Tier : uint8_t { kGpu = 0, kHost = 1 };

inline constexpr std::array<Tier, 2> kTiers = {Tier::kGpu, Tier::kHost};
inline constexpr size_t kTierCount = kTiers.size();

inline constexpr size_t TierIndex(Tier tier) { return static_cast<size_t>(tier); }

// "gpu", "host": the tier's name in configuration, stats, metrics labels and errors.
const char* TierName(Tier tier);
// The tier named `name` (as TierName spells it), or nullopt.
std::optional<Tier> ParseTier(std::string_view name);

// Where one block of a session is, as SessionInfoResponse::tiers says it: a
// Tier value, or (for blocks pressure dropped into the stores below the host
// tier) one of these.
inline constexpr uint8_t kPlaceStoreBase = 16;  // 16 + i: store i of stores.tiers holds it (a fetch reads it there).
inline constexpr uint8_t kPlaceNowhere = 254;   // Dropped into the stores; none holds it now.
inline constexpr uint8_t kPlaceUnknown = 255;   // Dropped into the stores; they did not answer in time.
// "gpu", "host", the store's name (`stores` lists them in stores.tiers order;
// "store<i>" past its end), "nowhere", "unknown", or "tier<n>" for a value
// this build does not know.
std::string PlaceName(uint8_t place, std::span<const std::string> stores = {});

// One T per tier. An aggregate: PerTier<uint32_t> counts{} is all zeros.
template <typename T>
struct PerTier {
  std::array<T, kTierCount> values{};

  constexpr T& operator[](Tier tier) { return values[TierIndex(tier)]; }
  constexpr const T& operator[](Tier tier) const { return values[TierIndex(tier)]; }
  friend constexpr bool operator==(const PerTier&, const PerTier&) = default;
};

}  // namespace kvtier
