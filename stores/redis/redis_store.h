// RedisStore: a BlockStore on Redis 7 / Valkey, standalone or Redis Cluster,
// through hiredis: what several hosts behind a load balancer share.
//
// Standalone: one node. Cluster: the seed nodes are asked for the slot map
// (CLUSTER SLOTS); each key goes to the master of its hash slot (CRC16 of the
// key, or of its {hash tag}); a batch is pipelined per node (one round trip
// per node per batch, the nodes asked in turn). A MOVED reply updates the slot
// map (refreshed whole, from any reachable node) and the key is asked again at
// its new master; ASK is followed once with ASKING. A node that cannot be
// reached, or does not answer within io_timeout, fails its keys (Get: nullopt,
// Present: the prefix ends there, Put: an error) and is reconnected on a later
// call, at most once per reconnect_interval, so a dead node costs one timeout
// per interval, not one per call.
//
// Values are SET with an optional TTL (EX). AUTH (with an ACL user when one is
// given) on every connection.
//
// Errors: Get and Present fail only when no key got an answer (kUnavailable,
// kTimeout when every failure was a timeout, kPermissionDenied when AUTH was
// refused); Put fails when any value was not written, naming the nodes, after
// writing the others. Messages never hold the password.
//
// Counters(): reconnects (connections opened after a node's first),
// redirects (MOVED and ASK followed), topology_refreshes (slot maps read),
// node_errors (failed connects, AUTHs, reads and writes).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/stores/block_store.h"

namespace kvtier::stores {

struct RedisStoreOptions {
  std::vector<std::string> nodes;  // "host:port"; a cluster's seed nodes, or the one standalone server.
  bool cluster = false;
  std::string user;                // ACL user; empty: the default user.
  std::string password;            // Empty: no AUTH.
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds io_timeout{500};
  std::chrono::milliseconds reconnect_interval{1000};
  uint32_t ttl_seconds = 0;        // 0: values do not expire.
};

// Connects (kInvalidArgument for bad options: no node, a node that is not
// host:port, several nodes without cluster, a user without a password, a
// timeout that is not positive, cluster set for a server not in cluster mode;
// kPermissionDenied when a server refuses AUTH or needs it). A node that cannot
// be reached now is not an error: the store answers as down and reconnects
// later.
Result<std::unique_ptr<BlockStore>> OpenRedisStore(const RedisStoreOptions& options);

}  // namespace kvtier::stores
