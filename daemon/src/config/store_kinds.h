// The kinds of store kvtierd can put below the host tier. Adding one: its
// store under the top-level stores/<kind>/, its StoreKind in store_kind_<kind>.{h,cc}
// (listed in daemon/CMakeLists.txt), and its two lines here.
#pragma once

#include <string_view>
#include <variant>

#include "config/store_kind.h"
#include "config/store_kind_disk.h"
#include "config/store_kind_redis.h"

namespace kvtier::daemon {

// A tiers entry's own options: the alternative of its kind.
struct StoreOptions : std::variant<DiskTierOptions, RedisTierOptions> {
  using variant::variant;
  friend bool operator==(const StoreOptions&, const StoreOptions&) = default;
};

inline const StoreKind* const kStoreKinds[] = {&kDiskStoreKind, &kRedisStoreKind};

// The kind named `name`, or nullptr.
inline const StoreKind* FindStoreKind(std::string_view name) {
  for (const StoreKind* k : kStoreKinds) {
    if (name == k->name) return k;
  }
  return nullptr;
}

}  // namespace kvtier::daemon
