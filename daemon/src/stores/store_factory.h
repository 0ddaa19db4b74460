// Store creation: the stores below the host tier (stores.tiers), opened from
// the configuration, in one StoreChain that every engine of kvtierd shares.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "kvtier/status.h"
#include "kvtier/stores/store_chain.h"

namespace kvtier::daemon {

// The chain of the configured stores (nullptr when none are configured), its
// fetches reported to `notify` (called on the chain's I/O thread); with
// `max_events`, it collects up to that many block events between two
// TakeEvents (StoreChainOptions::max_events). A store
// that cannot be opened (a disk directory that cannot be made, a password
// file that cannot be read, a malformed node) fails the start with an error
// naming its configuration key, and so does a bad stores.record_key_file
// (missing, short, readable by others); a Redis server that is down is not
// an error (the store answers as down and reconnects), nor is a disk
// directory that cannot be used yet (the store serves misses, counts errors
// and retries it).
Result<std::unique_ptr<stores::StoreChain>> OpenStores(const StoresConfig& config, std::function<void()> notify,
                                                       size_t max_events = 0);

// The stores' names in metrics and cachectl, in chain order: their kind
// ("disk", "redis"), numbered when two are of one kind ("disk0", "disk1").
std::vector<std::string> StoreNames(const std::vector<std::string>& kinds);
std::vector<std::string> StoreNames(const std::vector<stores::StoreStats>& stats);
std::vector<std::string> StoreNames(const StoresConfig& config);

}  // namespace kvtier::daemon
