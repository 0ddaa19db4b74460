// The Redis store's entry in stores.tiers (kind: redis): a Redis server or
// cluster shared by hosts (the top-level stores/redis/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/store_kind.h"

namespace kvtier::daemon {

struct RedisTierOptions {
  std::vector<std::string> nodes;  // "host:port"; a cluster's seed nodes
  bool cluster = false;
  std::string user;           // ACL user; empty: the default user
  std::string password_file;  // The password is read from it at start: the YAML never holds it.
  uint32_t ttl_s = 0;         // 0: values never expire
  uint32_t connect_timeout_ms = 200;
  uint32_t timeout_ms = 500;
  friend bool operator==(const RedisTierOptions&, const RedisTierOptions&) = default;
};

extern const StoreKind kRedisStoreKind;

}  // namespace kvtier::daemon
