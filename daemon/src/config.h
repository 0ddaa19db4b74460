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
};

struct DaemonConfig {
  std::string instance = "kvtier";  // Shared-memory names: /<instance>.<profile>.{gpu,host,index}, /<instance>.fences
  std::string socket_path = "/run/kvtier/kvtierd.sock";
  std::string backend = "auto";     // auto | host | cuda
  std::string log_level = "info";   // error | warn | info | debug
  std::vector<ProfileConfig> profiles;  // The first is the default.

  double gpu_high_watermark = 0.90;
  double gpu_low_watermark = 0.75;
  double host_high_watermark = 0.95;
  double host_low_watermark = 0.85;
  uint32_t max_copy_batch = 64;
  std::string policy = "lru";
  uint32_t tick_ms = 20;            // Watermark check period.

  uint32_t max_clients = 256;
  uint32_t max_sessions = 65536;
  uint32_t max_leases_per_client = 4096;
  uint32_t max_blocks_per_request = 8192;
  uint32_t max_frame_bytes = 16u << 20;
};

// Parses YAML text; `source` names it in errors (a file path).
Result<DaemonConfig> ParseConfig(std::string_view yaml, std::string_view source);
Result<DaemonConfig> LoadConfigFile(const std::string& path);
// The effective configuration as YAML (what `cachectl config` shows).
std::string DumpConfig(const DaemonConfig& config);
// "64MiB" / "2 GiB" / "4096" (bytes) -> bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace kvtier::daemon
