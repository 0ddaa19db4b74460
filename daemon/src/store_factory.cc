// Opening the stores below the host tier (store_factory.h).
#include "store_factory.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "disk/disk_store.h"
#include "redis/redis_store.h"

namespace kvtier::daemon {
namespace {

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

}  // namespace

Result<std::unique_ptr<stores::StoreChain>> OpenStores(const StoresConfig& config, std::function<void()> notify) {
  if (config.tiers.empty()) return std::unique_ptr<stores::StoreChain>();
  std::vector<stores::ChainedStore> chain;
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    const StoreTierConfig& t = config.tiers[i];
    const std::string key = "stores.tiers[" + std::to_string(i) + "]";
    Result<std::unique_ptr<stores::BlockStore>> store = Status(StatusCode::kInternal, "unknown store kind");
    if (t.kind == "disk") {
      stores::DiskStoreOptions o;
      o.dir = t.path;
      o.max_bytes = t.max_bytes;
      o.direct_io = t.direct_io;
      store = stores::OpenDiskStore(o);
    } else {
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
      store = stores::OpenRedisStore(o);
    }
    if (!store.ok()) return Status(store.status().code(), key + " (" + t.kind + "): " + store.status().message());
    chain.push_back(stores::ChainedStore{std::move(store).value(), t.write_through});
  }
  stores::StoreChainOptions o;
  o.key_prefix = config.key_prefix;
  o.max_queued_bytes = config.queue_bytes;
  return std::make_unique<stores::StoreChain>(std::move(chain), o, std::move(notify));
}

std::vector<std::string> StoreNames(const std::vector<stores::StoreStats>& stats) {
  std::map<std::string, int> of_kind;
  for (const auto& s : stats) ++of_kind[s.kind];
  std::map<std::string, int> seen;
  std::vector<std::string> out;
  for (const auto& s : stats) {
    const int n = seen[s.kind]++;
    out.push_back(of_kind[s.kind] > 1 ? s.kind + std::to_string(n) : s.kind);
  }
  return out;
}

}  // namespace kvtier::daemon
