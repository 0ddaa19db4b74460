// kind: redis (store_kind_redis.h).
#include "config/store_kind_redis.h"

#include <fstream>
#include <sstream>

#include "config/config_section.h"
#include "config/store_kinds.h"

#ifndef KVTIER_CONFIG_PARSER_ONLY
#include "redis/redis_store.h"
#endif

namespace kvtier::daemon {
namespace {

Status Parse(Section& s, StoreOptions* out) {
  RedisTierOptions& o = out->emplace<RedisTierOptions>();
  KVTIER_RETURN_IF_ERROR(
      s.Known({"nodes", "cluster", "user", "password_file", "ttl_s", "connect_timeout_ms", "timeout_ms"}));
  YAML::Node nodes = s.Get("nodes");
  if (!nodes || !nodes.IsSequence() || nodes.size() == 0) {
    return s.Error("nodes", "is required: a list of host:port (the server, or a cluster's seed nodes)");
  }
  for (const auto& n : nodes) {
    const std::string hp = n.IsScalar() ? n.Scalar() : std::string();
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size() ||
        hp.find_first_not_of("0123456789", colon + 1) != std::string::npos || hp.size() - colon - 1 > 5 ||
        std::stoul(hp.substr(colon + 1)) > 65535) {
      return s.Error("nodes", "'" + hp.substr(0, 80) + "' is not host:port");
    }
    o.nodes.push_back(hp);
  }
  KVTIER_RETURN_IF_ERROR(s.ReadBool("cluster", &o.cluster));
  KVTIER_RETURN_IF_ERROR(s.ReadString("user", &o.user));
  KVTIER_RETURN_IF_ERROR(s.ReadString("password_file", &o.password_file));
  if (!o.password_file.empty() && o.password_file[0] != '/') {
    return s.Error("password_file", "must be an absolute path");
  }
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("ttl_s", &o.ttl_s, 0, 365u * 86400));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("connect_timeout_ms", &o.connect_timeout_ms, 1, 60000));
  return s.Read<uint32_t>("timeout_ms", &o.timeout_ms, 1, 60000);
}

std::vector<std::pair<std::string, std::string>> Settings(const StoreOptions& options) {
  const auto& o = std::get<RedisTierOptions>(options);
  return {{"nodes", YamlList(o.nodes)},
          {"cluster", o.cluster ? "true" : "false"},
          {"user", YamlString(o.user)},
          {"password_file", YamlString(o.password_file)},
          {"ttl_s", std::to_string(o.ttl_s)},
          {"connect_timeout_ms", std::to_string(o.connect_timeout_ms)},
          {"timeout_ms", std::to_string(o.timeout_ms)}};
}

#ifndef KVTIER_CONFIG_PARSER_ONLY
Result<std::string> ReadSecret(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(key + ": cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r'))
    s.pop_back();  // One trailing newline is not the password's.
  if (s.empty()) return InvalidArgument(key + ": '" + path + "' is empty");
  return s;
}

Result<std::unique_ptr<stores::BlockStore>> Open(const StoreOptions& options, const std::string& key) {
  const auto& t = std::get<RedisTierOptions>(options);
  stores::RedisStoreOptions o;
  o.nodes = t.nodes;
  o.cluster = t.cluster;
  o.user = t.user;
  if (!t.password_file.empty()) {
    auto secret = ReadSecret(t.password_file, key + ".password_file");
    if (!secret.ok()) return secret.status();
    o.password = std::move(secret).value();
  }
  o.connect_timeout = std::chrono::milliseconds(t.connect_timeout_ms);
  o.io_timeout = std::chrono::milliseconds(t.timeout_ms);
  o.ttl_seconds = t.ttl_s;
  return stores::OpenRedisStore(o);
}
#else
constexpr std::nullptr_t Open = nullptr;
#endif

}  // namespace

const StoreKind kRedisStoreKind{"redis", /*writes_through=*/true, nullptr, &Parse, &Settings, Open};

}  // namespace kvtier::daemon
