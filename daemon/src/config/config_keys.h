// The configuration's scalar keys, one row each: where the key is in the YAML,
// the DaemonConfig member it sets, what values it takes, whether a reload
// applies it, and what it means. One table drives parsing, DumpConfig, the
// reload plan and `kvtierd --config-keys`. Adding a setting: its member (in
// config.h, or for one the engine reads, in EngineTunables or EngineLimits of
// engine_options.h, which reach every engine whole), its row in
// config_keys.cc, and the code that uses it.
//
// The structured parts (profiles, access, tenants, stores.tiers) are parsed by
// hand: config.cc and config_stores.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "config/config.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

class Section;

// A member of DaemonConfig, reached from the whole config.
template <typename T>
using ConfigRef = T& (*)(DaemonConfig&);
using ConfigField = std::variant<ConfigRef<bool>, ConfigRef<uint32_t>, ConfigRef<uint64_t>, ConfigRef<double>,
                                 ConfigRef<std::chrono::milliseconds>, ConfigRef<std::string>>;

struct ConfigKey {
  const char* section;  // "limits"; "" for a key at the top level.
  const char* key;      // "lease_timeout_ms"
  ConfigField field;
  double lo = 0, hi = 0;  // A number's range, both ends included (a size's in bytes; hi kMaxByteSize: no bound).
  bool bytes = false;     // A number written as a size: 4096, 512MiB, 2GiB.
  std::span<const char* const> choices;  // A string's values; empty: any.
  bool reloadable = false;               // SIGHUP applies it while running.
  const char* doc = "";
  // A check beyond the range, with the rest of the configuration in view:
  // what is wrong, or empty.
  std::string (*check)(const DaemonConfig&) = nullptr;

  std::string Path() const;  // "limits.lease_timeout_ms"
  // The value in `config` as a YAML scalar that reads back as itself.
  std::string ValueText(const DaemonConfig& config) const;
};

// Every row, in the file's order.
std::span<const ConfigKey> ConfigKeys();

// Reads `section`'s keys from its mapping into *config, then checks them.
Status ReadConfigKeys(Section& mapping, std::string_view section, DaemonConfig* config);
// `section`'s keys as YAML lines ("  tick_ms: 20\n"), each indented by `indent`.
std::string DumpConfigKeys(const DaemonConfig& config, std::string_view section, std::string_view indent);
// Every row as a readable table: key, default, range or values, reloadable,
// what it means (kvtierd --config-keys).
std::string DescribeConfigKeys();

}  // namespace kvtier::daemon
