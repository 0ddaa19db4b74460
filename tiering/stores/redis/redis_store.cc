// RedisStore: a BlockStore on a Redis server or a Redis Cluster (redis_store.h).
#include "redis/redis_store.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <unordered_map>
#include <utility>

#include "redis/key_slot.h"
#include "redis/redis_node.h"

namespace kvtier::stores {
namespace {

using redis::Command;
using redis::HostPort;
using redis::RedisNode;
using redis::Reply;

// A key moved this many times in one call is given up (a slot migrating back
// and forth, a map that will not settle).
constexpr int kMaxMoves = 3;
constexpr int32_t kNoOwner = -1;

enum class Op { kExists, kGet, kGetRange, kSet };

// The answer to one key: a reply that is not an error, or why there is none.
struct Outcome {
  Reply reply;
  Status error = Unavailable("redis: not asked");
  bool answered() const { return error.ok(); }
};

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string_view ReplyText(const redisReply& r) { return {r.str, r.len}; }

// The Status for an error reply that is not a redirect.
Status ReplyError(const redisReply& r, const std::string& node) {
  const std::string text(ReplyText(r));
  const std::string where = "redis node " + node + ": ";
  if (StartsWith(text, "NOAUTH") || StartsWith(text, "WRONGPASS") || StartsWith(text, "NOPERM")) {
    return Status(StatusCode::kPermissionDenied, where + text + " (check the user and password)");
  }
  if (StartsWith(text, "OOM")) return ResourceExhausted(where + text + " (give the server a maxmemory-policy)");
  if (StartsWith(text, "MOVED") || StartsWith(text, "ASK")) {
    return FailedPrecondition(where + text + ": the server is a cluster node (set cluster)");
  }
  return Unavailable(where + text);
}

struct Redirect {
  uint16_t slot = 0;
  HostPort to;
};

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 :6381" (an empty host: the node's own).
std::optional<Redirect> ParseRedirect(std::string_view text, const std::string& asked_host) {
  const size_t a = text.find(' ');
  const size_t b = a == std::string_view::npos ? a : text.find(' ', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  const std::string_view slot_text = text.substr(a + 1, b - a - 1);
  Redirect r;
  const auto [end, ec] = std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), r.slot);
  if (ec != std::errc() || end != slot_text.data() + slot_text.size() || r.slot >= redis::kClusterSlots) {
    return std::nullopt;
  }
  std::string address(text.substr(b + 1));
  if (StartsWith(address, ":")) address = asked_host + address;
  auto hp = redis::ParseHostPort(address);
  if (!hp.ok()) return std::nullopt;
  r.to = std::move(hp).value();
  return r;
}

bool IsRedirect(const redisReply& r, std::string_view kind) {
  return r.type == REDIS_REPLY_ERROR && StartsWith(ReplyText(r), kind) && r.len > kind.size() &&
         r.str[kind.size()] == ' ';
}

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

size_t RedisStore::NodeIndex(const HostPort& address) {
  const auto [it, inserted] = by_address_.emplace(redis::FormatHostPort(address), nodes_.size());
  if (inserted) nodes_.push_back(std::make_unique<RedisNode>(address, options_, &counters_));
  return it->second;
}

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

int32_t RedisStore::OwnerOf(std::string_view key) const {
  if (!options_.cluster) return static_cast<int32_t>(seeds_[0]);
  return slot_owner_[redis::KeySlot(key)];
}

Status RedisStore::ParseSlots(const redisReply& reply, const std::string& asked_host, std::vector<int32_t>* owners) {
  if (reply.type != REDIS_REPLY_ARRAY) return ProtocolError("CLUSTER SLOTS: not an array");
  size_t covered = 0;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply& range = *reply.element[i];
    if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 || range.element[0]->type != REDIS_REPLY_INTEGER ||
        range.element[1]->type != REDIS_REPLY_INTEGER || range.element[2]->type != REDIS_REPLY_ARRAY) {
      return ProtocolError("CLUSTER SLOTS: malformed range " + std::to_string(i));
    }
    const long long first = range.element[0]->integer;
    const long long last = range.element[1]->integer;
    const redisReply& master = *range.element[2];
    if (first < 0 || last < first || last >= redis::kClusterSlots || master.elements < 2 ||
        master.element[0]->type != REDIS_REPLY_STRING || master.element[1]->type != REDIS_REPLY_INTEGER) {
      return ProtocolError("CLUSTER SLOTS: malformed range " + std::to_string(i));
    }
    std::string host(ReplyText(*master.element[0]));
    if (host == "?") continue;  // Its endpoint is not known yet.
    if (host.empty()) host = asked_host;
    const auto port = master.element[1]->integer;
    if (port < 1 || port > 65535) return ProtocolError("CLUSTER SLOTS: bad port " + std::to_string(port));
    const auto owner = static_cast<int32_t>(NodeIndex(HostPort{std::move(host), static_cast<int>(port)}));
    std::fill(owners->begin() + first, owners->begin() + last + 1, owner);
    covered += static_cast<size_t>(last - first + 1);
  }
  if (covered == 0) return Unavailable("CLUSTER SLOTS: no slot is assigned yet");
  return Status::Ok();
}

Status RedisStore::RefreshSlots() {
  std::vector<size_t> order(nodes_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto rank = [&](size_t n) { return nodes_[n]->connected() ? 0 : nodes_[n]->down() ? 2 : 1; };
    return rank(a) < rank(b);
  });
  Status last = Unavailable("redis cluster: no node to ask for the slot map");
  Status denied;
  for (const size_t n : order) {
    const Command slots = {"CLUSTER", "SLOTS"};
    redis::PipelineResult r = nodes_[n]->Pipeline({&slots, 1});
    const std::string address = nodes_[n]->address();
    if (!r.status.ok()) {
      if (r.status.code() == StatusCode::kPermissionDenied) denied = r.status;
      last = r.status;
      continue;
    }
    const redisReply& reply = *r.replies[0];
    if (reply.type == REDIS_REPLY_ERROR) {
      const std::string_view text = ReplyText(reply);
      last = text.find("cluster support disabled") != std::string_view::npos
                 ? InvalidArgument("redis node " + address + " is not in cluster mode (unset cluster)")
                 : ReplyError(reply, address);
      if (last.code() == StatusCode::kPermissionDenied) denied = last;
      continue;
    }
    std::vector<int32_t> owners(redis::kClusterSlots, kNoOwner);
    Status parsed = ParseSlots(reply, nodes_[n]->host(), &owners);
    if (!parsed.ok()) {
      last = Status(parsed.code(), "redis node " + address + ": " + parsed.message());
      continue;
    }
    slot_owner_ = std::move(owners);
    std::vector<int32_t> distinct = slot_owner_;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    masters_.store(static_cast<int>(distinct.size() - (distinct.front() == kNoOwner ? 1 : 0)),
                   std::memory_order_relaxed);
    counters_.topology_refreshes.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }
  return denied.ok() ? last : denied;
}

std::vector<Outcome> RedisStore::Execute(Op op, std::span<const Request> requests) {
  std::vector<Outcome> out(requests.size());
  if (requests.empty()) return out;
  if (options_.cluster && masters_.load(std::memory_order_relaxed) == 0) (void)RefreshSlots();

  std::vector<int> moves(requests.size(), 0);
  std::vector<bool> retried(requests.size(), false);
  std::vector<size_t> pending(requests.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;

  while (!pending.empty()) {
    std::vector<std::vector<size_t>> by_node(nodes_.size());
    for (const size_t i : pending) {
      const int32_t owner = OwnerOf(requests[i].key);
      if (owner == kNoOwner) {
        out[i].error =
            Unavailable("redis cluster: no master known for slot " + std::to_string(redis::KeySlot(requests[i].key)));
      } else {
        by_node[static_cast<size_t>(owner)].push_back(i);
      }
    }
    std::vector<size_t> again;
    std::vector<std::pair<size_t, size_t>> asks;  // (request, node)
    bool refresh = false;
    std::vector<Command> commands;
    for (size_t n = 0; n < by_node.size(); ++n) {
      const std::vector<size_t>& keys = by_node[n];
      if (keys.empty()) continue;
      commands.clear();
      for (const size_t i : keys) commands.push_back(MakeCommand(op, requests[i]));
      RedisNode& node = *nodes_[n];
      redis::PipelineResult r = node.Pipeline(commands);
      if (!r.status.ok()) {
        // A node that failed now may have failed over: read the map again and
        // try its keys once more (where the map then says).
        const bool retry = options_.cluster && r.fresh_failure;
        refresh = refresh || retry;
        for (const size_t i : keys) {
          if (retry && !retried[i]) {
            retried[i] = true;
            again.push_back(i);
          } else {
            out[i].error = r.status;
          }
        }
        continue;
      }
      for (size_t k = 0; k < keys.size(); ++k) {
        const size_t i = keys[k];
        Reply& reply = r.replies[k];
        if (options_.cluster && (IsRedirect(*reply, "MOVED") || IsRedirect(*reply, "ASK"))) {
          const bool moved = IsRedirect(*reply, "MOVED");
          const std::optional<Redirect> to = ParseRedirect(ReplyText(*reply), node.host());
          if (!to) {
            out[i].error = ProtocolError("redis node " + node.address() + ": bad redirect '" +
                                         std::string(ReplyText(*reply)) + "'");
            continue;
          }
          counters_.redirects.fetch_add(1, std::memory_order_relaxed);
          const size_t target = NodeIndex(to->to);
          if (!moved) {
            asks.emplace_back(i, target);
          } else if (++moves[i] > kMaxMoves) {
            out[i].error = Unavailable("redis node " + node.address() + ": key moved more than " +
                                       std::to_string(kMaxMoves) + " times in one call");
          } else {
            slot_owner_[to->slot] = static_cast<int32_t>(target);
            refresh = true;
            again.push_back(i);
          }
          continue;
        }
        if (reply->type == REDIS_REPLY_ERROR) {
          out[i].error = ReplyError(*reply, node.address());
        } else {
          out[i].reply = std::move(reply);
          out[i].error = Status::Ok();
        }
      }
    }

    // ASK: the slot is migrating; the named node takes this one command after ASKING.
    std::vector<std::vector<size_t>> ask_by_node(nodes_.size());
    for (const auto& [i, n] : asks) ask_by_node[n].push_back(i);
    const Command asking = {"ASKING"};
    for (size_t n = 0; n < ask_by_node.size(); ++n) {
      const std::vector<size_t>& keys = ask_by_node[n];
      if (keys.empty()) continue;
      commands.clear();
      for (const size_t i : keys) {
        commands.push_back(asking);
        commands.push_back(MakeCommand(op, requests[i]));
      }
      RedisNode& node = *nodes_[n];
      redis::PipelineResult r = node.Pipeline(commands);
      for (size_t k = 0; k < keys.size(); ++k) {
        const size_t i = keys[k];
        if (!r.status.ok()) {
          out[i].error = r.status;
          continue;
        }
        Reply& reply = r.replies[2 * k + 1];
        if (reply->type == REDIS_REPLY_ERROR) {
          out[i].error = IsRedirect(*reply, "MOVED") || IsRedirect(*reply, "ASK")
                             ? Unavailable("redis node " + node.address() + ": redirected again after ASK (" +
                                           std::string(ReplyText(*reply)) + ")")
                             : ReplyError(*reply, node.address());
        } else {
          out[i].reply = std::move(reply);
          out[i].error = Status::Ok();
        }
      }
    }

    if (refresh) (void)RefreshSlots();
    pending = std::move(again);
  }
  return out;
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
  auto store = std::make_unique<RedisStore>(options);
  KVTIER_RETURN_IF_ERROR(store->Open());
  return std::unique_ptr<BlockStore>(std::move(store));
}

}  // namespace kvtier::stores
