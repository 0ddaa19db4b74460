// StoreWaits: the requests that wait for the stores below the host tier
// (stores/) without holding the event loop. An Acquire whose prefix goes on
// past the local tiers, or a SessionInfo about blocks dropped into the stores,
// is deferred (Reply::deferred) and handled again until the stores' answer came
// or its time ran out (ClientState::StoreFetch holds the fetch it waits for).
// Also the fetches whose Acquire stopped waiting (detached: they land in the
// session when they come) and each tenant's fetch rate.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "kvtier/block_key.h"
#include "kvtier/stores/store_chain.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/wire.h"
#include "rate_buckets.h"
#include "service/engine_set.h"
#include "service/stats.h"

namespace kvtier::daemon {

struct ClientState;

// How long a SessionInfo waits for the stores to say where the session's
// blocks that pressure dropped into them are (past it they show as unknown).
inline constexpr std::chrono::milliseconds kLocateWaitLimit{2000};

class StoreWaits {
 public:
  // `config` and `counters` are the service's: read as they are at each call
  // (a reload replaces the config in place), counted into.
  StoreWaits(const DaemonConfig& config, ServiceCounters& counters) : config_(config), counters_(counters) {}
  // The stores (null or never attached: none, and no request ever waits).
  void Attach(stores::StoreChain* chain) { chain_ = chain; }

  // For an Acquire: the fetch it waits for, started if its prefix goes on past
  // the local tiers. True while the Acquire should wait for it (deferred);
  // false when it is answered now, with whatever came (c.fetch->result) or
  // without (none started, or the budget ran out). `tenants_connected`: how
  // many tenants have a client connected (a tenant's fetch rate is bounded only
  // while another has). The local prefix it matches is kept in `*match` for the
  // Acquire's later calls.
  bool AcquireWaits(ClientState& c, const wire::AcquireRequest& m, tiering::Engine& e, size_t tenants_connected,
                    tiering::PrefixMatch* match);
  // For a SessionInfo whose session has blocks dropped into the stores: the
  // stores' answer of where `away` (those no local tier holds) are, asked for
  // once. True while the SessionInfo should wait for it (deferred); false when
  // it is answered now, with `places` filled (a kPlace value per key asked
  // about) if the stores answered in time.
  bool SessionInfoWaits(ClientState& c, const tiering::Engine& e, const std::vector<BlockKey>& away,
                        std::unordered_map<BlockKey, uint8_t, BlockKeyHash>& places);
  // The client stops waiting (it went, or its request failed): its fetch is cancelled.
  void Cancel(ClientState& c);
  // Places what detached fetches brought (at each tick).
  void LandDetached(EngineSet& engines);

 private:
  bool HasDetached(const std::string& tenant) const;

  // A fetch whose Acquire stopped waiting for it (stores.fetch_budget_ms) goes
  // on for the blocks after the prefix it had verified (which the Acquire
  // took: `start` is where that ended); what it brings is placed into the
  // Acquire's session when it comes (Engine::ImportLate, at the next tick), so
  // the session's next Acquire finds it in the host tier instead of asking the
  // stores again. At most one per tenant: while it is under way, that tenant's
  // Acquires start no new fetch, so a tenant looping on a prefix the stores
  // are slow to give reads it once, and cannot fill the store I/O thread's
  // queue ahead of other tenants.
  struct DetachedFetch {
    uint64_t id = 0;
    size_t engine = 0;
    tiering::Tenant tenant;
    std::string session;
    uint32_t start = 0;
    std::vector<BlockKey> keys;
    std::vector<TokenId> tokens;
  };

  const DaemonConfig& config_;
  ServiceCounters& counters_;
  stores::StoreChain* chain_ = nullptr;
  std::vector<DetachedFetch> detached_;
  RateBuckets<std::string> fetch_budgets_;  // Store fetch bytes per tenant (stores.tenant_fetch_bytes_per_second).
};

}  // namespace kvtier::daemon
