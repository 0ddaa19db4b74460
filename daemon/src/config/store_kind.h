// StoreKind: what kvtierd knows of one kind of store below the host tier
// (stores.tiers[i].kind): how its entry in the configuration is read and
// written back, and how a store of it is opened. Each kind is one
// file pair beside this one (store_kind_disk.cc, store_kind_redis.cc); store_kinds.h
// lists them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::stores {
class BlockStore;
}

namespace kvtier::daemon {

class Section;
struct StoreOptions;  // The kinds' options, one alternative each (store_kinds.h).

struct StoreKind {
  const char* name;     // As stores.tiers[i].kind names it; also the store's name in stats and metrics.
  bool writes_through;  // What `write:` is when the entry does not say (disk: back, redis: through).
  // One of the kind's keys whose value two stores of it may not share (a
  // disk store's path: one directory, one store); nullptr: none.
  const char* exclusive_key;
  // Reads the kind's own keys of a tiers entry (`kind` and `write` are read
  // already) into *out; any other key is an error.
  Status (*parse)(Section& entry, StoreOptions* out);
  // The kind's keys with their values as YAML scalars, in file order: what
  // DumpConfig writes and PlanReload compares.
  std::vector<std::pair<std::string, std::string>> (*settings)(const StoreOptions& options);
  // Opens a store of the kind; `key` ("stores.tiers[1]") names it in errors.
  // nullptr where the configuration parser is built alone (its fuzzer).
  Result<std::unique_ptr<stores::BlockStore>> (*open)(const StoreOptions& options, const std::string& key);
};

}  // namespace kvtier::daemon
