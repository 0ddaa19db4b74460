// StoreWaits (store_waits.h): requests that wait for the stores below the host tier.
#include "service/store_waits.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "log.h"
#include "service/service.h"  // ClientState.

namespace kvtier::daemon {

using tiering::Engine;

bool StoreWaits::AcquireWaits(ClientState& c, const wire::AcquireRequest& m, Engine& e, size_t tenants_connected,
                              tiering::PrefixMatch* match) {
  if (chain_ == nullptr) return false;
  const auto now = std::chrono::steady_clock::now();
  // A locate leases nothing, off an engine's step: a longer budget, and no session to land a late rest in.
  const bool locate = (m.flags & wire::kAcquireLocate) != 0;
  const char* budget_key = locate ? "locate_budget_ms" : "fetch_budget_ms";
  const uint32_t budget_ms = locate ? config_.stores.locate_budget_ms : config_.stores.fetch_budget_ms;
  if (c.fetch) {
    if (c.fetch->result) return false;  // Came already; the Acquire waited for GPU room since.
    if (auto result = chain_->TakeFetch(c.fetch->id)) {
      c.fetch->result = std::move(result);
      counters_.store_fetched_blocks += c.fetch->result->blocks();
      return false;
    }
    if (now < c.fetch->deadline) return true;
    // Past stores.fetch_budget_ms: served with the prefix the fetch verified
    // so far (placed in the host tier like a whole fetch's); the fetch goes on
    // for the rest, which lands in the session when it comes (one per tenant,
    // else it is cancelled).
    bool finished = false;
    stores::FetchResult ready = chain_->TakeReady(c.fetch->id, &finished);
    const uint32_t got = ready.blocks();
    counters_.store_fetched_blocks += got;
    if (finished) {  // It completed meanwhile: in time after all.
      c.fetch->result = std::move(ready);
      return false;
    }
    counters_.store_fetch_ready_blocks += got;
    const bool detach = !m.session.empty() && !locate && !HasDetached(c.tenant);
    if (detach) {
      detached_.push_back(DetachedFetch{c.fetch->id, c.engine_index, tiering::Tenant{c.ns, c.tenant, c.model},
                                        m.session, c.fetch->start + got, m.keys, m.tokens});
    } else {
      chain_->CancelFetch(c.fetch->id);
    }
    // The fetch is the detached one's now (or cancelled): what this Acquire
    // takes is the ready prefix, kept here should it wait for GPU room.
    c.fetch->id = 0;
    c.fetch->result = std::move(ready);
    ++counters_.store_fetch_timeouts;
    LogLimited(LogLevel::kWarn, "store fetch timeout",
               std::string("a fetch from the stores took longer than stores.") + budget_key + " (" +
                   std::to_string(budget_ms) + " ms): answered with what it verified so far; the rest " +
                   (detach ? "lands in the session when it comes" : "is not fetched"));
    return false;
  }
  // A fetch of this tenant's is still under way: no second one (the first lands in the host tier).
  if (HasDetached(c.tenant)) return false;
  const ModelProfile& profile = e.profile();
  const uint32_t bt = profile.block_tokens;
  if (m.tokens.size() != m.keys.size() * bt) return false;  // Acquire says what is wrong with it.
  size_t want = m.keys.size();
  if (const uint32_t most = config_.engine_limits.max_session_blocks; most != 0) want = std::min<size_t>(want, most);
  const uint32_t matched = e.Match(c.ns, m.keys, m.tokens, c.model, match);
  if (matched >= want) return false;
  // At most stores.max_fetch_bytes held in memory per fetch (at least one block).
  const uint64_t most = std::max<uint64_t>(1, config_.stores.max_fetch_bytes / profile.BlockBytes());
  want = std::min<size_t>(want, matched + most);
  // While another tenant has a client connected, this tenant's fetches ask for
  // at most stores.tenant_fetch_bytes_per_second (a burst of max_fetch_bytes):
  // a tenant evicting and refetching a long prefix in a loop made the store
  // thread and the event loop read, check and copy 1.5 GB/s, and on a small
  // host took the CPU from every other tenant's requests. What the budget does
  // not cover is not fetched: that Acquire gets the shorter prefix.
  if (const uint64_t rate = config_.stores.tenant_fetch_bytes_per_second; rate != 0 && tenants_connected > 1) {
    const double block = static_cast<double>(profile.BlockBytes());
    const double burst =
        std::max({static_cast<double>(config_.stores.max_fetch_bytes), static_cast<double>(rate), block});
    const double have = fetch_budgets_.Available(c.tenant, static_cast<double>(rate), burst, now);
    const size_t afford = static_cast<size_t>(std::max(0.0, have) / block);
    if (matched + afford < want) {
      counters_.store_fetch_throttled_blocks += want - (matched + afford);
      want = matched + afford;
    }
    if (want <= matched) return false;  // Answered from the local tiers.
    fetch_budgets_.Take(c.tenant, static_cast<double>(want - matched) * block);
  }
  stores::FetchRequest r;
  r.profile_fingerprint = profile.Fingerprint();
  r.payload_bytes = profile.BlockBytes();
  r.block_tokens = bt;
  r.key_ns = KeyNamespace(c.ns, c.model);
  r.parent = matched == 0 ? BlockKey{} : m.keys[matched - 1];
  r.keys.assign(m.keys.begin() + matched, m.keys.begin() + static_cast<std::ptrdiff_t>(want));
  r.tokens.assign(m.tokens.begin() + size_t{matched} * bt, m.tokens.begin() + want * bt);
  c.fetch = ClientState::StoreFetch{chain_->StartFetch(std::move(r)),
                                    matched,
                                    now + std::chrono::milliseconds(budget_ms),
                                    std::nullopt,
                                    {}};
  ++counters_.store_fetches;
  return true;
}

bool StoreWaits::SessionInfoWaits(ClientState& c, const Engine& e, const std::vector<BlockKey>& away,
                                  std::unordered_map<BlockKey, uint8_t, BlockKeyHash>& places) {
  if (chain_ == nullptr) return false;
  const auto now = std::chrono::steady_clock::now();
  if (!c.fetch) {
    stores::FetchRequest r;
    r.profile_fingerprint = e.profile().Fingerprint();
    r.keys = away;
    r.locate = true;
    c.fetch = ClientState::StoreFetch{chain_->StartFetch(std::move(r)), 0, now + kLocateWaitLimit, std::nullopt, away};
    return true;
  }
  if (!c.fetch->result) c.fetch->result = chain_->TakeFetch(c.fetch->id);
  if (!c.fetch->result && now < c.fetch->deadline) return true;
  if (c.fetch->result) {
    // The keys asked about when the session was read first (one that differs now shows as unknown).
    const std::vector<uint8_t>& store = c.fetch->result->store;
    for (size_t i = 0; i < c.fetch->located.size(); ++i) {
      places[c.fetch->located[i]] = i < store.size() ? static_cast<uint8_t>(kPlaceStoreBase + store[i]) : kPlaceNowhere;
    }
  } else {
    chain_->CancelFetch(c.fetch->id);
  }
  c.fetch.reset();
  return false;
}

void StoreWaits::Cancel(ClientState& c) {
  if (c.fetch && chain_ != nullptr) chain_->CancelFetch(c.fetch->id);
  c.fetch.reset();
}

bool StoreWaits::HasDetached(const std::string& tenant) const {
  return std::any_of(detached_.begin(), detached_.end(),
                     [&](const DetachedFetch& d) { return d.tenant.name == tenant; });
}

void StoreWaits::LandDetached(EngineSet& engines) {
  if (chain_ == nullptr) return;
  std::erase_if(detached_, [&](DetachedFetch& d) {
    std::optional<stores::FetchResult> result = chain_->TakeFetch(d.id);
    if (!result) return false;
    counters_.store_fetched_blocks += result->blocks();
    ++counters_.store_fetches_landed;
    tiering::FetchedBlocks fetched;
    fetched.start = d.start;
    fetched.payloads = result->payloads;
    auto placed = engines[d.engine].engine->ImportLate(d.tenant, d.session, d.keys, d.tokens, fetched);
    if (placed.ok()) counters_.store_fetch_landed_blocks += *placed;
    return true;
  });
}

}  // namespace kvtier::daemon
