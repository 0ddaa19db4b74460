// RedisNode: the store's one connection to one Redis server (redis_store.h),
// opened when first needed and reopened after a failure at most once per
// reconnect_interval. Internal to kvtier::redis_store.
//
// Thread-safety: driven by one thread at a time (the store's); the counters it
// adds to are atomic.
#pragma once

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redis/redis_store.h"

namespace kvtier::stores::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One command's arguments; they must outlive the Pipeline call that sends them.
using Command = std::vector<std::string_view>;

// What every node of a store adds to (RedisStore::Counters()).
struct RedisCounters {
  std::atomic<uint64_t> reconnects{0};          // Connections opened after a node's first.
  std::atomic<uint64_t> redirects{0};           // MOVED and ASK replies followed.
  std::atomic<uint64_t> topology_refreshes{0};  // Slot maps read (CLUSTER SLOTS).
  std::atomic<uint64_t> oversized{0};           // Values longer than a record asked for: refused, not read whole.
  std::atomic<uint64_t> node_errors{0};         // Failed connects, AUTHs, reads and writes.
};

// "host:port" or "[v6 address]:port", split; kInvalidArgument otherwise.
struct HostPort {
  std::string host;
  int port = 0;
};
Result<HostPort> ParseHostPort(std::string_view text);
// The inverse: "host:port", "[v6 address]:port".
std::string FormatHostPort(const HostPort& address);

struct PipelineResult {
  Status status;               // Of the connection; a command's error is its reply.
  bool fresh_failure = false;  // The node was tried now and failed (not: already down).
  std::vector<Reply> replies;  // One per command, in order, when status is ok.
};

class RedisNode {
 public:
  // REQUIRES: `options` and `counters` outlive the node.
  RedisNode(HostPort address, const RedisStoreOptions& options, RedisCounters* counters);
  ~RedisNode();
  RedisNode(const RedisNode&) = delete;
  RedisNode& operator=(const RedisNode&) = delete;

  const std::string& host() const { return host_; }
  const std::string& address() const { return address_; }  // "host:port".
  bool connected() const { return ctx_ != nullptr; }
  // Failed within the last reconnect_interval: calls fail at once until then.
  bool down() const;

  // Sends `commands` pipelined (appended together, then every reply read; very
  // large batches go in a few pipelines of bounded bytes) and returns a reply
  // to each. Connects (and AUTHs) first when not connected and not down.
  // Failures of the connection fail the whole call: kUnavailable (refused,
  // closed, reset), kTimeout (no answer within connect_timeout/io_timeout),
  // kPermissionDenied (AUTH refused); the connection is closed and the node is
  // down for reconnect_interval. A reused connection that the server closed
  // (a restart, an idle timeout) is reopened at once, one time.
  PipelineResult Pipeline(std::span<const Command> commands);

 private:
  Status EnsureConnected(bool* fresh);
  Status Connect();
  Status Exchange(std::span<const Command> commands, std::vector<Reply>* replies);
  Status ContextError() const;
  void Close();
  void MarkDown(Status status);

  const std::string host_;
  const int port_;
  const std::string address_;
  const RedisStoreOptions& options_;
  RedisCounters* const counters_;
  redisContext* ctx_ = nullptr;
  bool ever_connected_ = false;
  std::chrono::steady_clock::time_point retry_at_{};  // While down: no attempt before this.
  Status last_error_;
};

}  // namespace kvtier::stores::redis
