// The disk store's entry in stores.tiers (kind: disk): block files in a
// directory of a local file system (the top-level stores/disk/).
#pragma once

#include <cstdint>
#include <string>

#include "config/store_kind.h"

namespace kvtier::daemon {

struct DiskTierOptions {
  std::string path;        // An absolute directory path.
  uint64_t max_bytes = 0;  // The tier's size; required.
  bool direct_io = true;   // O_DIRECT where the file system takes it.
  friend bool operator==(const DiskTierOptions&, const DiskTierOptions&) = default;
};

extern const StoreKind kDiskStoreKind;

}  // namespace kvtier::daemon
