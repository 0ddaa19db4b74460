// DaemonConfig: kvtierd's settings, parsed from YAML.
//
// Every error names the key ("profiles[0].block_tokens: must be in [1, 1024]"),
// and unknown keys are errors, so a typo never silently means "the default".
// Each scalar key (a member below) is one row of config_keys.cc: its range,
// whether a reload applies it and its meaning, which parsing (config.cc),
// writing back out (DumpConfig, config_dump.cc) and the reload plan follow.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/byte_size.h"
#include "config/store_kinds.h"
#include "kvtier/block_key.h"
#include "kvtier/model_profile.h"
#include "kvtier/status.h"
#include "kvtier/tiering/engine_options.h"

namespace kvtier::daemon {

// A tenant's name, configured (tenants:) or a Hello's label: 1 to
// kMaxTenantName of [A-Za-z0-9._-], so that it is safe as written in a log
// line, a stats name ("tenant.<name>.gpu_blocks") and a Prometheus label.
inline constexpr size_t kMaxTenantName = 64;
bool IsValidTenantName(std::string_view name);
// limits.max_tenants at most: a StatsResponse with every tenant's figures
// (four of at most 95 bytes each) stays well inside one frame.
inline constexpr uint32_t kMaxTenants = 16384;

struct ProfileConfig {
  ModelProfile profile;
  uint32_t gpu_blocks = 0;   // Slots in the GPU tier.
  uint32_t host_blocks = 0;  // Slots in the host tier.
  // Model identities (32 hex digits each) a client of this profile may say
  // it runs; empty: any, or none. With a list, a Hello must carry one of them.
  std::vector<ModelId> models;

  friend bool operator==(const ProfileConfig&, const ProfileConfig&) = default;
};

// Who may connect (access:). Users and groups are written as names or numeric
// ids; parsing resolves them (an unknown name is an error) into the *_ids lists.
struct AccessConfig {
  std::vector<std::string> allow_users, allow_groups, admin_users, admin_groups;  // As written.
  std::vector<uint32_t> allow_uids, allow_gids, admin_uids, admin_gids;            // Resolved.
  bool allow_root = true;   // uid 0 may connect and is an admin.
  std::string group;        // Group that owns the socket and segments; empty: the daemon's own.
  uint32_t group_gid = kNoGroup;
  uint32_t mode = 0660;     // Socket and segments: 0660 or 0600.
  static constexpr uint32_t kNoGroup = 0xffffffffu;
  friend bool operator==(const AccessConfig&, const AccessConfig&) = default;
};

// A tenant (tenants: [...]): a namespace of blocks and sessions, the users and
// groups that map to it, and its quotas per tier (0 = unlimited).
struct TenantConfig {
  std::string name;
  std::vector<std::string> users, groups;  // As written.
  std::vector<uint32_t> uids, gids;        // Resolved.
  bool allow_requested = false;  // A member may ask for this tenant at Hello.
  uint32_t gpu_blocks = 0;
  uint32_t host_blocks = 0;
  // Pools, index and sessions of its own in every profile (an engine apart),
  // sized by gpu_blocks and host_blocks (both required) and carved out of the
  // profile's: no client of another tenant is handed its segments, so none can
  // read its KV bytes and prompts or write its blocks. Not reloadable.
  bool isolated = false;
  friend bool operator==(const TenantConfig&, const TenantConfig&) = default;
};

// One store below the host tier (stores.tiers[i]); fetches ask them in order.
struct StoreTierConfig {
  std::string kind;            // A StoreKind's name (store_kinds.h): disk | redis
  bool write_through = false;  // write: through (blocks as they are committed) | back (as the host tier drops them)
  StoreOptions options;        // The kind's own keys: its alternative (DiskTierOptions, RedisTierOptions).
  friend bool operator==(const StoreTierConfig&, const StoreTierConfig&) = default;
};

// The stores below the host tier (stores:). Not reloadable.
struct StoresConfig {
  std::vector<StoreTierConfig> tiers;
  // An Acquire whose prefix goes on past the local tiers waits at most this
  // long for the stores (its connection's later requests wait behind it;
  // every other client is served meanwhile), then is answered from the local tiers.
  uint32_t fetch_budget_ms = 100;
  // A locate (an Acquire that leases nothing: vLLM's scheduler asking off its
  // step, Client::Locate) waits at most this long for the stores; then it
  // keeps what came and the rest of its fetch is cancelled.
  uint32_t locate_budget_ms = 5000;
  std::string key_prefix = "kvtier:";          // Of every key kvtierd writes to a store.
  uint64_t queue_bytes = uint64_t{256} << 20;  // Records waiting to be written, at most; past it they are skipped.
  // One Acquire fetches at most this many bytes of blocks (whole blocks, at
  // least one): what a fetch holds in memory before the host tier takes it.
  uint64_t max_fetch_bytes = uint64_t{256} << 20;
  // A fetch asks a store for at most this many bytes of records per turn (at
  // least one record): the store I/O thread serves the fetches under way a
  // chunk each in turn (round-robin over tenants), and an Acquire past its
  // budget takes the prefix its fetch verified so far.
  uint64_t fetch_chunk_bytes = uint64_t{4} << 20;
  // While another tenant has a client connected, one tenant's fetches ask the
  // stores for at most this many bytes a second (a burst of max_fetch_bytes);
  // 0: no limit. A tenant alone fetches as fast as the stores go.
  uint64_t tenant_fetch_bytes_per_second = uint64_t{256} << 20;
  // The secret records are signed with and checked against (record_key_file.h);
  // empty: records are unsigned, and a writer to a store can forge them.
  std::string record_key_file;
  friend bool operator==(const StoresConfig&, const StoresConfig&) = default;
};

// KV events (events:): every block stored, moved or removed and every session
// evicted, in batches over ZMQ (PUB, and ROUTER for replays). Off by default.
// Not reloadable.
struct EventsConfig {
  bool enabled = false;
  std::string publish;           // ZMQ endpoint of the PUB socket (tcp://, ipc://); empty: ipc://<socket_path>.events
  std::string replay;            // Of the ROUTER socket answering replays; empty: ipc://<socket_path>.replay
  std::string topic = "kvtier";  // Every message's first frame.
  std::string format = "kvtier";  // kvtier (docs/events.md) | vllm (vLLM's KVEventBatch; token ids always).
  bool token_ids = false;         // Stored events carry the block's token ids (kvtier format).
  uint32_t max_batch_events = 1024;
  uint32_t replay_batches = 4096;  // The last batches kept for replays.
  uint32_t queue_batches = 1024;   // Batches waiting for the events helper, at most; past it they are dropped.
  friend bool operator==(const EventsConfig&, const EventsConfig&) = default;
};

// The endpoints events publish on and answer replays at (EventsConfig's, or
// derived from the socket path).
std::string EventsPublishEndpoint(const EventsConfig& e, const std::string& socket_path);
std::string EventsReplayEndpoint(const EventsConfig& e, const std::string& socket_path);

struct DaemonConfig {
  std::string instance = "kvtier";  // Shared-memory names: /<instance>.<profile>.{gpu,host,index}, /<instance>.fences
  std::string socket_path = "/run/kvtier/kvtierd.sock";
  std::string backend = "auto";     // auto | host | cuda
  std::string log_level = "info";   // error | warn | info | debug
  std::vector<ProfileConfig> profiles;  // The first is the default.
  // Keep the host tier and a manifest of it across a restart (host backend):
  // /<instance>.<profile>.host stays after exit, /<instance>.<profile>.warm holds
  // the manifest. Off by default: the segments hold host memory while the daemon
  // is down. Not reloadable.
  bool warm_restart = false;
  // Fault every page of the host backend's tiers in from the start, on a thread
  // per pool while kvtierd already serves (MADV_POPULATE_WRITE), so that copies
  // into slots soon take no page faults and the memory is the daemon's from the
  // start; false: the tiers' memory grows as slots are first written (as a cache
  // server's usually does). The cuda backend pins its host tier, and pinning
  // faults every page in, whatever this says. Not reloadable.
  bool prefault = true;
  // After handling requests, the event loop keeps polling this long before it
  // sleeps in epoll_wait, so a client's next request finds it awake (0: never).
  uint32_t busy_poll_us = 50;

  // The engine's own settings (tiering.*_watermark, max_copy_batch;
  // limits.lease_timeout_ms, gpu_share_window_ms, max_sessions,
  // max_session_blocks, max_blocks_per_request): named once, in
  // engine_options.h, and given to every engine whole. kvtierd's defaults
  // where they differ from the engine library's.
  tiering::EngineTunables engine{.lease_timeout = std::chrono::milliseconds(30000)};
  tiering::EngineLimits engine_limits{.max_sessions = 65536, .max_blocks_per_request = 8192};
  std::string policy = "lru";
  uint32_t tick_ms = 20;            // Watermark check period.
  // With warm_restart, how often a changed manifest is rewritten while serving
  // (what a crash restart can adopt); 0: only at a clean shutdown.
  uint32_t warm_snapshot_ms = 2000;

  uint32_t max_clients = 256;
  // New connections one uid may open per second (a burst of one second's
  // worth); past it a connection is refused at accept, before any work for it.
  // 0: no limit.
  uint32_t connects_per_second = 1000;
  // Clients one tenant may have connected at once; a Hello past it is refused.
  // 0 (the default): derived, see ClientsPerTenant.
  uint32_t max_clients_per_tenant = 0;
  // Sessions per tenant and profile; a new one past it is refused. 0 (the
  // default): derived, see SessionsPerTenant.
  uint32_t max_sessions_per_tenant = 0;
  // Tenant labels kvtierd remembers (each has its stats and metrics) when no
  // tenants: are configured and a Hello names its tenant freely: a Hello with
  // a new label past it is refused (resource_exhausted) unless a label with no
  // client connected and no session or block can be forgotten to make room.
  // Configured tenants are always known and do not count.
  uint32_t max_tenants = 1024;
  uint32_t max_leases_per_client = 4096;
  uint32_t max_frame_bytes = 16u << 20;
  uint32_t hello_timeout_ms = 10000;  // A connection must send Hello this soon, else it is closed.
  uint32_t frame_timeout_ms = 10000;  // A frame begun must arrive whole this soon, else the connection is closed.
  // Past this many unsent reply bytes a connection's requests are not read
  // (until its replies drain below it); a reply finding kReplyCloseFactor times
  // as many unsent closes it.
  uint32_t max_reply_backlog_bytes = 4u << 20;

  // Prometheus endpoint "HOST:PORT" (an IPv4 address or a bracketed IPv6 one;
  // port 0 picks a free port); empty: no endpoint.
  std::string metrics_listen;

  AccessConfig access;
  // Empty: no tenant mapping; a client's Hello names its tenant (a label, for a
  // box where every allowed peer is trusted alike). Otherwise peers map to the
  // tenant listing their uid or a gid, else to "default".
  std::vector<TenantConfig> tenants;

  StoresConfig stores;
  EventsConfig events;

  // Field by field; DumpConfig then ParseConfig gives back an equal config.
  friend bool operator==(const DaemonConfig&, const DaemonConfig&) = default;
};

// Connections kvtierd holds at once: max_clients, plus this many for peers
// still before their Hello (refused peers and max_clients' own refusals
// included). Those past it are closed at accept.
inline constexpr uint32_t kConnectionsBeforeHello = 16;
// A reply that finds this many times limits.max_reply_backlog_bytes unsent
// closes its connection.
inline constexpr uint32_t kReplyCloseFactor = 4;
// The largest configuration file read (wire::kMaxConfigBytes, what
// ConfigResponse carries, is the same); a larger one is refused unparsed.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{1} << 20;
// The per-tenant session limit in force: limits.max_sessions_per_tenant, or
// when that is 0, max_sessions / (configured tenants + 1, for "default") with
// tenants:, and none without (a box whose clients label themselves; the fair
// eviction of a full max_sessions keeps labels from evicting one another).
uint32_t SessionsPerTenant(const DaemonConfig& config);
// The per-tenant client limit in force: limits.max_clients_per_tenant, or with
// tenants: configured max_clients / (their number + 1, for the default tenant),
// so that no tenant can take every connection while others wait; 0 (no limit
// of its own) without tenants:, where a tenant is a label any client may pick.
uint32_t ClientsPerTenant(const DaemonConfig& config);

struct ListenAddress {
  std::string host;  // An IP address literal, without brackets.
  uint16_t port = 0;
};
// "127.0.0.1:9464", "[::1]:9464" -> host and port.
Result<ListenAddress> ParseListenAddress(std::string_view text);

// What re-reading the configuration file while running does. The keys marked
// reloadable in config_keys.cc (`kvtierd --config-keys` lists them) take
// effect at once; the rest shape shared memory, the socket or what clients
// were told at Hello, and keep their running values.
struct ReloadPlan {
  DaemonConfig next;                 // `running` with every reloadable setting taken from `loaded`.
  std::vector<std::string> applied;  // "tiering.tick_ms: 20 -> 50", one per reloadable setting that changes.
  std::vector<std::string> kept;     // "profiles[0].gpu_blocks: 256 -> 512", settings that cannot change now.
};
ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& loaded);

// Parses YAML text; `source` names it in errors (a file path).
Result<DaemonConfig> ParseConfig(std::string_view yaml, std::string_view source);
// Reads and parses `path`; a file larger than kMaxConfigFileBytes is an error
// naming its size and the limit.
Result<DaemonConfig> LoadConfigFile(const std::string& path);
// The effective configuration as YAML (what `cachectl config` shows).
std::string DumpConfig(const DaemonConfig& config);

}  // namespace kvtier::daemon
