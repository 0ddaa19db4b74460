// RedisStore: the BlockStore on Redis (redis_store.h). Internal to
// kvtier::redis_store.
//
// Its work, by concept:
//   redis_store.cc    opening, Describe, Counters, and the store's commands
//                     (Present, Get, Put) over Execute
//   redis_routing.cc  the node pool, the slot map (CLUSTER SLOTS), and Execute:
//                     each key's command sent to its node, redirects followed
//   redis_node.h      one connection to one server
//
// Thread-safety: a BlockStore's (block_store.h): driven by one thread at a
// time; Counters() may be called from any thread.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "redis/key_slot.h"
#include "redis/redis_node.h"
#include "redis/redis_store.h"

namespace kvtier::stores::redis {

inline constexpr int32_t kNoOwner = -1;

enum class Op { kExists, kGet, kGetRange, kSet };

// The answer to one key: a reply that is not an error, or why there is none.
struct Outcome {
  Reply reply;
  Status error = Unavailable("redis: not asked");
  bool answered() const { return error.ok(); }
};

// The Status for an error reply that is not a redirect.
Status ReplyError(const redisReply& r, const std::string& node);

class RedisStore final : public BlockStore {
 public:
  explicit RedisStore(RedisStoreOptions options)
      : options_(std::move(options)), ttl_text_(std::to_string(options_.ttl_seconds)) {}

  // Adds the nodes and makes the first contact. REQUIRES: options validated.
  Status Open();

  std::string_view kind() const override { return "redis"; }
  std::string Describe() const override;
  Result<size_t> Present(std::span<const std::string> keys) override;
  Result<std::vector<std::optional<StoreValue>>> Get(std::span<const std::string> keys,
                                                     uint64_t max_value_bytes) override;
  Status Put(std::span<const StoreItem> items) override;
  std::vector<StoreCounter> Counters() const override;

 private:
  struct Request {
    std::string_view key;
    std::string_view value;  // kSet only.
  };

  // Sends each request's command to the node that owns its key, one pipeline
  // per node, following MOVED (kMaxMoves times) and ASK (once) and trying a
  // key once more after its node failed and the slot map was read again.
  std::vector<Outcome> Execute(Op op, std::span<const Request> requests);
  Command MakeCommand(Op op, const Request& request) const;
  size_t NodeIndex(const HostPort& address);
  int32_t OwnerOf(std::string_view key) const;
  // Reads the slot map from the first node that gives one (connected nodes
  // first, down nodes last).
  Status RefreshSlots();
  Status ParseSlots(const redisReply& reply, const std::string& asked_host, std::vector<int32_t>* owners);

  const RedisStoreOptions options_;  // The nodes keep a reference.
  const std::string ttl_text_;
  redis::RedisCounters counters_;
  std::vector<std::unique_ptr<RedisNode>> nodes_;
  std::unordered_map<std::string, size_t> by_address_;
  std::vector<size_t> seeds_;
  std::vector<int32_t> slot_owner_ = std::vector<int32_t>(redis::kClusterSlots, kNoOwner);  // Cluster only.
  std::atomic<int> masters_{0};  // Distinct owners in slot_owner_, for Describe().
};

}  // namespace kvtier::stores::redis
