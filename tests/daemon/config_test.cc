// kvtierd's YAML configuration: the default file parses, and every mistake is
// reported with the key it concerns.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "config/config.h"
#include "config/config_keys.h"
#include "service/engine_set.h"
#include "stores/store_factory.h"

namespace kvtier::daemon {
namespace {

constexpr const char* kMinimal = R"(profiles:
  - name: p
    layers: 2
    kv_heads: 2
    head_dim: 64
    gpu_blocks: 10
    host_blocks: 20
)";

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  return c.ok() ? "" : c.status().message();
}

TEST(ConfigTest, TheShippedDefaultParses) {
  auto c = LoadConfigFile(KVTIER_DEFAULT_CONFIG);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->backend, "auto");
  ASSERT_EQ(c->profiles.size(), 3u);
  EXPECT_EQ(c->profiles[0].profile.name, "default");
  EXPECT_EQ(c->profiles[0].profile.BlockBytes(), 128u * 1024);
  EXPECT_EQ(c->profiles[0].gpu_blocks, 512u);   // 64 MiB of 128 KiB blocks.
  EXPECT_EQ(c->profiles[0].host_blocks, 4096u);  // 512 MiB.
  // The real model's (scripts/make_model.py): 30 layers x 3 KV heads x 64, fp32.
  EXPECT_EQ(c->profiles[1].profile.name, "smollm2");
  EXPECT_EQ(c->profiles[1].profile.BlockBytes(), 720u * 1024);
  EXPECT_EQ(c->profiles[1].gpu_blocks, 364u);    // 256 MiB.
  EXPECT_EQ(c->profiles[1].host_blocks, 1456u);  // 1 GiB.
  // The same model for vLLM's CPU backend: one block is one of vLLM's, 128 tokens.
  EXPECT_EQ(c->profiles[2].profile.name, "smollm2-vllm-cpu");
  EXPECT_EQ(c->profiles[2].profile.block_tokens, 128u);
  EXPECT_EQ(c->profiles[2].profile.BlockBytes(), 5760u * 1024);
  EXPECT_EQ(c->profiles[2].gpu_blocks, 45u);    // 256 MiB.
  EXPECT_EQ(c->profiles[2].host_blocks, 182u);  // 1 GiB.
}

TEST(ConfigTest, DefaultsFillWhatIsNotGiven) {
  auto c = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->instance, "kvtier");
  EXPECT_EQ(c->profiles[0].profile.block_tokens, 16u);
  EXPECT_EQ(c->profiles[0].profile.dtype, DType::kF16);
  EXPECT_DOUBLE_EQ(c->engine.gpu_high_watermark, 0.90);
  EXPECT_EQ(c->max_frame_bytes, 16u << 20);
}

TEST(ConfigTest, TheDumpParsesBackToTheSameConfig) {
  auto c = ParseConfig(std::string(kMinimal) + "tiering:\n  gpu_low_watermark: 0.5\n", "test.yaml");
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*c));
  EXPECT_DOUBLE_EQ(again->engine.gpu_low_watermark, 0.5);
}

TEST(ConfigTest, UnknownKeysAreErrorsNamingTheKey) {
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "sockett: /x\n").find("sockett: unknown key"), std::string::npos);
  const std::string nested = ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_hgh_watermark: 0.5\n");
  EXPECT_NE(nested.find("tiering.gpu_hgh_watermark: unknown key"), std::string::npos) << nested;
  std::string p = kMinimal;
  p.replace(p.find("layers"), 6, "layerz");
  EXPECT_NE(ErrorOf(p).find("profiles[0].layerz"), std::string::npos) << ErrorOf(p);
}

TEST(ConfigTest, BadValuesNameTheKeyAndTheProblem) {
  std::string p = kMinimal;
  p.replace(p.find("head_dim: 64"), 12, "head_dim: lots");
  EXPECT_NE(ErrorOf(p).find("profiles[0].head_dim: expected a number"), std::string::npos) << ErrorOf(p);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "backend: gpu\n").find("backend: 'gpu' is not one of auto, host, cuda"),
            std::string::npos);
  const std::string wm = ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_high_watermark: 1.5\n");
  EXPECT_NE(wm.find("tiering.gpu_high_watermark: must be in"), std::string::npos) << wm;
  const std::string order =
      ErrorOf(std::string(kMinimal) + "tiering:\n  gpu_high_watermark: 0.5\n  gpu_low_watermark: 0.6\n");
  EXPECT_NE(order.find("gpu_low_watermark: must not exceed"), std::string::npos) << order;
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "limits:\n  max_frame_bytes: 64MiB\n").find("limits.max_frame_bytes"),
            std::string::npos);
}

// profiles[].models: model identities, 32 hex digits each; the dump carries
// them back.
TEST(ConfigTest, AProfileListsTheModelsItAccepts) {
  const std::string id = "00112233445566778899aabbccddeeff";
  auto c = ParseConfig(std::string(kMinimal) + "    models: [\"" + id + "\"]\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->profiles[0].models.size(), 1u);
  EXPECT_EQ(c->profiles[0].models[0].ToHex(), id);
  auto again = ParseConfig(DumpConfig(*c), "dump.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->profiles[0].models, c->profiles[0].models);
  for (const std::string& bad :
       {std::string("    models: [\"abc\"]\n"), std::string("    models: [\"00000000000000000000000000000000\"]\n"),
        std::string("    models: \"") + id + "\"\n", std::string("    models: [\"") + id + "\", \"" + id + "\"]\n"}) {
    const std::string e = ErrorOf(std::string(kMinimal) + bad);
    EXPECT_NE(e.find("profiles[0].models"), std::string::npos) << bad << " -> " << e;
  }
}

TEST(ConfigTest, ProfileMistakes) {
  EXPECT_NE(ErrorOf("backend: host\n").find("profiles: is required"), std::string::npos);
  std::string both = kMinimal;
  both.insert(both.find("    host_blocks"), "    gpu_bytes: 1MiB\n");
  EXPECT_NE(ErrorOf(both).find("not both"), std::string::npos) << ErrorOf(both);
  std::string none = kMinimal;
  none.erase(none.find("    gpu_blocks: 10\n"), 19);
  EXPECT_NE(ErrorOf(none).find("profiles[0].gpu_bytes: is required"), std::string::npos) << ErrorOf(none);
  std::string tiny = kMinimal;
  tiny.replace(tiny.find("gpu_blocks: 10"), 14, "gpu_bytes: 1KiB");
  EXPECT_NE(ErrorOf(tiny).find("holds no whole block"), std::string::npos) << ErrorOf(tiny);
  const std::string twice = std::string(kMinimal) + R"(  - name: p
    layers: 1
    kv_heads: 1
    head_dim: 8
    gpu_blocks: 1
    host_blocks: 1
)";
  EXPECT_NE(ErrorOf(twice).find("'p' appears twice"), std::string::npos) << ErrorOf(twice);
  std::string bad_name = kMinimal;
  bad_name.replace(bad_name.find("name: p"), 7, "name: a/b");
  EXPECT_NE(ErrorOf(bad_name).find("may hold only"), std::string::npos);
}

TEST(ConfigTest, TenantNamesAndTheTenantLimit) {
  EXPECT_TRUE(IsValidTenantName("a"));
  EXPECT_TRUE(IsValidTenantName("Team-1.prod_x"));
  EXPECT_TRUE(IsValidTenantName(std::string(kMaxTenantName, 'z')));
  EXPECT_FALSE(IsValidTenantName(""));
  EXPECT_FALSE(IsValidTenantName(std::string(kMaxTenantName + 1, 'z')));
  for (const char* bad : {"a b", "a/b", "a\nb", "a\"b", "t{x}", "\xc3\xa9", "a=b"})
    EXPECT_FALSE(IsValidTenantName(bad)) << bad;
  auto c = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tenants, 1024u);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "limits:\n  max_tenants: 0\n").find("limits.max_tenants"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "limits:\n  max_tenants: 16385\n").find("limits.max_tenants"),
            std::string::npos);
  auto most = ParseConfig(std::string(kMinimal) + "limits:\n  max_tenants: 16384\n", "test.yaml");
  ASSERT_TRUE(most.ok()) << most.status().ToString();
  EXPECT_EQ(most->max_tenants, kMaxTenants);
}

TEST(ConfigTest, SessionsPerTenantIsDerivedWhenZero) {
  DaemonConfig c;
  c.engine_limits.max_sessions = 1000;
  EXPECT_EQ(SessionsPerTenant(c), 0u) << "free labels: no limit of its own, the fair eviction applies";
  c.tenants.resize(3);
  EXPECT_EQ(SessionsPerTenant(c), 250u) << "max_sessions over the tenants and default";
  c.max_sessions_per_tenant = 7;
  EXPECT_EQ(SessionsPerTenant(c), 7u) << "a configured limit wins";
  c.max_sessions_per_tenant = 0;
  c.engine_limits.max_sessions = 2;
  EXPECT_EQ(SessionsPerTenant(c), 1u) << "never 0 (which would mean none)";
}

// stores.record_key_file: the key is read when the stores open (kvtierd's
// start); a file it cannot trust or use refuses the start, naming the key and
// the file, and never shows a byte of what is in it.
TEST(ConfigTest, ARecordKeyFileThatIsMissingShortOrReadableByOthersRefusesTheStart) {
  const std::string dir = "/tmp/kvtier-record-key-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string good = dir + "/good", shortkey = dir + "/short", open = dir + "/open";
  std::ofstream(good) << std::string(32, 's');
  std::ofstream(shortkey) << std::string(31, 's');
  std::ofstream(open) << std::string(32, 's');
  ::chmod(good.c_str(), 0600);
  ::chmod(shortkey.c_str(), 0600);
  ::chmod(open.c_str(), 0644);
  auto open_with = [&](const std::string& key_file) {
    auto c = ParseConfig(std::string(kMinimal) + "stores:\n  record_key_file: " + key_file +
                             "\n  tiers:\n    - kind: disk\n      path: " + dir + "/store\n      max_bytes: 1MiB\n",
                         "test.yaml");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    auto chain = OpenStores(c->stores, [] {});
    return chain.ok() ? std::string() : chain.status().message();
  };
  EXPECT_EQ(open_with(good), "");
  for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/missing", "cannot be opened"}, {shortkey, "holds 31 bytes"}, {open, "has mode 0644"}, {dir, "not a regular file"}}) {
    const std::string error = open_with(file);
    EXPECT_NE(error.find("stores.record_key_file"), std::string::npos) << error;
    EXPECT_NE(error.find(file), std::string::npos) << error;
    EXPECT_NE(error.find(why), std::string::npos) << error;
    EXPECT_EQ(error.find("ssss"), std::string::npos) << "no byte of the secret: " << error;
  }
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "stores:\n  record_key_file: relative/key\n").find("absolute"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ConfigTest, StoresBelowTheHostTierParseDumpAndNameTheirMistakes) {
  const std::string stores = R"(stores:
  fetch_budget_ms: 80
  key_prefix: "team-a:"
  queue_bytes: 64MiB
  fetch_chunk_bytes: 1MiB
  tiers:
    - kind: disk
      path: /var/cache/kvtier
      max_bytes: 8GiB
    - kind: redis
      nodes: [10.0.0.1:7000, 10.0.0.2:7000]
      cluster: true
      user: kvtier
      password_file: /etc/kvtier/redis.password
      ttl_s: 3600
)";
  auto c = ParseConfig(std::string(kMinimal) + stores, "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->stores.tiers.size(), 2u);
  EXPECT_EQ(c->stores.fetch_budget_ms, 80u);
  EXPECT_EQ(c->stores.key_prefix, "team-a:");
  EXPECT_EQ(c->stores.queue_bytes, uint64_t{64} << 20);
  EXPECT_EQ(c->stores.fetch_chunk_bytes, uint64_t{1} << 20);
  EXPECT_EQ(c->stores.tiers[0].kind, "disk");
  EXPECT_FALSE(c->stores.tiers[0].write_through) << "a disk store writes back by default";
  EXPECT_EQ(std::get<DiskTierOptions>(c->stores.tiers[0].options).max_bytes, uint64_t{8} << 30);
  EXPECT_TRUE(c->stores.tiers[1].write_through) << "a remote store writes through by default";
  const auto& redis = std::get<RedisTierOptions>(c->stores.tiers[1].options);
  EXPECT_EQ(redis.nodes, (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7000"}));
  EXPECT_TRUE(redis.cluster);
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(*again, *c);
  EXPECT_TRUE(PlanReload(*c, *ParseConfig(kMinimal, "t")).applied.empty()) << "stores are not reloadable";

  auto err = [&](const std::string& tiers) { return ErrorOf(std::string(kMinimal) + "stores:\n  tiers:\n" + tiers); };
  EXPECT_NE(err("    - kind: tape\n").find("stores.tiers[0].kind: 'tape' is not one of disk, redis"),
            std::string::npos);
  EXPECT_NE(err("    - kind: disk\n      max_bytes: 1GiB\n").find("stores.tiers[0].path: is required"),
            std::string::npos);
  EXPECT_NE(err("    - kind: disk\n      path: /x\n").find("stores.tiers[0].max_bytes: is required"),
            std::string::npos);
  EXPECT_NE(err("    - kind: redis\n      nodes: [localhost]\n").find("'localhost' is not host:port"),
            std::string::npos);
  EXPECT_NE(err("    - kind: redis\n      nodes: [a:1]\n      password: hunter2\n").find("password: unknown key"),
            std::string::npos)
      << "the secret never sits in the YAML";
  EXPECT_NE(err("    - kind: disk\n      path: /x\n      max_bytes: 1GiB\n    - kind: disk\n      path: /x\n"
                "      max_bytes: 1GiB\n")
                .find("another disk store's"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "stores:\n  fetch_budget: 5\n").find("stores.fetch_budget: unknown key"),
            std::string::npos);
}

TEST(ConfigTest, EventsParseDumpAndNameTheirMistakes) {
  const std::string events = R"(events:
  enabled: true
  publish: tcp://127.0.0.1:5557
  token_ids: true
  replay_batches: 100
)";
  auto c = ParseConfig(std::string(kMinimal) + events, "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->events.enabled);
  EXPECT_TRUE(c->events.token_ids);
  EXPECT_EQ(c->events.replay_batches, 100u);
  EXPECT_EQ(EventsPublishEndpoint(c->events, "/run/kvtier/kvtierd.sock"), "tcp://127.0.0.1:5557");
  EXPECT_EQ(EventsReplayEndpoint(c->events, "/run/kvtier/kvtierd.sock"), "ipc:///run/kvtier/kvtierd.sock.replay");
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(*again, *c);
  EXPECT_FALSE(ParseConfig(kMinimal, "t")->events.enabled) << "off by default";
  EXPECT_TRUE(PlanReload(*c, *ParseConfig(kMinimal, "t")).applied.empty()) << "events are not reloadable";

  auto err = [&](const std::string& body) { return ErrorOf(std::string(kMinimal) + "events:\n" + body); };
  EXPECT_NE(err("  publish: 127.0.0.1:5557\n").find("events.publish: '127.0.0.1:5557' is not a ZMQ endpoint"),
            std::string::npos);
  EXPECT_NE(err("  publish: ipc:///a\n  replay: ipc:///a\n").find("events.replay: must differ"), std::string::npos);
  EXPECT_NE(err("  max_batch_events: 0\n").find("events.max_batch_events"), std::string::npos);
  EXPECT_NE(err("  enable: true\n").find("events.enable: unknown key"), std::string::npos);
}

TEST(ConfigTest, EventsFormatIsKvtierUnlessVllmIsAsked) {
  auto c = ParseConfig(std::string(kMinimal) + "events:\n  enabled: true\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->events.format, "kvtier");
  c = ParseConfig(std::string(kMinimal) + "events:\n  enabled: true\n  format: vllm\n  topic: \"\"\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->events.format, "vllm");
  EXPECT_EQ(c->events.topic, "") << "vLLM's default topic is allowed";
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(again->events.format, "vllm");
  EXPECT_TRUE(PlanReload(*c, *ParseConfig(std::string(kMinimal) + "events:\n  enabled: true\n", "t")).applied.empty())
      << "the format is not reloadable";
  const std::string e = ErrorOf(std::string(kMinimal) + "events:\n  format: trtllm\n");
  EXPECT_NE(e.find("events.format"), std::string::npos) << e;
}

TEST(ConfigTest, SyntaxErrorsGiveALine) {
  const std::string e = ErrorOf("profiles: [\n  - {name: p\n");
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(ConfigTest, MetricsListenIsOffByDefaultAndValidated) {
  auto c = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->metrics_listen, "");
  c = ParseConfig(std::string(kMinimal) + "metrics:\n  listen: 127.0.0.1:9464\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
  c = ParseConfig(std::string(kMinimal) + "metrics:\n  listen: \"[::1]:0\"\n", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->metrics_listen, "[::1]:0");
  EXPECT_TRUE(ParseConfig(std::string(kMinimal) + "metrics:\n  listen: \"\"\n", "test.yaml").ok());

  const std::string host = ErrorOf(std::string(kMinimal) + "metrics:\n  listen: localhost:9464\n");
  EXPECT_NE(host.find("metrics.listen: 'localhost' is not an IPv4 address"), std::string::npos) << host;
  const std::string port = ErrorOf(std::string(kMinimal) + "metrics:\n  listen: 127.0.0.1:70000\n");
  EXPECT_NE(port.find("metrics.listen: port 70000"), std::string::npos) << port;
  const std::string no_port = ErrorOf(std::string(kMinimal) + "metrics:\n  listen: 127.0.0.1\n");
  EXPECT_NE(no_port.find("metrics.listen: '127.0.0.1' is not HOST:PORT"), std::string::npos) << no_port;
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "metrics:\n  listne: x\n").find("metrics.listne: unknown key"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "metrics: 9464\n").find("metrics: expected a mapping"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "metrics:\n  listen: [1, 2]\n").find("metrics.listen: expected a string"),
            std::string::npos);

  // The dump quotes it, so a bracketed address reads back as a string.
  c = ParseConfig(std::string(kMinimal) + "metrics:\n  listen: \"[::1]:9464\"\n", "test.yaml");
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->metrics_listen, "[::1]:9464");
}

TEST(ConfigTest, ListenAddresses) {
  auto v4 = ParseListenAddress("127.0.0.1:9464");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9464);
  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  EXPECT_TRUE(ParseListenAddress("0.0.0.0:65535").ok());
  for (const char* bad : {"", ":9464", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:65536", "127.0.0.1:123456", "::1:9464",
                          "[::1]", "[127.0.0.1]:80", "host:80", "[]:80", "1.2.3:80"}) {
    EXPECT_FALSE(ParseListenAddress(bad).ok()) << bad;
  }
}

TEST(ConfigTest, ReloadTakesReloadableSettingsAndKeepsTheRest) {
  auto running = ParseConfig(kMinimal, "a.yaml");
  ASSERT_TRUE(running.ok());
  auto same = PlanReload(*running, *running);
  EXPECT_TRUE(same.applied.empty());
  EXPECT_TRUE(same.kept.empty());
  EXPECT_EQ(DumpConfig(same.next), DumpConfig(*running));

  std::string changed = kMinimal;
  changed.replace(changed.find("gpu_blocks: 10"), 14, "gpu_blocks: 12");
  changed += R"(log_level: debug
socket: /tmp/elsewhere.sock
tiering:
  gpu_high_watermark: 0.8
  gpu_low_watermark: 0.5
  host_high_watermark: 0.9
  host_low_watermark: 0.7
  max_copy_batch: 8
  tick_ms: 50
limits:
  max_clients: 7
  max_leases_per_client: 9
  max_sessions: 100
  max_tenants: 5
metrics:
  listen: 127.0.0.1:0
)";
  auto loaded = ParseConfig(changed, "b.yaml");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ReloadPlan plan = PlanReload(*running, *loaded);
  const DaemonConfig& n = plan.next;
  EXPECT_EQ(n.log_level, "debug");
  EXPECT_EQ(n.engine.gpu_high_watermark, 0.8);
  EXPECT_EQ(n.engine.gpu_low_watermark, 0.5);
  EXPECT_EQ(n.engine.host_high_watermark, 0.9);
  EXPECT_EQ(n.engine.host_low_watermark, 0.7);
  EXPECT_EQ(n.engine.max_copy_batch, 8u);
  EXPECT_EQ(n.tick_ms, 50u);
  EXPECT_EQ(n.max_clients, 7u);
  EXPECT_EQ(n.max_leases_per_client, 9u);
  EXPECT_EQ(n.max_tenants, 5u);
  // What cannot change keeps its running value.
  EXPECT_EQ(n.socket_path, running->socket_path);
  EXPECT_EQ(n.profiles[0].gpu_blocks, 10u);
  EXPECT_EQ(n.engine_limits.max_sessions, running->engine_limits.max_sessions);
  EXPECT_EQ(n.metrics_listen, "");

  auto has = [](const std::vector<std::string>& v, const std::string& text) {
    return std::find(v.begin(), v.end(), text) != v.end();
  };
  EXPECT_EQ(plan.applied.size(), 10u) << ::testing::PrintToString(plan.applied);
  EXPECT_TRUE(has(plan.applied, "limits.max_tenants: 1024 -> 5"));
  EXPECT_TRUE(has(plan.applied, "log_level: info -> debug"));
  EXPECT_TRUE(has(plan.applied, "tiering.gpu_high_watermark: 0.9 -> 0.8"));
  EXPECT_TRUE(has(plan.applied, "tiering.tick_ms: 20 -> 50"));
  EXPECT_TRUE(has(plan.applied, "limits.max_clients: 256 -> 7"));
  ASSERT_EQ(plan.kept.size(), 4u) << ::testing::PrintToString(plan.kept);
  EXPECT_TRUE(has(plan.kept, "socket: /run/kvtier/kvtierd.sock -> /tmp/elsewhere.sock"));
  EXPECT_TRUE(has(plan.kept, "profiles[0].gpu_blocks: 10 -> 12"));
  EXPECT_TRUE(has(plan.kept, "limits.max_sessions: 65536 -> 100"));
  EXPECT_TRUE(has(plan.kept, "metrics.listen: \"\" -> \"127.0.0.1:0\""));

  // A second profile is a change of shape: every key of it is named.
  const std::string two = std::string(kMinimal) + R"(  - name: q
    layers: 1
    kv_heads: 1
    head_dim: 8
    gpu_blocks: 1
    host_blocks: 1
)";
  auto more = ParseConfig(two, "c.yaml");
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  const ReloadPlan grow = PlanReload(*running, *more);
  EXPECT_TRUE(grow.applied.empty());
  EXPECT_TRUE(has(grow.kept, "profiles[1].name: (none) -> q"));
  EXPECT_EQ(grow.next.profiles.size(), 1u);
}

TEST(ConfigTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("2 GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536u);
  EXPECT_EQ(*ParseByteSize("1GB"), 1000000000u);
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
}

// ---- access: and tenants: ----

constexpr const char* kAccess = R"(access:
  allow_users: [root, "1001"]
  allow_groups: ["2000"]
  admin_users: ["0"]
  admin_groups: [root]
  allow_root: false
  group: "4242"
  mode: 0600
tenants:
  - name: acme
    users: ["1001"]
    groups: ["3000"]
    allow_requested: true
    gpu_blocks: 8
    host_blocks: 32
  - name: beta
    users: ["1002"]
)";

TEST(ConfigTest, AccessAndTenantsParseAndResolveIds) {
  auto c = ParseConfig(std::string(kMinimal) + kAccess, "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const AccessConfig& a = c->access;
  EXPECT_EQ(a.allow_users, (std::vector<std::string>{"root", "1001"}));
  EXPECT_EQ(a.allow_uids, (std::vector<uint32_t>{0, 1001}));
  EXPECT_EQ(a.allow_gids, (std::vector<uint32_t>{2000}));
  EXPECT_EQ(a.admin_gids, (std::vector<uint32_t>{0}));
  EXPECT_FALSE(a.allow_root);
  EXPECT_EQ(a.group_gid, 4242u);
  EXPECT_EQ(a.mode, 0600u);
  ASSERT_EQ(c->tenants.size(), 2u);
  EXPECT_EQ(c->tenants[0].name, "acme");
  EXPECT_EQ(c->tenants[0].uids, (std::vector<uint32_t>{1001}));
  EXPECT_EQ(c->tenants[0].gids, (std::vector<uint32_t>{3000}));
  EXPECT_TRUE(c->tenants[0].allow_requested);
  EXPECT_EQ(c->tenants[0].gpu_blocks, 8u);
  EXPECT_EQ(c->tenants[0].host_blocks, 32u);
  EXPECT_FALSE(c->tenants[1].allow_requested);
  EXPECT_EQ(c->tenants[1].gpu_blocks, 0u);  // Unlimited.
}

TEST(ConfigTest, AccessDefaultsKeepASingleUserBoxWorking) {
  auto c = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->access.allow_root);
  EXPECT_EQ(c->access.mode, 0660u);
  EXPECT_EQ(c->access.group_gid, AccessConfig::kNoGroup);
  EXPECT_TRUE(c->access.allow_users.empty());
  EXPECT_TRUE(c->tenants.empty());
}

TEST(ConfigTest, AccessAndTenantsRoundTripThroughTheDump) {
  auto c = ParseConfig(std::string(kMinimal) + kAccess, "test.yaml");
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << DumpConfig(*c);
  EXPECT_EQ(again->access, c->access);
  EXPECT_EQ(again->tenants, c->tenants);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*c));
  // And the defaults, with no tenants.
  auto plain = ParseConfig(kMinimal, "test.yaml");
  auto plain_again = ParseConfig(DumpConfig(*plain), "dump");
  ASSERT_TRUE(plain_again.ok()) << plain_again.status().ToString();
  EXPECT_EQ(plain_again->access, plain->access);
  EXPECT_TRUE(plain_again->tenants.empty());
}

TEST(ConfigTest, AccessMistakesNameTheKey) {
  const std::string m = kMinimal;
  auto has = [](const std::string& error, const std::string& want) {
    return error.find(want) != std::string::npos;
  };
  std::string e = ErrorOf(m + "access:\n  allow_users: [no-such-user-kvtier]\n");
  EXPECT_TRUE(has(e, "access.allow_users: unknown user 'no-such-user-kvtier'")) << e;
  e = ErrorOf(m + "access:\n  admin_groups: [no-such-group-kvtier]\n");
  EXPECT_TRUE(has(e, "access.admin_groups: unknown group 'no-such-group-kvtier'")) << e;
  e = ErrorOf(m + "access:\n  group: no-such-group-kvtier\n");
  EXPECT_TRUE(has(e, "access.group: unknown group")) << e;
  e = ErrorOf(m + "access:\n  mode: 0666\n");
  EXPECT_TRUE(has(e, "access.mode: '0666' is not 0660 or 0600")) << e;
  e = ErrorOf(m + "access:\n  mode: 0644\n");
  EXPECT_TRUE(has(e, "access.mode")) << e;
  e = ErrorOf(m + "access:\n  allow_root: maybe\n");
  EXPECT_TRUE(has(e, "access.allow_root: expected true or false")) << e;
  e = ErrorOf(m + "access:\n  allow_userz: [root]\n");
  EXPECT_TRUE(has(e, "access.allow_userz: unknown key")) << e;
  e = ErrorOf(m + "access:\n  allow_users: [\"99999999999\"]\n");
  EXPECT_TRUE(has(e, "out of range")) << e;
}

TEST(ConfigTest, TenantMistakesNameTheTenant) {
  const std::string m = kMinimal;
  auto has = [](const std::string& error, const std::string& want) {
    return error.find(want) != std::string::npos;
  };
  std::string e = ErrorOf(m + "tenants:\n  - name: a\n  - name: a\n");
  EXPECT_TRUE(has(e, "tenants[1].name: tenant 'a' appears twice")) << e;
  e = ErrorOf(m + "tenants:\n  - name: a\n    users: [\"1001\"]\n  - name: b\n    users: [\"1001\"]\n");
  EXPECT_TRUE(has(e, "tenants[1].users: user '1001' is already in tenant 'a'")) << e;
  e = ErrorOf(m + "tenants:\n  - users: [\"1001\"]\n");
  EXPECT_TRUE(has(e, "tenants[0].name: is required")) << e;
  e = ErrorOf(m + "tenants:\n  - name: a/b\n");
  EXPECT_TRUE(has(e, "tenants[0].name: 'a/b' may hold only")) << e;
  e = ErrorOf(m + "tenants:\n  - name: a\n    users: [no-such-user-kvtier]\n");
  EXPECT_TRUE(has(e, "tenants[0].users: unknown user")) << e;
  e = ErrorOf(m + "tenants:\n  - name: a\n    gpu_blocks: -1\n");
  EXPECT_TRUE(has(e, "tenants[0].gpu_blocks: must be in")) << e;
  e = ErrorOf(m + "tenants:\n  - name: a\n    quota: 3\n");
  EXPECT_TRUE(has(e, "tenants[0].quota: unknown key")) << e;
  e = ErrorOf(m + "tenants:\n  name: a\n");
  EXPECT_TRUE(has(e, "tenants: expected a list")) << e;
  e = ErrorOf(m + "access:\n  allow_users: [root, root]\n");
  EXPECT_TRUE(has(e, "'root' appears twice")) << e;
}

TEST(ConfigTest, AnIsolatedTenantIsSizedByItsQuotasCarvedOutOfEveryProfile) {
  const std::string two = std::string(kMinimal) +
                          "  - name: q\n    layers: 1\n    kv_heads: 1\n    head_dim: 8\n"
                          "    gpu_blocks: 6\n    host_blocks: 30\n";
  auto c = ParseConfig(two +
                           "tenants:\n  - name: a\n    isolated: true\n    gpu_blocks: 4\n    host_blocks: 10\n"
                           "  - name: b\n",
                       "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->tenants[0].isolated);
  EXPECT_FALSE(c->tenants[1].isolated);
  auto again = ParseConfig(DumpConfig(*c), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->tenants, c->tenants);
  EXPECT_NE(DumpConfig(*c).find("    isolated: true\n"), std::string::npos);

  auto has = [](const std::string& error, const std::string& want) { return error.find(want) != std::string::npos; };
  std::string e = ErrorOf(std::string(kMinimal) + "tenants:\n  - name: a\n    isolated: true\n    gpu_blocks: 4\n");
  EXPECT_TRUE(has(e, "tenants[0].isolated: an isolated tenant's pools are sized by its gpu_blocks and host_blocks"))
      << e;
  e = ErrorOf(std::string(kMinimal) + "tenants:\n  - name: a\n    isolated: yes please\n");
  EXPECT_TRUE(has(e, "tenants[0].isolated: expected true or false")) << e;
  // Profile p has 10 GPU blocks: 6 + 4 isolated leave none to share.
  e = ErrorOf(std::string(kMinimal) +
              "tenants:\n  - name: a\n    isolated: true\n    gpu_blocks: 6\n    host_blocks: 1\n"
              "  - name: b\n    isolated: true\n    gpu_blocks: 4\n    host_blocks: 1\n");
  EXPECT_TRUE(has(e, "profiles[0].gpu_blocks: 10 must exceed the isolated tenants' gpu_blocks (10 in all)")) << e;
  // Each profile is carved: the second one's 6 GPU blocks are too few for 4 + 2.
  e = ErrorOf(two +
              "tenants:\n  - name: a\n    isolated: true\n    gpu_blocks: 4\n    host_blocks: 1\n"
              "  - name: b\n    isolated: true\n    gpu_blocks: 2\n    host_blocks: 1\n");
  EXPECT_TRUE(has(e, "profiles[1].gpu_blocks: 6 must exceed")) << e;
  e = ErrorOf(std::string(kMinimal) +
              "tenants:\n  - name: a\n    isolated: true\n    gpu_blocks: 1\n    host_blocks: 20\n");
  EXPECT_TRUE(has(e, "profiles[0].host_blocks: 20 must exceed")) << e;
}

TEST(ConfigTest, AccessAndTenantsWaitForARestart) {
  auto running = ParseConfig(kMinimal, "c.yaml");
  auto loaded = ParseConfig(std::string(kMinimal) + kAccess, "c.yaml");
  ASSERT_TRUE(running.ok() && loaded.ok());
  const ReloadPlan plan = PlanReload(*running, *loaded);
  EXPECT_EQ(plan.next.access, running->access);
  EXPECT_TRUE(plan.next.tenants.empty());
  auto kept = [&](const std::string& key) {
    return std::any_of(plan.kept.begin(), plan.kept.end(), [&](const std::string& k) { return k.rfind(key, 0) == 0; });
  };
  EXPECT_TRUE(kept("access.mode"));
  EXPECT_TRUE(kept("tenants[0].name"));
}

TEST(ConfigTest, WarmRestartIsOffByDefaultRoundTripsAndIsNotReloadable) {
  auto off = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->warm_restart);
  EXPECT_EQ(off->warm_snapshot_ms, 2000u);
  auto on = ParseConfig(std::string(kMinimal) + "warm_restart: true\ntiering:\n  warm_snapshot_ms: 0\n", "test.yaml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->warm_restart);
  EXPECT_EQ(on->warm_snapshot_ms, 0u);
  auto again = ParseConfig(DumpConfig(*on), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->warm_restart);
  EXPECT_EQ(again->warm_snapshot_ms, 0u);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*on));
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "warm_restart: yes please\n").find("warm_restart: expected true or false"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "tiering:\n  warm_snapshot_ms: -1\n").find("tiering.warm_snapshot_ms"),
            std::string::npos);
  const ReloadPlan plan = PlanReload(*off, *on);
  EXPECT_FALSE(plan.next.warm_restart);
  EXPECT_EQ(plan.next.warm_snapshot_ms, 0u);
  ASSERT_EQ(plan.kept.size(), 1u);
  EXPECT_EQ(plan.kept[0], "warm_restart: false -> true");
}

TEST(ConfigTest, BusyPollDefaultsTo50MicrosecondsRoundTripsAndReloads) {
  auto def = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->busy_poll_us, 50u);
  auto off = ParseConfig(std::string(kMinimal) + "busy_poll_us: 0\n", "test.yaml");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->busy_poll_us, 0u);
  auto again = ParseConfig(DumpConfig(*off), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->busy_poll_us, 0u);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "busy_poll_us: 10001\n").find("busy_poll_us"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "busy_poll_us: -5\n").find("busy_poll_us"), std::string::npos);
  const ReloadPlan plan = PlanReload(*def, *off);
  EXPECT_EQ(plan.next.busy_poll_us, 0u) << "the loop takes the new value at once";
  EXPECT_TRUE(plan.kept.empty());
  ASSERT_EQ(plan.applied.size(), 1u);
  EXPECT_EQ(plan.applied[0], "busy_poll_us: 50 -> 0");
}

TEST(ConfigTest, ConnectionLimitsHaveDefaultsRangesAndReload) {
  auto def = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->frame_timeout_ms, 10000u);
  EXPECT_EQ(def->max_reply_backlog_bytes, 4u << 20);
  auto set = ParseConfig(std::string(kMinimal) + "limits:\n  frame_timeout_ms: 250\n  max_reply_backlog_bytes: 1MiB\n",
                         "test.yaml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->frame_timeout_ms, 250u);
  EXPECT_EQ(set->max_reply_backlog_bytes, 1u << 20);
  auto again = ParseConfig(DumpConfig(*set), "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(*again == *set) << DumpConfig(*set);

  const std::string fast = ErrorOf(std::string(kMinimal) + "limits:\n  frame_timeout_ms: 5\n");
  EXPECT_NE(fast.find("limits.frame_timeout_ms: must be in [10, 600000]"), std::string::npos) << fast;
  for (const char* bytes : {"1KiB", "2GiB", "lots"}) {
    const std::string e = ErrorOf(std::string(kMinimal) + "limits:\n  max_reply_backlog_bytes: " + bytes + "\n");
    EXPECT_NE(e.find("limits.max_reply_backlog_bytes"), std::string::npos) << bytes << ": " << e;
  }

  const ReloadPlan plan = PlanReload(*def, *set);
  EXPECT_EQ(plan.next.frame_timeout_ms, 250u);
  EXPECT_EQ(plan.next.max_reply_backlog_bytes, 1u << 20);
  EXPECT_TRUE(plan.kept.empty()) << ::testing::PrintToString(plan.kept);
  ASSERT_EQ(plan.applied.size(), 2u) << ::testing::PrintToString(plan.applied);
  EXPECT_EQ(plan.applied[0], "limits.frame_timeout_ms: 10000 -> 250");
  EXPECT_EQ(plan.applied[1], "limits.max_reply_backlog_bytes: 4194304 -> 1048576");
}

// A configuration file is read up to kMaxConfigFileBytes and no further: a
// larger one (at SIGHUP, the event loop would parse it) is an error naming its
// size and the limit.
TEST(ConfigTest, AConfigFileOverOneMiBIsRefusedUnparsed) {
  const std::string path = ::testing::TempDir() + "kvtier-config-size-test.yaml";
  auto write = [&](size_t total) {
    std::ofstream out(path, std::ios::trunc);
    std::string body = std::string(kMinimal) + "#";
    body.resize(total - 1, 'x');
    out << body << "\n";
  };
  write(kMaxConfigFileBytes);
  auto at_limit = LoadConfigFile(path);
  EXPECT_TRUE(at_limit.ok()) << at_limit.status().ToString();
  write(kMaxConfigFileBytes + 1);
  auto over = LoadConfigFile(path);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("is 1048577 bytes, larger than the limit of 1048576 bytes"), std::string::npos)
      << over.status().message();
  std::remove(path.c_str());
  auto endless = LoadConfigFile("/dev/zero");  // No size to report; still no more than the limit read.
  ASSERT_FALSE(endless.ok());
  EXPECT_NE(endless.status().message().find("larger than the limit of 1048576 bytes"), std::string::npos)
      << endless.status().message();
}

TEST(ConfigTest, LeaseTimeoutDefaultsTo30SecondsIsCheckedRoundTripsAndReloads) {
  auto def = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->engine.lease_timeout, std::chrono::milliseconds(30000));
  for (const char* ok : {"0", "100", "86400000"}) {
    auto c = ParseConfig(std::string(kMinimal) + "limits:\n  lease_timeout_ms: " + ok + "\n", "test.yaml");
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status().ToString();
    EXPECT_EQ(c->engine.lease_timeout, std::chrono::milliseconds(std::stoul(ok)));
    auto again = ParseConfig(DumpConfig(*c), "dump");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->engine.lease_timeout, c->engine.lease_timeout);
  }
  for (const char* bad : {"1", "99", "86400001", "-1", "soon"}) {
    const std::string e = ErrorOf(std::string(kMinimal) + "limits:\n  lease_timeout_ms: " + bad + "\n");
    EXPECT_NE(e.find("limits.lease_timeout_ms"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "limits:\n  lease_timeout_ms: 5\n").find("0 (never) or at least 100"),
            std::string::npos);
  auto off = ParseConfig(std::string(kMinimal) + "limits:\n  lease_timeout_ms: 0\n", "test.yaml");
  ASSERT_TRUE(off.ok());
  const ReloadPlan plan = PlanReload(*def, *off);
  EXPECT_EQ(plan.next.engine.lease_timeout.count(), 0) << "the engines take the new timeout at once";
  EXPECT_TRUE(plan.kept.empty());
  ASSERT_EQ(plan.applied.size(), 1u);
  EXPECT_EQ(plan.applied[0], "limits.lease_timeout_ms: 30000 -> 0");
}

// The fair share's window: 1 s by default, 0 turns the share off; the
// engines take it at once on a reload (Engine::Retune).
TEST(ConfigTest, GpuShareWindowDefaultsToOneSecondReachesTheEnginesAndReloads) {
  auto def = ParseConfig(kMinimal, "test.yaml");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->engine.gpu_share_window, std::chrono::milliseconds(1000));
  EXPECT_EQ(EngineOptionsFor(*def, 0, "").gpu_share_window, std::chrono::milliseconds(1000));
  for (const char* ok : {"0", "250", "3600000"}) {
    auto c = ParseConfig(std::string(kMinimal) + "limits:\n  gpu_share_window_ms: " + ok + "\n", "test.yaml");
    ASSERT_TRUE(c.ok()) << ok << ": " << c.status().ToString();
    EXPECT_EQ(c->engine.gpu_share_window, std::chrono::milliseconds(std::stoul(ok)));
    EXPECT_EQ(EngineOptionsFor(*c, 0, "").gpu_share_window.count(), std::stol(ok));
    auto again = ParseConfig(DumpConfig(*c), "dump");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->engine.gpu_share_window, c->engine.gpu_share_window);
  }
  for (const char* bad : {"3600001", "-1", "soon"}) {
    const std::string e = ErrorOf(std::string(kMinimal) + "limits:\n  gpu_share_window_ms: " + bad + "\n");
    EXPECT_NE(e.find("limits.gpu_share_window_ms"), std::string::npos) << bad << ": " << e;
  }
  auto off = ParseConfig(std::string(kMinimal) + "limits:\n  gpu_share_window_ms: 0\n", "test.yaml");
  ASSERT_TRUE(off.ok());
  const ReloadPlan plan = PlanReload(*def, *off);
  EXPECT_EQ(plan.next.engine.gpu_share_window.count(), 0);
  EXPECT_TRUE(plan.kept.empty());
  ASSERT_EQ(plan.applied.size(), 1u);
  EXPECT_EQ(plan.applied[0], "limits.gpu_share_window_ms: 1000 -> 0");
}

// Found by kvtier-fuzz-config (tests/fuzz/corpus/config/found_*): malformed
// numbers used to escape ParseByteSize as std::invalid_argument / out_of_range.
TEST(ConfigTest, MalformedByteSizesAreErrorsNotExceptions) {
  for (const char* text : {".", "..", ".nan", "1.2.3", "1..5KiB", " . MiB"}) {
    auto v = ParseByteSize(text);
    ASSERT_FALSE(v.ok()) << text;
    EXPECT_NE(v.status().message().find("is not a size"), std::string::npos) << v.status().message();
  }
  const std::string huge(400, '9');
  auto v = ParseByteSize(huge + "KiB");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("out of range"), std::string::npos) << v.status().message();
  EXPECT_FALSE(ParseByteSize("1000TiB").ok());  // Over the 1e15-byte cap.
  EXPECT_EQ(*ParseByteSize("1."), 1u);
  EXPECT_EQ(*ParseByteSize(".5KiB"), 512u);
  std::string p = kMinimal;
  p.replace(p.find("gpu_blocks: 10"), 14, "gpu_bytes: " + huge);
  EXPECT_NE(ErrorOf(p).find("profiles[0].gpu_bytes: size '"), std::string::npos) << ErrorOf(p);
}

// A tier size in bytes may not stand for more slots than gpu_blocks/host_blocks
// allow (2^28); it used to wrap around in the uint32_t slot count.
TEST(ConfigTest, ByteSizesBeyondTheSlotLimitAreErrors) {
  const std::string tiny = R"(profiles:
  - name: p
    layers: 1
    kv_heads: 1
    head_dim: 1
    block_tokens: 1
    host_blocks: 1
)";
  auto ok = ParseConfig(tiny + "    gpu_bytes: 1GiB\n", "t.yaml");  // 4-byte blocks: exactly 2^28.
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->profiles[0].gpu_blocks, 1u << 28);
  const std::string err = ErrorOf(tiny + "    gpu_bytes: 16TiB\n");
  EXPECT_NE(err.find("profiles[0].gpu_bytes: holds 4398046511104 blocks"), std::string::npos) << err;
}

// Found in the fuzz corpus (found_instance_bad_utf8_nul): a quoted instance
// name with a NUL was accepted, and the shared-memory names made from it would
// end at the NUL. Control characters in the instance or socket, and a NUL in
// the metrics address, are errors.
TEST(ConfigTest, NamesWithControlCharactersAreErrors) {
  EXPECT_NE(ErrorOf(std::string("instance: \"a\\0b\"\n") + kMinimal).find("instance: must be 1-64 characters"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string("instance: \"a\\tb\"\n") + kMinimal).find("instance: must be"), std::string::npos);
  EXPECT_NE(ErrorOf(std::string("socket: \"/tmp/a\\nb\"\n") + kMinimal).find("socket: must not hold control"),
            std::string::npos);
  const std::string listen = ErrorOf(std::string(kMinimal) + "metrics:\n  listen: \"127.0.0.1\\0junk:80\"\n");
  EXPECT_NE(listen.find("metrics.listen: "), std::string::npos) << listen;
  EXPECT_FALSE(ParseListenAddress(std::string_view("127.0.0.1\0:80", 13)).ok());
  EXPECT_EQ(ErrorOf(std::string("instance: \"caf\\u00e9 #2\"\n") + kMinimal), "");
}

// What --check-config and `cachectl config` print parses back to the same config,
// for strings YAML would otherwise read as something else, and for doubles that
// need more than six significant digits.
TEST(ConfigTest, TheDumpQuotesStringsAndKeepsEveryDigit) {
  const std::string yaml = std::string(R"(instance: "a: b # c"
socket: "/tmp/x\"y\\z \u00e9"
)") + kMinimal + R"(tiering:
  gpu_high_watermark: 0.123456789
  gpu_low_watermark: 0.1
metrics:
  listen: "[::1]:0"
)";
  std::string named = yaml;
  named.replace(named.find("name: p"), 7, "name: \"null\"");
  auto c = ParseConfig(named, "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->instance, "a: b # c");
  EXPECT_EQ(c->socket_path, "/tmp/x\"y\\z \xc3\xa9");
  EXPECT_EQ(c->profiles[0].profile.name, "null");
  const std::string dump = DumpConfig(*c);
  auto again = ParseConfig(dump, "dump");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << dump;
  EXPECT_TRUE(*again == *c) << dump;
  EXPECT_EQ(again->engine.gpu_high_watermark, 0.123456789);
  EXPECT_NE(dump.find("instance: \"a: b # c\"\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("  - name: \"null\"\n"), std::string::npos) << dump;
  // Plain names and paths stay unquoted.
  auto plain = ParseConfig(kMinimal, "t.yaml");
  ASSERT_TRUE(plain.ok());
  const std::string plain_dump = DumpConfig(*plain);
  EXPECT_NE(plain_dump.find("instance: kvtier\n"), std::string::npos) << plain_dump;
  EXPECT_NE(plain_dump.find("socket: /run/kvtier/kvtierd.sock\n"), std::string::npos) << plain_dump;
  EXPECT_NE(plain_dump.find("gpu_high_watermark: 0.9\n"), std::string::npos) << plain_dump;
}

// One table drives every scalar key: `kvtierd --config-keys` lists each with
// its default, range and whether a reload applies it.
TEST(ConfigTest, EveryKeyIsListedWithItsDefaultItsRangeAndWhetherAReloadAppliesIt) {
  const std::string d = DescribeConfigKeys();
  EXPECT_NE(d.find("limits.lease_timeout_ms  (default 30000; in [0, 86400000]; reloadable)"), std::string::npos) << d;
  EXPECT_NE(d.find("limits.max_frame_bytes  (default 16777216; a size in [4KiB, 16MiB]; at start)"), std::string::npos);
  EXPECT_NE(d.find("backend  (default auto; one of auto host cuda; at start)"), std::string::npos);
  EXPECT_NE(d.find("metrics.listen  (default \"\"; at start)"), std::string::npos);
  for (const ConfigKey& k : ConfigKeys()) {
    EXPECT_NE(d.find(k.Path() + "  (default "), std::string::npos) << k.Path();
    EXPECT_STRNE(k.doc, "") << k.Path();
  }
}

// Each row's reloadable mark is what PlanReload does: a changed reloadable key
// is applied (the next config has the loaded value), any other is kept.
TEST(ConfigTest, AReloadAppliesExactlyTheKeysMarkedReloadable) {
  const DaemonConfig running = *ParseConfig(kMinimal, "t");
  size_t reloadable = 0;
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.choices.size() == 1) continue;  // tiering.policy: lru is the one value it takes.
    DaemonConfig loaded = running;
    std::visit(
        [&](auto member) {
          auto& v = member(loaded);
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) {
            v = !v;
          } else if constexpr (std::is_same_v<T, std::string>) {
            v = k.choices.size() > 1 && v == k.choices[0] ? k.choices[1] : k.choices.empty() ? v + "x" : k.choices[0];
          } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
            const auto lo = static_cast<int64_t>(k.lo), hi = static_cast<int64_t>(k.hi);
            v = std::chrono::milliseconds(v.count() == hi ? lo : hi);
          } else {
            v = v == static_cast<T>(k.hi) ? static_cast<T>(k.lo) : static_cast<T>(k.hi);
          }
        },
        k.field);
    ASSERT_NE(k.ValueText(loaded), k.ValueText(running)) << k.Path() << " did not change";
    const ReloadPlan plan = PlanReload(running, loaded);
    const std::vector<std::string>& changed = k.reloadable ? plan.applied : plan.kept;
    ASSERT_EQ(changed.size(), 1u) << k.Path() << ": " << ::testing::PrintToString(plan.applied)
                                  << ::testing::PrintToString(plan.kept);
    EXPECT_EQ(changed[0].rfind(k.Path() + ": ", 0), 0u) << changed[0];
    EXPECT_EQ(k.ValueText(plan.next), k.ValueText(k.reloadable ? loaded : running)) << k.Path();
    EXPECT_EQ(plan.applied.size() + plan.kept.size(), 1u) << k.Path();
    reloadable += k.reloadable;
  }
  EXPECT_EQ(reloadable, 19u) << "log_level, busy_poll_us, tiering.* but policy (7) and limits' 10 reloadable keys";
}

}  // namespace
}  // namespace kvtier::daemon
