// RedisStore's routing: the node pool, the slot map, and Execute (redis_store_impl.h).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redis/key_slot.h"
#include "redis/redis_node.h"
#include "redis/redis_store_impl.h"

namespace kvtier::stores::redis {
namespace {

// A key moved this many times in one call is given up (a slot migrating back
// and forth, a map that will not settle).
constexpr int kMaxMoves = 3;

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string_view ReplyText(const redisReply& r) { return {r.str, r.len}; }

}  // namespace

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

namespace {

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

}  // namespace

size_t RedisStore::NodeIndex(const HostPort& address) {
  const auto [it, inserted] = by_address_.emplace(redis::FormatHostPort(address), nodes_.size());
  if (inserted) nodes_.push_back(std::make_unique<RedisNode>(address, options_, &counters_));
  return it->second;
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

}  // namespace kvtier::stores::redis
