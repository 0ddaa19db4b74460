// DaemonConfig: kvtierd's settings, parsed from YAML.
//
// Every error names the key ("profiles[0].block_tokens: must be in [1, 1024]"),
// and unknown keys are errors, so a typo never silently means "the default".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/model_profile.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

struct ProfileConfig {
  ModelProfile profile;
  uint32_t gpu_blocks = 0;   // Slots in the GPU tier.
  uint32_t host_blocks = 0;  // Slots in the host tier.

  friend bool operator==(const ProfileConfig&, const ProfileConfig&) = default;
};

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

  double gpu_high_watermark = 0.90;
  double gpu_low_watermark = 0.75;
  double host_high_watermark = 0.95;
  double host_low_watermark = 0.85;
  uint32_t max_copy_batch = 64;
  std::string policy = "lru";
  uint32_t tick_ms = 20;            // Watermark check period.
  // With warm_restart, how often a changed manifest is rewritten while serving
  // (what a crash restart can adopt); 0: only at a clean shutdown.
  uint32_t warm_snapshot_ms = 2000;

  uint32_t max_clients = 256;
  uint32_t max_sessions = 65536;
  uint32_t max_leases_per_client = 4096;
  uint32_t max_blocks_per_request = 8192;
  uint32_t max_frame_bytes = 16u << 20;

  // Prometheus endpoint "HOST:PORT" (an IPv4 address or a bracketed IPv6 one;
  // port 0 picks a free port); empty: no endpoint.
  std::string metrics_listen;

  // Field by field; DumpConfig then ParseConfig gives back an equal config.
  friend bool operator==(const DaemonConfig&, const DaemonConfig&) = default;
};

struct ListenAddress {
  std::string host;  // An IP address literal, without brackets.
  uint16_t port = 0;
};
// "127.0.0.1:9464", "[::1]:9464" -> host and port.
Result<ListenAddress> ParseListenAddress(std::string_view text);

// What re-reading the configuration file while running does. Some settings take
// effect at once (log_level, tiering.*, limits.max_clients and
// limits.max_leases_per_client); the rest shape shared memory, the socket or
// what clients were told at Hello, and keep their running values.
struct ReloadPlan {
  DaemonConfig next;                 // `running` with every reloadable setting taken from `loaded`.
  std::vector<std::string> applied;  // "tiering.tick_ms: 20 -> 50", one per reloadable setting that changes.
  std::vector<std::string> kept;     // "profiles[0].gpu_blocks: 256 -> 512", settings that cannot change now.
};
ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& loaded);

// Parses YAML text; `source` names it in errors (a file path).
Result<DaemonConfig> ParseConfig(std::string_view yaml, std::string_view source);
Result<DaemonConfig> LoadConfigFile(const std::string& path);
// The effective configuration as YAML (what `cachectl config` shows).
std::string DumpConfig(const DaemonConfig& config);
// "64MiB" / "2 GiB" / "4096" (bytes) -> bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace kvtier::daemon
