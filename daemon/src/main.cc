// kvtierd: parse the command line, load the configuration, serve.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "config/config.h"
#include "config/config_keys.h"
#include "events/events_helper.h"
#include "instance_lock.h"
#include "kvtier/stores/allocator.h"
#include "log.h"
#include "notify.h"
#include "server/server.h"
#include "service/service.h"

namespace {

constexpr const char* kUsage =
    "usage: kvtierd [--config FILE] [--socket PATH] [--instance NAME] [--metrics-listen ADDR]\n"
    "               [--check-config] [--config-keys] [--version]\n"
    "\n"
    "The kvtier KV-cache daemon: owns KV blocks in a GPU tier and a host tier and\n"
    "serves model-worker processes over a Unix socket. SIGHUP re-reads the\n"
    "configuration file; SIGTERM or SIGINT stops it.\n"
    "\n"
    "  --config FILE          YAML configuration (default /etc/kvtier/kvtierd.yaml)\n"
    "  --socket PATH          listen here instead of the configured socket\n"
    "  --instance NAME        shared-memory name prefix instead of the configured one\n"
    "  --metrics-listen ADDR  serve Prometheus metrics on http://ADDR/metrics (HOST:PORT,\n"
    "                         port 0 picks one; \"\" turns it off) instead of metrics.listen\n"
    "  --check-config         validate the configuration, print it, and exit\n"
    "  --config-keys          list every configuration key with its default, its range and\n"
    "                         whether SIGHUP applies it, and exit\n"
    "  --version              print the version and exit\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace kvtier::daemon;
  // kvtierd started as its own KV events helper (events_helper.h): nothing else of main runs.
  if (argc > 1 && std::strcmp(argv[1], kEventsHelperArg) == 0) return RunEventsHelper(argc, argv);
  std::string config_path = "/etc/kvtier/kvtierd.yaml";
  std::string socket_override, instance_override;
  std::optional<std::string> metrics_override;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvtierd: %s needs a value\n%s", name, kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("kvtierd %s (protocol %u)\n", KVTIER_VERSION, kvtier::wire::kProtocolVersion);
      return 0;
    } else if (a == "--config") {
      config_path = value("--config");
    } else if (a == "--socket") {
      socket_override = value("--socket");
    } else if (a == "--instance") {
      instance_override = value("--instance");
    } else if (a == "--metrics-listen") {
      metrics_override = value("--metrics-listen");
      if (!metrics_override->empty()) {
        auto addr = ParseListenAddress(*metrics_override);
        if (!addr.ok()) {
          std::fprintf(stderr, "kvtierd: --metrics-listen: %s\n", addr.status().message().c_str());
          return 2;
        }
      }
    } else if (a == "--config-keys") {
      std::fputs(DescribeConfigKeys().c_str(), stdout);
      return 0;
    } else if (a == "--check-config") {
      check_only = true;
    } else {
      std::fprintf(stderr, "kvtierd: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }

  // The file with the command line's overrides: at start, and again at each SIGHUP.
  auto load = [=]() -> kvtier::Result<DaemonConfig> {
    auto c = LoadConfigFile(config_path);
    if (!c.ok()) return c.status();
    if (!socket_override.empty()) c->socket_path = socket_override;
    if (!instance_override.empty()) c->instance = instance_override;
    if (metrics_override) c->metrics_listen = *metrics_override;
    return c;
  };
  auto config = load();
  if (!config.ok()) {
    std::fprintf(stderr, "kvtierd: configuration error: %s\n", config.status().message().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("%s", DumpConfig(*config).c_str());
    return 0;
  }
  SetLogLevel(config->log_level);
  LogInfo(std::string("kvtierd ") + KVTIER_VERSION + " starting: config " + config_path);
  if (std::getenv("NOTIFY_SOCKET") != nullptr && !notify::Available()) {
    LogWarn("NOTIFY_SOCKET is set, but this kvtierd was built without libsystemd and cannot report readiness "
            "(run it as Type=simple, or rebuild with libsystemd-dev)");
  }

  auto lock = InstanceLock::Acquire(*config);
  if (!lock.ok()) {
    LogError("cannot start: " + lock.status().message());
    return 1;
  }
  if (!lock->instance_lost().empty()) {
    LogError("warm restart is off for this run: " + lock->instance_lost() +
             " (remove it, or choose another instance name)");
    config->warm_restart = false;
  }
  // Process tuning, all here: with stores below the host tier, fetch buffers are kept for the next fetch.
  if (!config->stores.tiers.empty()) kvtier::stores::KeepFetchBuffers(config->stores.max_fetch_bytes);
  auto service = Service::Create(*config);
  if (!service.ok()) {
    LogError("cannot start: " + service.status().ToString());
    return 1;
  }
  LogInfo((*service)->Describe());
  Server server(**service, *config, load);
  const kvtier::Status st = server.Start();
  if (!st.ok()) {
    LogError("cannot start: " + st.message());
    return 1;
  }
  return server.Run();
}
