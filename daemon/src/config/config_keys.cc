// The table of the configuration's scalar keys (config_keys.h).
#include "config/config_keys.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "config/config_section.h"

namespace kvtier::daemon {
namespace {

// The member `path` of a DaemonConfig, as a ConfigRef.
#define KVTIER_MEMBER(path) +[](DaemonConfig& c) -> auto& { return c.path; }

template <typename T>
ConfigKey Number(const char* section, const char* key, ConfigRef<T> field, double lo, double hi, bool reloadable,
                 const char* doc, std::string (*check)(const DaemonConfig&) = nullptr) {
  return ConfigKey{section, key, field, lo, hi, false, {}, reloadable, doc, check};
}
// A duration written in whole milliseconds (a key named *_ms).
ConfigKey Millis(const char* section, const char* key, ConfigRef<std::chrono::milliseconds> field, double lo,
                 double hi, bool reloadable, const char* doc, std::string (*check)(const DaemonConfig&) = nullptr) {
  return ConfigKey{section, key, field, lo, hi, false, {}, reloadable, doc, check};
}
template <typename T>
ConfigKey Size(const char* section, const char* key, ConfigRef<T> field, double lo, double hi, bool reloadable,
               const char* doc) {
  return ConfigKey{section, key, field, lo, hi, true, {}, reloadable, doc, nullptr};
}
ConfigKey Text(const char* section, const char* key, ConfigRef<std::string> field, std::span<const char* const> choices,
               bool reloadable, const char* doc, std::string (*check)(const DaemonConfig&) = nullptr) {
  return ConfigKey{section, key, field, 0, 0, false, choices, reloadable, doc, check};
}
ConfigKey Flag(const char* section, const char* key, ConfigRef<bool> field, bool reloadable, const char* doc) {
  return ConfigKey{section, key, field, 0, 0, false, {}, reloadable, doc, nullptr};
}

constexpr bool kReloadable = true, kAtStart = false;
constexpr const char* kBackends[] = {"auto", "host", "cuda"};
constexpr const char* kLogLevels[] = {"error", "warn", "info", "debug"};
constexpr const char* kPolicies[] = {"lru"};
constexpr const char* kEventFormats[] = {"kvtier", "vllm"};

// A NUL would cut a shared-memory or socket name short; no name needs the others.
bool HasControlCharacter(const std::string& v) {
  return std::any_of(v.begin(), v.end(), [](char ch) {
    const auto u = static_cast<unsigned char>(ch);
    return u < 0x20 || u == 0x7f;
  });
}

// ---- Checks beyond a key's range ----

std::string CheckInstance(const DaemonConfig& c) {
  if (c.instance.empty() || c.instance.size() > 64 || c.instance.find('/') != std::string::npos ||
      HasControlCharacter(c.instance)) {
    return "must be 1-64 characters without '/' or control characters";
  }
  return "";
}
std::string CheckSocket(const DaemonConfig& c) {
  if (c.socket_path.empty() || c.socket_path.size() > 107) return "must be a path of 1-107 bytes";
  if (HasControlCharacter(c.socket_path)) return "must not hold control characters";
  return "";
}
// The engine's own rule (engine_options.h), named by key.
std::string CheckGpuLow(const DaemonConfig& c) {
  return tiering::LowWatermarkProblem(c.engine.gpu_low_watermark, c.engine.gpu_high_watermark, "gpu_high_watermark");
}
std::string CheckHostLow(const DaemonConfig& c) {
  return tiering::LowWatermarkProblem(c.engine.host_low_watermark, c.engine.host_high_watermark,
                                      "host_high_watermark");
}
std::string CheckLeaseTimeout(const DaemonConfig& c) {
  const auto ms = c.engine.lease_timeout.count();
  if (ms != 0 && ms < 100) return "must be 0 (never) or at least 100, got " + std::to_string(ms);
  return "";
}
std::string CheckMetricsListen(const DaemonConfig& c) {
  if (c.metrics_listen.empty()) return "";
  auto addr = ParseListenAddress(c.metrics_listen);
  return addr.ok() ? "" : addr.status().message();
}
std::string CheckKeyPrefix(const DaemonConfig& c) {
  return c.stores.key_prefix.size() > 64 ? "must be at most 64 bytes" : "";
}
std::string CheckRecordKeyFile(const DaemonConfig& c) {
  const std::string& p = c.stores.record_key_file;
  if (p.empty()) return "";
  if (p[0] != '/') return "must be an absolute path";
  return HasControlCharacter(p) ? "must not hold control characters" : "";
}
std::string CheckEndpoint(const std::string& endpoint) {
  if (endpoint.empty()) return "";
  for (const char* scheme : {"tcp://", "ipc://"}) {
    if (endpoint.starts_with(scheme) && endpoint.size() > std::string_view(scheme).size()) return "";
  }
  return "'" + endpoint.substr(0, 80) + "' is not a ZMQ endpoint: tcp://HOST:PORT or ipc:///PATH";
}
std::string CheckPublish(const DaemonConfig& c) { return CheckEndpoint(c.events.publish); }
std::string CheckReplay(const DaemonConfig& c) {
  if (std::string e = CheckEndpoint(c.events.replay); !e.empty()) return e;
  if (!c.events.publish.empty() && c.events.publish == c.events.replay) return "must differ from events.publish";
  return "";
}
std::string CheckTopic(const DaemonConfig& c) {
  return c.events.topic.size() > 255 ? "must be at most 255 bytes" : "";
}

// clang-format off
const std::vector<ConfigKey>& Table() {
  static const std::vector<ConfigKey> kKeys = {
    Text("", "instance", KVTIER_MEMBER(instance), {}, kAtStart,
         "Shared-memory names: /<instance>.<profile>.{gpu,host,index}, /<instance>.fences", &CheckInstance),
    Text("", "socket", KVTIER_MEMBER(socket_path), {}, kAtStart, "The Unix socket clients connect to", &CheckSocket),
    Text("", "backend", KVTIER_MEMBER(backend), kBackends, kAtStart,
         "The GPU tier: cuda (device memory), host (shared memory), auto (cuda where a GPU is)"),
    Text("", "log_level", KVTIER_MEMBER(log_level), kLogLevels, kReloadable, "Lines below it are not written"),
    Flag("", "warm_restart", KVTIER_MEMBER(warm_restart), kAtStart,
         "Keep the host tier and a manifest of it across a restart (host backend)"),
    Flag("", "prefault", KVTIER_MEMBER(prefault), kAtStart,
         "Fault both tiers' pages in from the start, in the background while serving (host backend): memory "
         "held from the start, no page faults on a first write; false: memory grows as slots are first written"),
    Number<uint32_t>("", "busy_poll_us", KVTIER_MEMBER(busy_poll_us), 0, 10000, kReloadable,
                     "After requests, the event loop polls this long before sleeping (0: never)"),

    Number<double>("tiering", "gpu_high_watermark", KVTIER_MEMBER(engine.gpu_high_watermark), 0.01, 1.0, kReloadable,
                   "GPU tier use past which cold blocks are demoted to the host tier"),
    Number<double>("tiering", "gpu_low_watermark", KVTIER_MEMBER(engine.gpu_low_watermark), 0.0, 1.0, kReloadable,
                   "...until its use is down to this", &CheckGpuLow),
    Number<double>("tiering", "host_high_watermark", KVTIER_MEMBER(engine.host_high_watermark), 0.01, 1.0, kReloadable,
                   "Host tier use past which cold blocks are dropped (to the stores, if any)"),
    Number<double>("tiering", "host_low_watermark", KVTIER_MEMBER(engine.host_low_watermark), 0.0, 1.0, kReloadable,
                   "...until its use is down to this", &CheckHostLow),
    Number<uint32_t>("tiering", "max_copy_batch", KVTIER_MEMBER(engine.max_copy_batch), 1, 65536, kReloadable,
                     "Blocks one copy batch moves between tiers, at most"),
    Text("tiering", "policy", KVTIER_MEMBER(policy), kPolicies, kReloadable, "Which sessions go cold first"),
    Number<uint32_t>("tiering", "tick_ms", KVTIER_MEMBER(tick_ms), 1, 60000, kReloadable, "Watermark check period"),
    Number<uint32_t>("tiering", "warm_snapshot_ms", KVTIER_MEMBER(warm_snapshot_ms), 0, 3600000, kReloadable,
                     "With warm_restart, how often a changed manifest is rewritten (0: at a clean shutdown only)"),

    Number<uint32_t>("limits", "max_clients", KVTIER_MEMBER(max_clients), 1, 1u << 20, kReloadable,
                     "Clients connected at once"),
    Number<uint32_t>("limits", "connects_per_second", KVTIER_MEMBER(connects_per_second), 0, 1u << 20, kReloadable,
                     "New connections per second from one uid (burst: one second's worth); 0: no limit"),
    Number<uint32_t>("limits", "max_clients_per_tenant", KVTIER_MEMBER(max_clients_per_tenant), 0, 1u << 20,
                     kReloadable, "Clients of one tenant at once; 0: max_clients / (tenants + 1) with tenants:"),
    Number<uint32_t>("limits", "max_sessions", KVTIER_MEMBER(engine_limits.max_sessions), 1, 1u << 28, kAtStart,
                     "Sessions per profile"),
    Number<uint32_t>("limits", "max_sessions_per_tenant", KVTIER_MEMBER(max_sessions_per_tenant), 0, 1u << 28,
                     kAtStart, "Sessions of one tenant per profile; 0: max_sessions / (tenants + 1) with tenants:"),
    Number<uint32_t>("limits", "max_session_blocks", KVTIER_MEMBER(engine_limits.max_session_blocks), 0, 1u << 28, kAtStart,
                     "Blocks one session may hold; 0: no limit"),
    Number<uint32_t>("limits", "max_tenants", KVTIER_MEMBER(max_tenants), 1, kMaxTenants, kReloadable,
                     "Tenant labels remembered when clients name their tenant (no tenants:)"),
    Number<uint32_t>("limits", "max_leases_per_client", KVTIER_MEMBER(max_leases_per_client), 1, 1u << 24,
                     kReloadable, "Leases one client may hold at once"),
    Number<uint32_t>("limits", "max_blocks_per_request", KVTIER_MEMBER(engine_limits.max_blocks_per_request), 1, 1u << 20, kAtStart,
                     "Blocks one request may name"),
    Size<uint32_t>("limits", "max_frame_bytes", KVTIER_MEMBER(max_frame_bytes), 4096, 16u << 20, kAtStart,
                   "The largest frame a client may send"),
    Number<uint32_t>("limits", "hello_timeout_ms", KVTIER_MEMBER(hello_timeout_ms), 10, 600000, kReloadable,
                     "A connection must send Hello this soon, else it is closed"),
    Number<uint32_t>("limits", "frame_timeout_ms", KVTIER_MEMBER(frame_timeout_ms), 10, 600000, kReloadable,
                     "A frame begun must arrive whole this soon, else the connection is closed"),
    Size<uint32_t>("limits", "max_reply_backlog_bytes", KVTIER_MEMBER(max_reply_backlog_bytes), 64u << 10, 1u << 30,
                   kReloadable, "Unsent reply bytes past which a connection's requests wait (4x: it is closed)"),
    Millis("limits", "lease_timeout_ms", KVTIER_MEMBER(engine.lease_timeout), 0, 86400000, kReloadable,
           "A lease older than this is revoked (0: never)", &CheckLeaseTimeout),
    Millis("limits", "gpu_share_window_ms", KVTIER_MEMBER(engine.gpu_share_window), 0, 3600000, kReloadable,
           "After a tenant below its fair share of the gpu tier finds no slot, tenants without a gpu quota "
           "are held to gpu slots / active tenants this long (0: no fair share)"),

    Text("metrics", "listen", KVTIER_MEMBER(metrics_listen), {}, kAtStart,
         "Prometheus endpoint HOST:PORT (port 0: any free one); empty: none", &CheckMetricsListen),

    Number<uint32_t>("stores", "fetch_budget_ms", KVTIER_MEMBER(stores.fetch_budget_ms), 1, 60000, kAtStart,
                     "How long an Acquire waits for the stores below the host tier"),
    Number<uint32_t>("stores", "locate_budget_ms", KVTIER_MEMBER(stores.locate_budget_ms), 1, 60000, kAtStart,
                     "How long a locate (a lookup that leases nothing, off an engine's step) waits for the stores"),
    Text("stores", "key_prefix", KVTIER_MEMBER(stores.key_prefix), {}, kAtStart,
         "The prefix of every key kvtierd writes to a store", &CheckKeyPrefix),
    Size<uint64_t>("stores", "queue_bytes", KVTIER_MEMBER(stores.queue_bytes), 1u << 20, kMaxByteSize, kAtStart,
                   "Records waiting to be written, at most; past it they are skipped"),
    Size<uint64_t>("stores", "max_fetch_bytes", KVTIER_MEMBER(stores.max_fetch_bytes), 1u << 20, kMaxByteSize, kAtStart,
                   "Bytes of blocks one Acquire fetches from the stores, at most"),
    Size<uint64_t>("stores", "tenant_fetch_bytes_per_second", KVTIER_MEMBER(stores.tenant_fetch_bytes_per_second), 0,
                   kMaxByteSize, kAtStart,
                   "Bytes one tenant's fetches may ask the stores for per second while another tenant has a client "
                   "connected (a burst of max_fetch_bytes); 0: no limit"),
    Size<uint64_t>("stores", "fetch_chunk_bytes", KVTIER_MEMBER(stores.fetch_chunk_bytes), 1u << 12, kMaxByteSize,
                   kAtStart, "Bytes of records a fetch reads per turn of the store I/O thread (tenants take turns)"),
    Text("stores", "record_key_file", KVTIER_MEMBER(stores.record_key_file), {}, kAtStart,
         "File of the secret (32+ bytes, mode 0600) store records are signed with and checked against; "
         "empty: unsigned records", &CheckRecordKeyFile),

    Flag("events", "enabled", KVTIER_MEMBER(events.enabled), kAtStart, "Publish KV events"),
    Text("events", "publish", KVTIER_MEMBER(events.publish), {}, kAtStart,
         "ZMQ endpoint of the PUB socket; empty: ipc://<socket>.events", &CheckPublish),
    Text("events", "replay", KVTIER_MEMBER(events.replay), {}, kAtStart,
         "ZMQ endpoint of the replay ROUTER socket; empty: ipc://<socket>.replay", &CheckReplay),
    Text("events", "topic", KVTIER_MEMBER(events.topic), {}, kAtStart, "Every message's first frame", &CheckTopic),
    Text("events", "format", KVTIER_MEMBER(events.format), kEventFormats, kAtStart,
         "kvtier: kvtierd's own batches; vllm: vLLM's KVEventBatch (BlockStored/BlockRemoved, medium GPU/CPU), "
         "token ids always included"),
    Flag("events", "token_ids", KVTIER_MEMBER(events.token_ids), kAtStart,
         "Stored events carry the token ids (the vllm format always does)"),
    Number<uint32_t>("events", "max_batch_events", KVTIER_MEMBER(events.max_batch_events), 1, 1u << 20, kAtStart,
                     "Events in one batch, at most"),
    Number<uint32_t>("events", "replay_batches", KVTIER_MEMBER(events.replay_batches), 0, 1u << 24, kAtStart,
                     "The last batches kept for replays"),
    Number<uint32_t>("events", "queue_batches", KVTIER_MEMBER(events.queue_batches), 1, 1u << 20, kAtStart,
                     "Batches waiting for the events helper process, at most; past it they are dropped"),
  };
  return kKeys;
}
// clang-format on

#undef KVTIER_MEMBER

// 4096 -> "4KiB", 16777216 -> "16MiB"; other values in bytes.
std::string SizeText(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && std::fmod(bytes, 1024) == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(static_cast<uint64_t>(bytes)) + kUnits[unit];
}

// Reads one size key into a member of type T, checking the key's range.
template <typename T>
Status ReadSize(Section& s, const ConfigKey& k, T* out) {
  uint64_t v = *out;
  KVTIER_RETURN_IF_ERROR(s.ReadBytes(k.key, &v));
  if (v < k.lo || v > k.hi) {
    return s.Error(k.key, k.hi >= kMaxByteSize ? "must be at least " + SizeText(k.lo)
                                       : "must be in [" + SizeText(k.lo) + ", " + SizeText(k.hi) + "]");
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

template <typename... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <typename... F>
Overloaded(F...) -> Overloaded<F...>;  // Clang 14 deduces no aggregate's arguments itself.

Status ReadKey(Section& s, const ConfigKey& k, DaemonConfig* c) {
  return std::visit(
      Overloaded{
          [&](ConfigRef<bool> m) { return s.ReadBool(k.key, &m(*c)); },
          [&](ConfigRef<uint32_t> m) {
            return k.bytes ? ReadSize(s, k, &m(*c))
                           : s.Read<uint32_t>(k.key, &m(*c), static_cast<uint32_t>(k.lo), static_cast<uint32_t>(k.hi));
          },
          [&](ConfigRef<uint64_t> m) {
            return k.bytes ? ReadSize(s, k, &m(*c))
                           : s.Read<uint64_t>(k.key, &m(*c), static_cast<uint64_t>(k.lo), static_cast<uint64_t>(k.hi));
          },
          [&](ConfigRef<double> m) { return s.Read<double>(k.key, &m(*c), k.lo, k.hi); },
          [&](ConfigRef<std::chrono::milliseconds> m) {  // A key named *_ms: whole milliseconds.
            uint32_t ms = static_cast<uint32_t>(m(*c).count());
            KVTIER_RETURN_IF_ERROR(
                s.Read<uint32_t>(k.key, &ms, static_cast<uint32_t>(k.lo), static_cast<uint32_t>(k.hi)));
            m(*c) = std::chrono::milliseconds(ms);
            return Status::Ok();
          },
          [&](ConfigRef<std::string> m) { return s.ReadString(k.key, &m(*c), k.choices); },
      },
      k.field);
}

}  // namespace

std::span<const ConfigKey> ConfigKeys() { return Table(); }

std::string ConfigKey::Path() const { return *section == '\0' ? key : std::string(section) + "." + key; }

std::string ConfigKey::ValueText(const DaemonConfig& config) const {
  // The row's member is read through a reference to the whole config; nothing is written.
  DaemonConfig& c = const_cast<DaemonConfig&>(config);
  return std::visit(Overloaded{
                        [&](ConfigRef<bool> m) -> std::string { return m(c) ? "true" : "false"; },
                        [&](ConfigRef<uint32_t> m) { return std::to_string(m(c)); },
                        [&](ConfigRef<uint64_t> m) { return std::to_string(m(c)); },
                        [&](ConfigRef<double> m) { return YamlDouble(m(c)); },
                        [&](ConfigRef<std::chrono::milliseconds> m) { return std::to_string(m(c).count()); },
                        [&](ConfigRef<std::string> m) { return YamlString(m(c)); },
                    },
                    field);
}

Status ReadConfigKeys(Section& s, std::string_view section, DaemonConfig* c) {
  for (const ConfigKey& k : Table()) {
    if (k.section == section) KVTIER_RETURN_IF_ERROR(ReadKey(s, k, c));
  }
  for (const ConfigKey& k : Table()) {
    if (k.section != section || k.check == nullptr) continue;
    if (const std::string wrong = k.check(*c); !wrong.empty()) return s.Error(k.key, wrong);
  }
  return Status::Ok();
}

std::string DumpConfigKeys(const DaemonConfig& c, std::string_view section, std::string_view indent) {
  std::string out;
  for (const ConfigKey& k : Table()) {
    if (k.section == section) out += std::string(indent) + k.key + ": " + k.ValueText(c) + "\n";
  }
  return out;
}

std::string DescribeConfigKeys() {
  const DaemonConfig defaults;
  std::ostringstream o;
  for (const ConfigKey& k : Table()) {
    o << k.Path() << "  (default " << k.ValueText(defaults);
    if (!k.choices.empty()) {
      o << "; one of";
      for (const char* choice : k.choices) o << " " << choice;
    } else if (k.bytes) {
      o << "; a size in [" << SizeText(k.lo) << ", " << (k.hi >= kMaxByteSize ? std::string("...") : SizeText(k.hi)) << "]";
    } else if (k.hi > k.lo) {
      o << "; in [" << YamlDouble(k.lo) << ", " << YamlDouble(k.hi) << "]";
    }
    o << (k.reloadable ? "; reloadable" : "; at start") << ")\n    " << k.doc << "\n";
  }
  return o.str();
}

}  // namespace kvtier::daemon
