// RedisStore: a BlockStore on a Redis server or a Redis Cluster (redis_store.h):
// opening, Describe, Counters, and Present, Get and Put over Execute (redis_store_impl.h).
#include "redis/redis_store.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redis/redis_node.h"
#include "redis/redis_store_impl.h"

namespace kvtier::stores {
namespace redis {
namespace {

// One Status for the keys that failed: its code is kPermissionDenied when any
// was refused, kTimeout when every failure was a timeout, else the first
// other failure's; its message names each failing node once (a few at most).
Status Summarize(std::string_view what, const std::vector<Outcome>& outcomes) {
  size_t failed = 0;
  std::vector<const Status*> distinct;
  bool all_timeouts = true;
  const Status* denied = nullptr;
  const Status* first_other = nullptr;
  for (const Outcome& o : outcomes) {
    if (o.answered()) continue;
    ++failed;
    if (o.error.code() == StatusCode::kPermissionDenied && denied == nullptr) denied = &o.error;
    if (o.error.code() != StatusCode::kTimeout) {
      all_timeouts = false;
      if (first_other == nullptr) first_other = &o.error;
    }
    const bool seen = std::any_of(distinct.begin(), distinct.end(),
                                  [&](const Status* s) { return s->message() == o.error.message(); });
    if (!seen) distinct.push_back(&o.error);
  }
  std::string message = "redis " + std::string(what) + ": " + std::to_string(failed) + " of " +
                        std::to_string(outcomes.size()) + " keys failed: ";
  for (size_t i = 0; i < distinct.size() && i < 3; ++i) message += (i > 0 ? "; " : "") + distinct[i]->message();
  if (distinct.size() > 3) message += "; and " + std::to_string(distinct.size() - 3) + " more";
  StatusCode code = StatusCode::kUnavailable;
  if (denied != nullptr) {
    code = StatusCode::kPermissionDenied;
  } else if (all_timeouts) {
    code = StatusCode::kTimeout;
  } else if (first_other != nullptr) {
    code = first_other->code();
  }
  return Status(code, std::move(message));
}

}  // namespace

Status RedisStore::Open() {
  for (const std::string& n : options_.nodes) seeds_.push_back(NodeIndex(redis::ParseHostPort(n).value()));
  if (options_.cluster) {
    Status s = RefreshSlots();
    // Unreachable seeds are not an error; a refusal or a server not in cluster mode is.
    if (s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kInvalidArgument) return s;
    return Status::Ok();
  }
  const Command ping = {"PING"};
  redis::PipelineResult r = nodes_[seeds_[0]]->Pipeline({&ping, 1});
  if (r.status.code() == StatusCode::kPermissionDenied) return r.status;
  if (r.status.ok() && r.replies[0]->type == REDIS_REPLY_ERROR) {
    Status s = ReplyError(*r.replies[0], nodes_[seeds_[0]]->address());
    if (s.code() == StatusCode::kPermissionDenied) return s;
  }
  return Status::Ok();
}

std::string RedisStore::Describe() const {
  if (!options_.cluster) return "redis " + options_.nodes[0];
  const int masters = masters_.load(std::memory_order_relaxed);
  return "redis cluster " + options_.nodes[0] +
         (masters > 0 ? " (" + std::to_string(masters) + " masters)" : " (slot map not read yet)");
}

std::vector<StoreCounter> RedisStore::Counters() const {
  return {
      {"reconnects", counters_.reconnects.load(std::memory_order_relaxed), false},
      {"redirects", counters_.redirects.load(std::memory_order_relaxed), false},
      {"topology_refreshes", counters_.topology_refreshes.load(std::memory_order_relaxed), false},
      {"node_errors", counters_.node_errors.load(std::memory_order_relaxed), false},
      {"oversized", counters_.oversized.load(std::memory_order_relaxed), false},
  };
}

Command RedisStore::MakeCommand(Op op, const Request& request) const {
  switch (op) {
    case Op::kExists:
      return {"EXISTS", request.key};
    case Op::kGet:
      return {"GET", request.key};
    case Op::kGetRange:
      return {"GETRANGE", request.key, "0", request.value};
    case Op::kSet:
      if (options_.ttl_seconds == 0) return {"SET", request.key, request.value};
      return {"SET", request.key, request.value, "EX", ttl_text_};
  }
  return {};
}

Result<size_t> RedisStore::Present(std::span<const std::string> keys) {
  std::vector<Request> requests;
  requests.reserve(keys.size());
  for (const std::string& k : keys) requests.push_back({k, {}});
  const std::vector<Outcome> out = Execute(Op::kExists, requests);
  if (!out.empty() && std::none_of(out.begin(), out.end(), [](const Outcome& o) { return o.answered(); })) {
    return Summarize("present", out);
  }
  size_t held = 0;
  while (held < out.size() && out[held].answered() && out[held].reply->type == REDIS_REPLY_INTEGER &&
         out[held].reply->integer > 0) {
    ++held;
  }
  return held;
}

Result<std::vector<std::optional<StoreValue>>> RedisStore::Get(std::span<const std::string> keys,
                                                              uint64_t max_value_bytes) {
  // With a bound, GETRANGE key 0 <bound>: at most bound + 1 bytes come back,
  // and a value that long is too long, whatever its size on the server.
  const bool bounded = max_value_bytes < kAnyValueSize;
  const std::string last = bounded ? std::to_string(max_value_bytes) : std::string();
  std::vector<Request> requests;
  requests.reserve(keys.size());
  for (const std::string& k : keys) requests.push_back({k, last});
  std::vector<Outcome> out = Execute(bounded ? Op::kGetRange : Op::kGet, requests);
  if (!out.empty() && std::none_of(out.begin(), out.end(), [](const Outcome& o) { return o.answered(); })) {
    return Summarize("get", out);
  }
  std::vector<std::optional<StoreValue>> values(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].answered() && out[i].reply->type == REDIS_REPLY_STRING) {
      // GETRANGE answers "" for a key gone since Present; no record is empty.
      if (bounded && (out[i].reply->len == 0 || out[i].reply->len > max_value_bytes)) {
        if (out[i].reply->len > max_value_bytes) counters_.oversized.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      // The reply's buffer (hiredis allocates it with malloc) is handed on, not copied.
      redisReply& r = *out[i].reply;
      values[i].emplace(StoreValue::Adopt(r.str, r.len));
      r.str = nullptr;
      r.len = 0;
      out[i].reply.reset();
    }
  }
  return values;
}

Status RedisStore::Put(std::span<const StoreItem> items) {
  std::vector<Request> requests;
  requests.reserve(items.size());
  for (const StoreItem& item : items) requests.push_back({item.key, item.value});
  std::vector<Outcome> out = Execute(Op::kSet, requests);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].answered() && out[i].reply->type != REDIS_REPLY_STATUS) {
      out[i].error = ProtocolError("redis: SET " + std::string(requests[i].key) + " answered with reply type " +
                                   std::to_string(out[i].reply->type));
    }
  }
  if (std::all_of(out.begin(), out.end(), [](const Outcome& o) { return o.answered(); })) return Status::Ok();
  return Summarize("put", out);
}

}  // namespace redis

namespace {

Status Validate(const RedisStoreOptions& o) {
  if (o.nodes.empty()) return InvalidArgument("nodes: at least one host:port is required");
  for (size_t i = 0; i < o.nodes.size(); ++i) {
    auto hp = redis::ParseHostPort(o.nodes[i]);
    if (!hp.ok()) return InvalidArgument("nodes[" + std::to_string(i) + "]: " + hp.status().message());
  }
  if (!o.cluster && o.nodes.size() > 1) {
    return InvalidArgument("nodes: " + std::to_string(o.nodes.size()) +
                           " given, but a standalone store has one server (set cluster for a cluster's seed nodes)");
  }
  if (o.connect_timeout.count() <= 0) return InvalidArgument("connect_timeout must be positive");
  if (o.io_timeout.count() <= 0) return InvalidArgument("io_timeout must be positive");
  if (o.reconnect_interval.count() < 0) return InvalidArgument("reconnect_interval must not be negative");
  if (!o.user.empty() && o.password.empty())
    return InvalidArgument("user '" + o.user + "' is given without a password");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<BlockStore>> OpenRedisStore(const RedisStoreOptions& options) {
  KVTIER_RETURN_IF_ERROR(Validate(options));
  auto store = std::make_unique<redis::RedisStore>(options);
  KVTIER_RETURN_IF_ERROR(store->Open());
  return std::unique_ptr<BlockStore>(std::move(store));
}

}  // namespace kvtier::stores
