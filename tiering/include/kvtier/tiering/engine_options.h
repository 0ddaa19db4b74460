// What an Engine (engine.h) is made with: its options, its tenants (the
// namespace that scopes their keys and sessions) and their quotas, and the
// arguments of the hooks it calls (blocks spilled to the stores below, KV events).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/index_layout.h"
#include "kvtier/model_profile.h"
#include "kvtier/tier.h"

namespace kvtier::tiering {

// A tenant of one engine: the namespace that scopes its block keys and its
// sessions, and its name (for errors and listings). Tenants are told apart by
// their whole namespace; a session is named by its tenant and its id.
struct Tenant {
  Namespace ns;
  std::string name;
  // The model of the client acting (Hello's identity; null: none). Accounts,
  // quotas and sessions are the tenant's whatever the model; block keys are
  // chained in KeyNs(), so models never share blocks.
  ModelId model;

  Namespace KeyNs() const { return KeyNamespace(ns, model); }

  // Tenant `name` of the profile whose fingerprint is `profile_fingerprint`.
  static Tenant Make(uint64_t profile_fingerprint, std::string name);
};

// A tenant's block quota per tier in one engine (0 = unlimited).
struct TenantQuota {
  Tenant tenant;
  PerTier<uint32_t> blocks;
};

// A block whose bytes sit in the host tier, offered to the stores below it
// (EngineOptions::on_spill). The spans point into the engine's index and host
// pool: valid during the call only.
struct HostBlock {
  BlockKey key;
  BlockKey parent;
  Namespace key_ns;  // The namespace its key is chained in (its tenant's and model's).
  std::span<const TokenId> tokens;
  std::span<const std::byte> payload;
  // False: it has just landed in the host tier (a demotion completed), or was
  // just committed (spill_committed), the first time since it was committed
  // or imported. True: pressure is dropping
  // it from the host tier; its slot is reused once the call returns.
  bool dropped = false;
};

// A change to the set of cached blocks (EngineOptions::on_block_event), in
// the order the engine made them: replaying them gives the blocks per tier.
enum class BlockEventKind : uint8_t {
  kStored,   // Published in `tier` (committed, fetched from a store, or taken back at a warm restart).
  kMoved,    // Its copy from `from` landed in `tier` (a demotion or promotion); `from` no longer holds it.
  kRemoved,  // Left the cache from `tier`.
};
struct BlockEvent {
  BlockEventKind kind = BlockEventKind::kStored;
  BlockKey key;
  BlockKey parent;                  // kStored, kMoved: the block before it (null for block 0).
  Tier tier = Tier::kGpu;           // Where it is now (kStored, kMoved) or was (kRemoved).
  Tier from = Tier::kGpu;           // kMoved.
  std::span<const TokenId> tokens;  // kStored, kMoved: its tokens, valid during the call only.
};

// The engine's settings that kvtierd's configuration sets one for one are named
// once, in the two structs below: DaemonConfig embeds them (config.engine and
// config.engine_limits, a row each in daemon/src/config/config_keys.cc), EngineOptions
// is made of them, and Retune takes the first whole. A new setting that reaches
// the engine is a member here and a row there, and costs no more files than one
// only kvtierd reads.

// The rule a tier's watermarks keep, 0 < low <= high <= 1, as what is wrong
// with the low one ("" if nothing); `high_name` names the high one in the
// reason. Engine::Create and Retune check the tunables with it, and kvtierd's
// configuration rows for the low watermark keys.
inline std::string LowWatermarkProblem(double low, double high, std::string_view high_name) {
  if (!(high > 0 && high <= 1.0)) return std::string(high_name) + " must be in (0, 1]";
  if (low > high) return "must not exceed " + std::string(high_name);
  if (!(low > 0)) return "must be > 0";
  return "";
}

// What may change while the engine runs (Retune).
struct EngineTunables {
  // Above high, the engine demotes (gpu) or drops (host) until usage is at low.
  double gpu_high_watermark = 0.90;
  double gpu_low_watermark = 0.75;
  double host_high_watermark = 0.95;
  double host_low_watermark = 0.85;
  uint32_t max_copy_batch = 64;      // Blocks per backend submission.
  // How long a lease may be held (0 = for ever). ExpireLeases (and Tick) revoke
  // older ones: a write lease's slots go back to the pool (a commit of it then
  // fails), a read lease's blocks are unpinned. An age is measured from the
  // grant, so a shorter timeout (Retune) applies to existing leases.
  std::chrono::milliseconds lease_timeout{0};
  // The fair share of the GPU tier for tenants without a GPU quota (0 = none).
  // When a tenant holding less than `gpu slots / active tenants` finds no GPU
  // slot for an Allocate or a promotion (every slot leased, pinned or moving),
  // then for this long each tenant without a GPU quota may hold that share:
  // past it, its Allocate fails (kResourceExhausted naming the share) unless
  // its own colder blocks make room, its promotions are not made, and its new
  // read leases stop before its GPU blocks past the share, which are demoted
  // once its older leases end. Active: holding GPU blocks or write-lease
  // slots, or waiting within this window. Nobody waiting, any tenant may use
  // the whole tier.
  std::chrono::milliseconds gpu_share_window{1000};

  friend bool operator==(const EngineTunables&, const EngineTunables&) = default;
};

// What is fixed when the engine is made.
struct EngineLimits {
  // Sessions in all. A new session beyond it evicts one, chosen fairly: the
  // coldest of its own tenant when that tenant holds at least its share
  // (max_sessions / the tenants holding sessions, itself counted), else the
  // coldest of the tenant holding the most (which is over its share). So a
  // tenant below its share never loses a session to another tenant's new one,
  // and one past it makes room from its own; with one tenant this is the
  // coldest session.
  uint32_t max_sessions = 1 << 20;
  // Blocks one session's chain may hold; 0 = no limit. A commit past it is
  // refused (kResourceExhausted), and an acquire leases (and names into the
  // session) at most that many: one endless conversation cannot take a tier.
  uint32_t max_session_blocks = 0;
  uint32_t max_blocks_per_request = 1 << 16;

  friend bool operator==(const EngineLimits&, const EngineLimits&) = default;
};

struct EngineOptions : EngineTunables, EngineLimits {
  ModelProfile profile;
  uint32_t gpu_slots = 0;
  uint32_t host_slots = 0;
  // Sessions one tenant (namespace) may hold; 0 = no limit. A new session past
  // it is refused (kResourceExhausted), never made room for. (kvtierd derives
  // it from its own limits.max_sessions_per_tenant, whose 0 means "a share".)
  uint32_t max_sessions_per_tenant = 0;
  std::string name = "default";      // The profile's name: pool objects are shm_names::PoolObject(name, tier).
  // The index's segment label (shm_names::Index: "/<instance>.<profile>.index");
  // required. The segment itself is nameless and sealed: clients map it from
  // index_fd(), read-only.
  std::string index_segment;
  // Keep the host pool's segment across runs (PoolSpec::persistent), so that
  // AdoptWarm can take its blocks back after a restart.
  bool warm_restart = false;
  // Called whenever a block leaves the cache: `dropped` is true when pressure
  // (watermarks, a full tier) pushed it out, false when its last holder let go.
  std::function<void(const BlockKey& key, bool dropped)> on_free;
  // Called on the engine's thread with every block stored, moved or removed
  // (KV events); unset, the engine pays one test of an empty function.
  std::function<void(const BlockEvent& event)> on_block_event;
  // Called when a session is evicted (by a client, or past max_sessions), with
  // its tenant's name and its id.
  std::function<void(std::string_view tenant, std::string_view session)> on_session_evicted;
  // Called on the engine's thread with each block that lands in the host tier
  // and each block that pressure drops from it (HostBlock::dropped): what a
  // tier of stores below the host tier writes through or back. It must not
  // call the engine, nor keep the spans.
  std::function<void(const HostBlock& block)> on_spill;
  // Offer each committed block to on_spill as soon as its writer is done
  // (what a write-through store needs to share it at once), not only when it
  // lands in the host tier: its bytes are copied to a free host slot for the
  // call. Nothing is evicted for that copy: with the host tier full, the
  // block is offered when it lands there instead.
  bool spill_committed = false;
  // Stores below the host tier may hold blocks the index lacks: the index
  // says so to clients (kIndexFlagStoresBelow), so that a worker whose probe
  // misses still asks (Acquire) instead of recomputing at once.
  bool stores_below = false;
  // Per-tenant quotas. The GPU quota counts a tenant's GPU blocks and the slots
  // of its write leases. A tenant at its GPU quota that allocates (or commits
  // new blocks) has its own coldest GPU blocks demoted (or, failing that,
  // dropped, when dropping makes enough room) first, never another tenant's; a
  // demotion that would pass its host quota drops its own coldest host blocks
  // first. When that cannot make room: kResourceExhausted naming the quota.
  // Promotions past the GPU quota are not made (the block is leased where it
  // is, in the host tier).
  std::vector<TenantQuota> quotas;
};

}  // namespace kvtier::tiering
