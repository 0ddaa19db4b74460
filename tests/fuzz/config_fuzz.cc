// Fuzz target for kvtierd's configuration parser (daemon/src/config/config.cc).
//
// The input is YAML text. ParseConfig must return a status for anything, never
// throw or crash; a config it accepts must survive the `--check-config` round
// trip: parse(dump(parse(x))) == parse(x), and dumping that again gives the same
// text. A reload to an identical config must change nothing. The helpers the
// parser uses on scalars (ParseByteSize, ParseListenAddress) get the raw input too.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/config.h"

namespace {

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::daemon;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  (void)ParseByteSize(text);
  (void)ParseListenAddress(text);

  auto config = ParseConfig(text, "fuzz.yaml");
  if (!config.ok()) {
    if (config.status().message().empty()) Die("an error without a message", std::string(text));
    return 0;
  }
  const std::string dump = DumpConfig(*config);
  auto again = ParseConfig(dump, "dump.yaml");
  if (!again.ok()) Die("the dump of an accepted config does not parse", again.status().message() + "\n" + dump);
  if (!(*again == *config)) Die("the dump parses to another config", dump + "---\n" + DumpConfig(*again));
  if (DumpConfig(*again) != dump) Die("a second dump differs from the first", dump);

  const ReloadPlan plan = PlanReload(*config, *again);
  if (!plan.applied.empty() || !plan.kept.empty()) Die("reloading the same config changes settings", dump);
  if (!(plan.next == *config)) Die("reloading the same config gives another config", dump);
  return 0;
}
