// Opening the stores below the host tier (store_factory.h).
#include "stores/store_factory.h"

#include <algorithm>
#include <map>

#include "kvtier/stores/block_store.h"
#include "stores/record_key_file.h"

namespace kvtier::daemon {

Result<std::unique_ptr<stores::StoreChain>> OpenStores(const StoresConfig& config, std::function<void()> notify,
                                                       size_t max_events) {
  std::shared_ptr<const stores::RecordKey> record_key;
  if (!config.record_key_file.empty()) {
    // Read even without stores, so that a bad key file is found when it is configured, not when a store is.
    auto k = ReadRecordKeyFile(config.record_key_file, "stores.record_key_file");
    if (!k.ok()) return k.status();
    record_key = std::make_shared<const stores::RecordKey>(std::move(k).value());
  }
  if (config.tiers.empty()) return std::unique_ptr<stores::StoreChain>();
  std::vector<stores::ChainedStore> chain;
  for (size_t i = 0; i < config.tiers.size(); ++i) {
    const StoreTierConfig& t = config.tiers[i];
    const std::string key = "stores.tiers[" + std::to_string(i) + "]";
    const StoreKind* kind = FindStoreKind(t.kind);
    if (kind == nullptr || kind->open == nullptr) return Status(StatusCode::kInternal, key + ": unknown store kind");
    Result<std::unique_ptr<stores::BlockStore>> store = kind->open(t.options, key);
    if (!store.ok()) return Status(store.status().code(), key + " (" + t.kind + "): " + store.status().message());
    chain.push_back(stores::ChainedStore{std::move(store).value(), t.write_through});
  }
  stores::StoreChainOptions o;
  o.key_prefix = config.key_prefix;
  o.max_queued_bytes = config.queue_bytes;
  o.max_events = max_events;
  o.fetch_chunk_bytes = config.fetch_chunk_bytes;
  o.record_key = std::move(record_key);
  return std::make_unique<stores::StoreChain>(std::move(chain), o, std::move(notify));
}

std::vector<std::string> StoreNames(const std::vector<std::string>& kinds) {
  std::map<std::string, int> of_kind;
  for (const auto& k : kinds) ++of_kind[k];
  std::map<std::string, int> seen;
  std::vector<std::string> out;
  for (const auto& k : kinds) {
    const int n = seen[k]++;
    out.push_back(of_kind[k] > 1 ? k + std::to_string(n) : k);
  }
  return out;
}

std::vector<std::string> StoreNames(const std::vector<stores::StoreStats>& stats) {
  std::vector<std::string> kinds;
  for (const auto& s : stats) kinds.push_back(s.kind);
  return StoreNames(kinds);
}

std::vector<std::string> StoreNames(const StoresConfig& config) {
  std::vector<std::string> kinds;
  for (const StoreTierConfig& t : config.tiers) kinds.push_back(t.kind);
  return StoreNames(kinds);
}

}  // namespace kvtier::daemon
