// The stats table's rows and how each reads its figure (stats.h). Adding a
// figure is adding a row here; stats.cc renders the table.
#include <chrono>

#include "service/stats.h"

namespace kvtier::daemon {
namespace {

using Type = Exposition::Type;
using Value = std::optional<double>;

double BlockBytes(const StatsView& v, size_t profile) {
  return static_cast<double>(v.engines.Shared(profile).profile().BlockBytes());
}
double BlockTokens(const StatsView& v, size_t profile) {
  return static_cast<double>(v.engines.Shared(profile).profile().block_tokens);
}

// ---- Getters: how a row reads its figure ----

template <auto Field>
Value Counter(const StatsView& v, const StatPoint&) {
  return static_cast<double>(v.counters.*Field);
}
template <auto Field>
Value Engine(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.engine_stats[at.profile].*Field);
}
// Tokens and bytes are counted in whole blocks: a prompt's partial last block never reaches the daemon.
template <auto Field>
Value Tokens(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.engine_stats[at.profile].*Field) * BlockTokens(v, at.profile);
}
template <auto Field>
Value Bytes(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.engine_stats[at.profile].*Field) * BlockBytes(v, at.profile);
}
template <auto Field>
Value InTier(const StatsView& v, const StatPoint& at) {
  return static_cast<double>((v.engine_stats[at.profile].*Field)[at.tier]);
}
template <auto Field>
Value TierTokens(const StatsView& v, const StatPoint& at) {
  return *InTier<Field>(v, at) * BlockTokens(v, at.profile);
}
template <auto Field>
Value TierBytes(const StatsView& v, const StatPoint& at) {
  return *InTier<Field>(v, at) * BlockBytes(v, at.profile);
}
template <auto Field>
Value Copied(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.backend.copy_stats(at.direction).*Field);
}

Value One(const StatsView&, const StatPoint&) { return 1; }

template <auto Field>
Value Store(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.stores[at.store].*Field);
}
template <auto Field>
Value StoreSeconds(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.stores[at.store].*Field) / 1e6;
}

// A counter the store keeps itself, of the kind asked for: its running totals, its levels, or either.
enum class Own { kTotals, kLevels, kAny };
template <Own Kind>
Value StoreOwn(const StatsView& v, const StatPoint& at) {
  const stores::StoreCounter& c = v.stores[at.store].counters[at.counter];
  if (Kind != Own::kAny && c.gauge != (Kind == Own::kLevels)) return std::nullopt;
  return static_cast<double>(c.value);
}

template <auto Field>
Value Events(const StatsView& v, const StatPoint&) {
  return static_cast<double>(v.events.*Field);
}

Value Uptime(const StatsView& v, const StatPoint&) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - v.counters.started).count();
}

// Over every request type, as Prometheus' histogram_quantile estimates it.
template <int Percent>
Value LatencyQuantile(const StatsView& v, const StatPoint&) {
  Histogram all(LatencyBuckets());
  for (const auto& [type, m] : v.counters.per_type) all.Merge(m.latency);
  return all.Quantile(Percent / 100.0);
}

const Histogram* RpcLatency(const StatsView& v, const StatPoint& at) {
  return &v.counters.per_type.at(at.type).latency;
}
Value RpcErrors(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.counters.per_type.at(at.type).errors);
}

tiering::TenantUsage UsageOf(const StatsView& v, const StatPoint& at) {
  const tiering::Engine& e = v.engines.Of(at.profile, *at.tenant);
  return e.tenant_usage(tiering::Tenant::Make(e.profile().Fingerprint(), *at.tenant).ns);
}
Value TenantBlocks(const StatsView& v, const StatPoint& at) { return UsageOf(v, at).blocks[at.tier]; }
Value TenantLeased(const StatsView& v, const StatPoint& at) { return UsageOf(v, at).leased; }
template <auto Field>
Value Traffic(const StatsView& v, const StatPoint& at) {
  const TenantTraffic* t = v.registry == nullptr ? nullptr : v.registry->find_traffic(*at.tenant, at.profile);
  if (t == nullptr || (t->read_blocks == 0 && t->read_errors == 0 && t->saved_blocks == 0)) return std::nullopt;
  return static_cast<double>(t->*Field);
}
Value TrafficReadSeconds(const StatsView& v, const StatPoint& at) {
  const Value us = Traffic<&TenantTraffic::read_lease_us>(v, at);
  return us ? std::optional<double>(*us / 1e6) : std::nullopt;
}

Value OldestLeaseAge(const StatsView& v, const StatPoint& at) {
  return static_cast<double>(v.engine_stats[at.profile].oldest_lease_ms) / 1000.0;
}
Value LeasesExpired(const StatsView& v, const StatPoint& at) {
  const tiering::EngineStats& s = v.engine_stats[at.profile];
  return static_cast<double>(s.expired_write_leases + s.expired_read_leases);
}
// Only for a configured tenant (tenants:), 0 meaning unlimited.
Value TenantQuota(const StatsView& v, const StatPoint& at) {
  const TenantConfig* q = v.access.FindTenant(*at.tenant);
  if (q == nullptr) return std::nullopt;
  switch (at.tier) {
    case Tier::kGpu:
      return q->gpu_blocks;
    case Tier::kHost:
      return q->host_blocks;
  }
  return std::nullopt;
}

// ---- The table ----

using S = StatScope;
using E = tiering::EngineStats;
using C = ServiceCounters;
constexpr std::pair<const char*, const char*> kNoLabel{nullptr, nullptr};

// clang-format off
constexpr StatRow kStats[] = {
  {nullptr, "kvtier_build_info", Type::kGauge, "kvtierd's version and backend; always 1", S::kBuild, kNoLabel, &One},
  {"uptime_s", "kvtier_uptime_seconds", Type::kGauge, "Seconds since kvtierd started", S::kDaemon, kNoLabel, &Uptime},
  {"clients", "kvtier_clients", Type::kGauge, "Clients connected now (after Hello)", S::kDaemon, kNoLabel,
   &Counter<&C::clients>},
  {nullptr, "kvtier_client_connections_total", Type::kCounter, "Clients welcomed since start", S::kDaemon, kNoLabel,
   &Counter<&C::connections>},
  {"requests", nullptr, Type::kCounter, "Requests answered", S::kDaemon, kNoLabel, &Counter<&C::requests>},
  {"room_waits", "kvtier_room_waits_total", Type::kCounter,
   "Allocate/Acquire requests that waited (without blocking the daemon) for demotions to free GPU slots",
   S::kDaemon, kNoLabel, &Counter<&C::room_waits>},
  {"room_wait_timeouts", "kvtier_room_wait_timeouts_total", Type::kCounter,
   "Of those, answered after the wait limit without the room (Allocate failed or dropped; Acquire leased "
   "host-tier blocks in place)", S::kDaemon, kNoLabel, &Counter<&C::room_wait_timeouts>},
  {"store_fetches", "kvtier_store_fetches_total", Type::kCounter,
   "Acquires whose prefix went on past the local tiers and asked the stores below them", S::kDaemon, kNoLabel,
   &Counter<&C::store_fetches>},
  {"store_fetch_timeouts", "kvtier_store_fetch_timeouts_total", Type::kCounter,
   "Of those, answered after stores.fetch_budget_ms with the prefix the stores had given by then", S::kDaemon,
   kNoLabel, &Counter<&C::store_fetch_timeouts>},
  {"store_fetch_throttled_blocks", "kvtier_store_fetch_throttled_blocks_total", Type::kCounter,
   "Blocks not asked of the stores: past the tenant's stores.tenant_fetch_bytes_per_second while others are connected",
   S::kDaemon, kNoLabel, &Counter<&C::store_fetch_throttled_blocks>},
  {"store_fetch_ready_blocks", "kvtier_store_fetch_ready_blocks_total", Type::kCounter,
   "Blocks the timed-out fetches had verified by the budget, served in their Acquires (the rest lands later)",
   S::kDaemon, kNoLabel, &Counter<&C::store_fetch_ready_blocks>},
  {"store_fetched_blocks", "kvtier_store_fetched_blocks_total", Type::kCounter,
   "Verified blocks the stores returned to those fetches", S::kDaemon, kNoLabel, &Counter<&C::store_fetched_blocks>},
  {"store_fetches_landed", "kvtier_store_fetches_landed_total", Type::kCounter,
   "Of the timed-out fetches, those that came later and were placed into their sessions (one per tenant at a time)",
   S::kDaemon, kNoLabel, &Counter<&C::store_fetches_landed>},
  {"store_fetch_landed_blocks", "kvtier_store_fetch_landed_blocks_total", Type::kCounter,
   "Blocks the late fetches placed in the host tier and their sessions", S::kDaemon, kNoLabel,
   &Counter<&C::store_fetch_landed_blocks>},
  {"errors", nullptr, Type::kCounter, "Requests answered with an error", S::kDaemon, kNoLabel, &Counter<&C::errors>},
  {"gpu_commits_without_writer_event", "kvtier_gpu_commits_without_writer_event_total", Type::kCounter,
   "Commits on the cuda backend that carried no writer event (WriteLease::RecordWritten): nothing orders their "
   "blocks' demotions after the worker's GPU writes", S::kDaemon, kNoLabel,
   &Counter<&C::gpu_commits_without_writer_event>},

  {"{tier}_slots", "kvtier_tier_slots", Type::kGauge, "Block slots in a tier", S::kProfileTier, kNoLabel,
   &InTier<&E::slots>},
  {"{tier}_used", "kvtier_tier_used_slots", Type::kGauge, "Block slots in use (blocks, moves' destinations, write leases)",
   S::kProfileTier, kNoLabel, &InTier<&E::used>},
  {nullptr, "kvtier_tier_capacity_bytes", Type::kGauge, "Bytes of a tier's pool", S::kProfileTier, kNoLabel,
   &TierBytes<&E::slots>},
  {nullptr, "kvtier_tier_used_bytes", Type::kGauge, "Bytes of a tier's pool in use", S::kProfileTier, kNoLabel,
   &TierBytes<&E::used>},

  {"blocks", "kvtier_blocks", Type::kGauge, "Blocks cached", S::kProfile, kNoLabel, &Engine<&E::blocks>},
  {"sessions", "kvtier_sessions", Type::kGauge, "Sessions", S::kProfile, kNoLabel, &Engine<&E::sessions>},
  {"read_leases", "kvtier_leases", Type::kGauge, "Leases held by clients now, by kind", S::kProfile, {"kind", "read"},
   &Engine<&E::read_leases>},
  {"write_leases", "kvtier_leases", Type::kGauge, nullptr, S::kProfile, {"kind", "write"}, &Engine<&E::write_leases>},
  {"leased_slots", "kvtier_leased_slots", Type::kGauge,
   "GPU slots reserved by write leases and not committed yet (counted in the tier's used slots and the tenants' gpu "
   "quotas)", S::kProfile, kNoLabel, &Engine<&E::leased_slots>},
  {"oldest_lease_age_s", "kvtier_oldest_lease_age_seconds", Type::kGauge,
   "Age of the oldest lease held (0: none); limits.lease_timeout_ms revokes a lease at that age", S::kProfile,
   kNoLabel, &OldestLeaseAge},
  {"leases_expired", nullptr, Type::kCounter, "Leases revoked for being held longer than limits.lease_timeout_ms",
   S::kProfile, kNoLabel, &LeasesExpired},
  {"write_leases_expired", "kvtier_leases_expired_total", Type::kCounter,
   "Leases revoked for being held longer than limits.lease_timeout_ms, by kind (a write lease's slots went back to the "
   "pool, a read lease's blocks were unpinned)", S::kProfile, {"kind", "write"}, &Engine<&E::expired_write_leases>},
  {"read_leases_expired", "kvtier_leases_expired_total", Type::kCounter, nullptr, S::kProfile, {"kind", "read"},
   &Engine<&E::expired_read_leases>},
  {"copies_in_flight", "kvtier_copies_in_flight", Type::kGauge, "Blocks with a copy between tiers in flight",
   S::kProfile, kNoLabel, &Engine<&E::copies_in_flight>},
  {"gpu_work_pending", "kvtier_gpu_work_pending", Type::kGauge,
   "Released leases and commits whose slots or blocks wait for a worker's GPU work to finish (cuda backend)",
   S::kProfile, kNoLabel, &Engine<&E::gpu_work_pending>},
  {"gpu_work_expired", "kvtier_gpu_work_expired_total", Type::kCounter,
   "Workers' GPU work given up on after limits.lease_timeout_ms (its slots and blocks given back unfinished)",
   S::kProfile, kNoLabel, &Engine<&E::expired_gpu_work>},
  {"unfinished_writes_dropped", "kvtier_unfinished_writes_dropped_total", Type::kCounter,
   "Committed blocks dropped because their writer went away (or its GPU failed) before it finished writing them",
   S::kProfile, kNoLabel, &Engine<&E::unfinished_writes_dropped>},
  {"hit_blocks", "kvtier_lookup_blocks_total", Type::kCounter, "Blocks asked for by Acquire, found (hit) or not (miss)",
   S::kProfile, {"result", "hit"}, &Engine<&E::hit_blocks>},
  {"miss_blocks", "kvtier_lookup_blocks_total", Type::kCounter, nullptr, S::kProfile, {"result", "miss"},
   &Engine<&E::miss_blocks>},
  {"committed_blocks", "kvtier_committed_blocks_total", Type::kCounter, "New blocks published by Commit", S::kProfile,
   kNoLabel, &Engine<&E::committed_blocks>},
  {"duplicate_blocks", "kvtier_duplicate_blocks_total", Type::kCounter, "Committed blocks that were already cached",
   S::kProfile, kNoLabel, &Engine<&E::duplicate_blocks>},
  {"demoted_blocks", "kvtier_moved_blocks_total", Type::kCounter, "Blocks that moved between tiers, by direction",
   S::kProfile, {"direction", "gpu_to_host"}, &Engine<&E::demoted_blocks>},
  {"promoted_blocks", "kvtier_moved_blocks_total", Type::kCounter, nullptr, S::kProfile, {"direction", "host_to_gpu"},
   &Engine<&E::promoted_blocks>},
  {"dropped_blocks", "kvtier_evicted_blocks_total", Type::kCounter, "Blocks dropped from the cache under memory pressure",
   S::kProfile, kNoLabel, &Engine<&E::dropped_blocks>},
  {"evicted_sessions", "kvtier_evicted_sessions_total", Type::kCounter,
   "Sessions removed (cachectl evict, limits.max_sessions)", S::kProfile, kNoLabel, &Engine<&E::evicted_sessions>},
  {"ended_sessions", "kvtier_ended_sessions_total", Type::kCounter,
   "Sessions their clients ended (blocks kept; first given up under limits.max_sessions_per_tenant)", S::kProfile,
   kNoLabel, &Engine<&E::ended_sessions>},
  {"allocation_failures", "kvtier_allocation_failures_total", Type::kCounter,
   "Allocate requests refused for want of GPU slots (in the tier, or under the tenant's gpu quota)", S::kProfile,
   kNoLabel, &Engine<&E::allocation_failures>},
  {"share_limited", "kvtier_share_limited_total", Type::kCounter,
   "Operations a tenant's fair share of the GPU tier limited while another tenant waited for GPU room: Allocates "
   "refused, Acquires that stopped before blocks past the share or did not promote",
   S::kProfile, kNoLabel, &Engine<&E::share_limited>},
  {"imported_blocks", "kvtier_imported_blocks_total", Type::kCounter,
   "Blocks fetched from a store below the host tier and placed in it", S::kProfile, kNoLabel,
   &Engine<&E::imported_blocks>},
  {"spilled_blocks", "kvtier_spilled_blocks_total", Type::kCounter,
   "Host-tier blocks offered to the stores (landed there, or dropped from there)", S::kProfile, kNoLabel,
   &Engine<&E::spilled_blocks>},
  {"after_read_promotions", "kvtier_after_read_promotions_total", Type::kCounter,
   "Host-tier blocks read in place and then promoted (Acquire with promote after read), or given up for want of "
   "GPU room", S::kProfile, {"result", "promoted"}, &Engine<&E::after_read_promotions>},
  {"after_read_given_up", "kvtier_after_read_promotions_total", Type::kCounter, nullptr, S::kProfile,
   {"result", "given_up"}, &Engine<&E::after_read_given_up>},
  {"warm_adopted_blocks", "kvtier_warm_adopted_blocks", Type::kGauge, "Host blocks adopted from the previous run at start",
   S::kProfile, kNoLabel, &Engine<&E::warm_adopted_blocks>},
  {"warm_dropped_blocks", "kvtier_warm_dropped_blocks", Type::kGauge,
   "Blocks of the previous run's manifest not adopted (failed a check, or orphaned)", S::kProfile, kNoLabel,
   &Engine<&E::warm_dropped_blocks>},
  {"warm_adopted_sessions", nullptr, Type::kGauge, "Sessions adopted from the previous run at start", S::kProfile,
   kNoLabel, &Engine<&E::warm_adopted_sessions>},
  {"warm_snapshots", "kvtier_warm_snapshots_total", Type::kCounter, "Warm-restart manifests written", S::kProfile,
   kNoLabel, &Engine<&E::warm_snapshots>},
  {"hit_tokens", "kvtier_lookup_tokens_total", Type::kCounter,
   "Prompt tokens asked for by Acquire, in whole blocks, found (hit) or not (miss)", S::kProfile, {"result", "hit"},
   &Tokens<&E::hit_blocks>},
  {"miss_tokens", "kvtier_lookup_tokens_total", Type::kCounter, nullptr, S::kProfile, {"result", "miss"},
   &Tokens<&E::miss_blocks>},
  {"store_hit_tokens", "kvtier_store_hit_tokens_total", Type::kCounter,
   "Prompt tokens Acquire asked for that were not cached here but fetched from a store below the host tier "
   "(in whole blocks)", S::kProfile, kNoLabel, &Tokens<&E::imported_blocks>},
  {"hit_tokens_{tier}", "kvtier_hit_tokens_total", Type::kCounter,
   "Prompt tokens Acquire found cached, by the tier it found them in (host: then promoted)", S::kProfileTier,
   kNoLabel, &TierTokens<&E::hit_blocks_in>},
  {"demoted_bytes", "kvtier_moved_bytes_total", Type::kCounter,
   "Bytes of the blocks that moved between tiers, by direction", S::kProfile, {"direction", "gpu_to_host"},
   &Bytes<&E::demoted_blocks>},
  {"promoted_bytes", "kvtier_moved_bytes_total", Type::kCounter, nullptr, S::kProfile, {"direction", "host_to_gpu"},
   &Bytes<&E::promoted_blocks>},
  {"expired_priorities", "kvtier_priority_expirations_total", Type::kCounter,
   "Session priorities reset to 0 when their TTL ended", S::kProfile, kNoLabel, &Engine<&E::expired_priorities>},

  // The copy engine serves every profile.
  {"copy_{direction}_bytes", "kvtier_copy_bytes_total", Type::kCounter, "Bytes the copy engine copied, by direction",
   S::kDirection, kNoLabel, &Copied<&tiering::CopyStats::bytes>},
  {"copy_{direction}_seconds", "kvtier_copy_seconds_total", Type::kCounter,
   "Seconds the copy engine spent copying, by direction (bytes / seconds is its bandwidth)", S::kDirection, kNoLabel,
   &Copied<&tiering::CopyStats::busy_seconds>},
  {nullptr, "kvtier_copy_batches_total", Type::kCounter, "Copy batches the copy engine completed, by direction",
   S::kDirection, kNoLabel, &Copied<&tiering::CopyStats::batches>},

  // The stores below the host tier (stores.tiers), each once for the daemon.
  {"store.{store}.hit_blocks", "kvtier_store_blocks_total", Type::kCounter,
   "Blocks asked of a store below the host tier, by result (hit: fetched and verified)", S::kStore,
   {"result", "hit"}, &Store<&stores::StoreStats::hit_blocks>},
  {"store.{store}.miss_blocks", "kvtier_store_blocks_total", Type::kCounter, nullptr, S::kStore, {"result", "miss"},
   &Store<&stores::StoreStats::miss_blocks>},
  {"store.{store}.corrupt_records", "kvtier_store_verify_failures_total", Type::kCounter,
   "Records a store returned that failed verification (never served), by reason", S::kStore,
   {"reason", "corrupt"}, &Store<&stores::StoreStats::corrupt>},
  {"store.{store}.foreign_records", "kvtier_store_verify_failures_total", Type::kCounter, nullptr, S::kStore,
   {"reason", "foreign"}, &Store<&stores::StoreStats::foreign>},
  {"store.{store}.forged_records", "kvtier_store_verify_failures_total", Type::kCounter, nullptr, S::kStore,
   {"reason", "forged"}, &Store<&stores::StoreStats::forged>},
  {"store.{store}.fetched_bytes", "kvtier_store_bytes_total", Type::kCounter,
   "Bytes read from and written to a store, by direction", S::kStore, {"direction", "fetch"},
   &Store<&stores::StoreStats::fetched_bytes>},
  {"store.{store}.put_bytes", "kvtier_store_bytes_total", Type::kCounter, nullptr, S::kStore, {"direction", "put"},
   &Store<&stores::StoreStats::put_bytes>},
  {"store.{store}.put_blocks", "kvtier_store_put_blocks_total", Type::kCounter, "Blocks written to a store",
   S::kStore, kNoLabel, &Store<&stores::StoreStats::put_blocks>},
  {"store.{store}.fetches", "kvtier_store_calls_total", Type::kCounter,
   "Fetches that asked a store, and Put calls (batches) written to it, by direction", S::kStore,
   {"direction", "fetch"}, &Store<&stores::StoreStats::fetches>},
  {"store.{store}.puts", "kvtier_store_calls_total", Type::kCounter, nullptr, S::kStore, {"direction", "put"},
   &Store<&stores::StoreStats::puts>},
  {"store.{store}.fetch_seconds", "kvtier_store_seconds_total", Type::kCounter,
   "Seconds spent in a store's calls, by direction (divide by kvtier_store_calls_total for the mean)", S::kStore,
   {"direction", "fetch"}, &StoreSeconds<&stores::StoreStats::fetch_us>},
  {"store.{store}.put_seconds", "kvtier_store_seconds_total", Type::kCounter, nullptr, S::kStore,
   {"direction", "put"}, &StoreSeconds<&stores::StoreStats::put_us>},
  {"store.{store}.errors", "kvtier_store_errors_total", Type::kCounter,
   "A store's calls that failed (unreachable, timed out, refused); the daemon went on without it", S::kStore,
   kNoLabel, &Store<&stores::StoreStats::errors>},
  {"store.{store}.put_dropped", "kvtier_store_put_dropped_total", Type::kCounter,
   "Blocks not written to a store: stores.queue_bytes were waiting already", S::kStore, kNoLabel,
   &Store<&stores::StoreStats::put_dropped>},
  {"store.{store}.queued_bytes", "kvtier_store_queued_bytes", Type::kGauge, "Bytes waiting to be written to a store",
   S::kStore, kNoLabel, &Store<&stores::StoreStats::queued_bytes>},
  // What each kind of store counts itself: Redis' reconnects, redirects, topology_refreshes, node_errors and
  // oversized; the disk store's held_bytes and files (levels), evicted_files, evicted_bytes and io_errors.
  {"store.{store}.{counter}", nullptr, Type::kGauge, "What a store counts itself", S::kStoreCounter, kNoLabel,
   &StoreOwn<Own::kAny>},
  {nullptr, "kvtier_store_counter_total", Type::kCounter,
   "A store's own running counts, by counter (reconnects, redirects, evicted_bytes, ...)", S::kStoreCounter, kNoLabel,
   &StoreOwn<Own::kTotals>},
  {nullptr, "kvtier_store_level", Type::kGauge, "A store's own levels, by counter (held_bytes, files)",
   S::kStoreCounter, kNoLabel, &StoreOwn<Own::kLevels>},

  // KV events (events:).
  {"events", "kvtier_events_total", Type::kCounter, "KV events (blocks stored, moved, removed; sessions evicted) added to batches",
   S::kDaemon, kNoLabel, &Events<&EventStats::events>},
  {"event_batches", "kvtier_event_batches_total", Type::kCounter, "KV event batches closed, each with a sequence number",
   S::kDaemon, kNoLabel, &Events<&EventStats::batches>},
  {"event_batches_dropped", "kvtier_event_batches_dropped_total", Type::kCounter,
   "KV event batches not published: events.queue_batches waited for the events helper already, or none ran",
   S::kDaemon,
   kNoLabel, &Events<&EventStats::dropped_batches>},
  {"event_replays", "kvtier_event_replays_total", Type::kCounter, "KV event replay requests answered", S::kDaemon,
   kNoLabel, &Events<&EventStats::replays>},
  {"event_replays_refused", "kvtier_event_replays_refused_total", Type::kCounter,
   "KV event replay requests past the replay rate (20 a second, all peers together): answered with the end marker "
   "alone", S::kDaemon, kNoLabel, &Events<&EventStats::replays_refused>},
  {"event_storage_dropped", "kvtier_event_storage_dropped_total", Type::kCounter,
   "What the stores learnt of their blocks (written, gone) not published in medium STORAGE: more came between two "
   "ticks than kvtierd keeps", S::kDaemon, kNoLabel, &Events<&EventStats::storage_dropped>},
  {"event_storage_forgotten", "kvtier_event_storage_forgotten_total", Type::kCounter,
   "Blocks published as removed from medium STORAGE because kvtierd tracks at most 262144 there, not because a "
   "store lost them", S::kDaemon, kNoLabel, &Events<&EventStats::storage_forgotten>},
  {"event_helper_restarts", "kvtier_event_helper_restarts_total", Type::kCounter,
   "KV events helper processes (they own the events sockets) started again after one ended: killed, or aborted by "
   "libzmq when a peer's connections used up its descriptors", S::kDaemon, kNoLabel,
   &Events<&EventStats::helper_restarts>},
  {"event_seq", "kvtier_event_seq", Type::kGauge, "The last KV event batch's sequence number", S::kDaemon, kNoLabel,
   &Events<&EventStats::last_seq>},

  {nullptr, "kvtier_rpc_duration_seconds", Type::kHistogram,
   "Time from a request's decoded frame to its reply queued for sending, by request type", S::kRequestType, kNoLabel,
   nullptr, &RpcLatency},
  {nullptr, "kvtier_rpc_errors_total", Type::kCounter, "Requests answered with an error, by request type",
   S::kRequestType, kNoLabel, &RpcErrors},
  {"rpc_latency_p50_s", nullptr, Type::kGauge, "Median request latency, over every request type", S::kDaemon, kNoLabel,
   &LatencyQuantile<50>},
  {"rpc_latency_p90_s", nullptr, Type::kGauge, "90th percentile of it", S::kDaemon, kNoLabel, &LatencyQuantile<90>},
  {"rpc_latency_p99_s", nullptr, Type::kGauge, "99th percentile of it", S::kDaemon, kNoLabel, &LatencyQuantile<99>},
  {"bad_frames", "kvtier_bad_frames_total", Type::kCounter, "Frames that did not decode; each closed its connection",
   S::kDaemon, kNoLabel, &Counter<&C::bad_frames>},
  {"refused_connections", "kvtier_refused_connections_total", Type::kCounter,
   "Connections refused at accept: the peer's uid/gids are not allowed (access:)", S::kDaemon, kNoLabel,
   &Counter<&C::refused_connections>},
  {"connections_over_limit", "kvtier_connections_over_limit_total", Type::kCounter,
   "Connections closed at accept: limits.max_clients + 16 connections were open already", S::kDaemon, kNoLabel,
   &Counter<&C::connections_over_limit>},
  {"connections_too_fast", "kvtier_connections_too_fast_total", Type::kCounter,
   "Connections closed at accept: their uid opened more than limits.connects_per_second", S::kDaemon, kNoLabel,
   &Counter<&C::connections_too_fast>},
  {nullptr, "kvtier_config_reloads_total", Type::kCounter, "Configuration reloads (SIGHUP) by result", S::kDaemon,
   {"result", "applied"}, &Counter<&C::reloads_applied>},
  {nullptr, "kvtier_config_reloads_total", Type::kCounter, nullptr, S::kDaemon, {"result", "rejected"},
   &Counter<&C::reloads_rejected>},

  // Blocks per tier of each tenant (a client that is not an admin sees its own),
  // their quotas, and the GPU slots of their write leases (which the gpu quota counts too).
  {"tenant.{tenant}.{tier}_blocks", "kvtier_tenant_blocks", Type::kGauge,
   "Blocks a tenant holds, by profile and tier (moves count where they land)", S::kTenantTier, kNoLabel,
   &TenantBlocks},
  {"tenant.{tenant}.{tier}_quota", nullptr, Type::kGauge,
   "A configured tenant's quota in the tier (0: unlimited); the gpu quota counts gpu_blocks + leased_blocks",
   S::kTenantTier, kNoLabel, &TenantQuota},
  {"tenant.{tenant}.leased_blocks", "kvtier_tenant_leased_blocks", Type::kGauge,
   "GPU slots of a tenant's write leases, not committed yet (its gpu quota counts them), by profile", S::kTenant,
   kNoLabel, &TenantLeased},
  // What each tenant's clients loaded and saved (a vLLM engine's connector, a worker), since its name became known;
  // rows only for a tenant that has any (at kMaxTenants tenants with traffic, an admin's stats still fit a frame).
  {"tenant.{tenant}.read_blocks", "kvtier_tenant_read_blocks_total", Type::kCounter,
   "Blocks a tenant's Acquires leased to it: its loads, and its sessions adopting a cached prefix", S::kTenant,
   kNoLabel, &Traffic<&TenantTraffic::read_blocks>},
  {"tenant.{tenant}.read_leases", "kvtier_tenant_read_leases_total", Type::kCounter,
   "A tenant's read leases that its client released", S::kTenant, kNoLabel, &Traffic<&TenantTraffic::read_leases>},
  {"tenant.{tenant}.read_seconds", "kvtier_tenant_read_seconds_total", Type::kCounter,
   "Their time from Acquire to Release (the client's copies in between): its load time, as kvtierd sees it",
   S::kTenant, kNoLabel, &TrafficReadSeconds},
  {"tenant.{tenant}.read_errors", "kvtier_tenant_read_errors_total", Type::kCounter,
   "A tenant's loads that failed: Acquires refused, read leases revoked by the lease timeout or gone with their "
   "client", S::kTenant, kNoLabel, &Traffic<&TenantTraffic::read_errors>},
  {"tenant.{tenant}.saved_blocks", "kvtier_tenant_saved_blocks_total", Type::kCounter,
   "Blocks a tenant's Commits stored (new to kvtierd)", S::kTenant, kNoLabel, &Traffic<&TenantTraffic::saved_blocks>},
};
// clang-format on

}  // namespace

std::span<const StatRow> StatsTable() { return kStats; }

}  // namespace kvtier::daemon
