// Real Redis servers for tests: one redis-server, or a Redis Cluster of them,
// each on a free 127.0.0.1 port in a fresh temporary directory, without
// persistence. They talk to the servers through redis-cli, so a test needs no
// client library of its own.
//
// No server outlives its object: destructors SIGKILL them, and each server is
// started with PR_SET_PDEATHSIG so it dies with the test process even when
// that crashes or is killed (REQUIRES: the thread that starts a server
// outlives it; the tests' main thread does).
//
// Compile redis_server.cc and process.cc into the test. scripts/setup.sh
// installs Redis, so a test fails without it (kRedisRequired) rather than
// skip: a skip would hide a missing install step.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::testing {

// Whether redis-server and redis-cli are on PATH.
bool RedisInstalled();
inline constexpr const char* kRedisRequired =
    "redis-server and redis-cli are not on PATH: scripts/setup.sh installs them (Debian: redis-server, redis-tools)";

struct RedisServerOptions {
  std::string password;                 // requirepass: the default user's password. Empty: none.
  std::string acl_user;                 // An ACL user with every right and acl_password; empty: none.
  std::string acl_password;             // acl_user's password.
  bool cluster = false;                 // cluster-enabled, node timeout 1 s (RedisCluster sets it).
  std::vector<std::string> extra_args;  // More config as "--name", "value"... arguments.
};

class RedisServer {
 public:
  // Starts redis-server and waits (at most 5 s) until it answers PING.
  // kUnavailable when it cannot be started or does not come up (with its log).
  static Result<std::unique_ptr<RedisServer>> Start(const RedisServerOptions& options = {});
  ~RedisServer();  // SIGKILLs the server and removes its directory.
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>".
  const std::string& dir() const { return dir_; }
  bool running() const { return pid_ > 0; }

  // Sends `signal` and waits (at most 5 s, then SIGKILL) for the server to end.
  void Kill(int signal = SIGKILL);
  // SIGSTOP / SIGCONT: a server that accepts connections and answers nothing.
  void Pause();
  void Resume();
  // Kills it if running, starts it again on the same port and directory (its
  // data is gone; a cluster node keeps its nodes.conf) and waits for PING.
  Status Restart();

  // Runs redis-cli with `args` against this server (as the default user, with
  // the password when one is set) and returns its output: one line per reply
  // line, '\n'-separated, no trailing newline; an error reply is its text
  // ("ERR ..."). kTimeout when it takes longer than `timeout`.
  Result<std::string> Command(const std::vector<std::string>& args,
                              std::chrono::milliseconds timeout = std::chrono::seconds(5)) const;
  // The server's log file.
  std::string log() const;

 private:
  RedisServer() = default;
  Status Launch();
  Status WaitForPing(std::chrono::milliseconds timeout);

  RedisServerOptions options_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

class RedisCluster {
 public:
  // Starts masters * (1 + replicas_per_master) servers in cluster mode, joins
  // them with `redis-cli --cluster create`, and waits (at most 20 s) until
  // every node says cluster_state:ok and every master has its replicas online.
  // REQUIRES: masters >= 3 (kInvalidArgument otherwise). A password in
  // `options` is also every replica's masterauth.
  static Result<std::unique_ptr<RedisCluster>> Start(int masters, int replicas_per_master,
                                                     const RedisServerOptions& options = {});

  // Masters first (master i is nodes()[i]), then the replicas.
  const std::vector<std::unique_ptr<RedisServer>>& nodes() const { return nodes_; }
  RedisServer& master(int i) { return *nodes_[static_cast<size_t>(i)]; }
  // "127.0.0.1:<port>" of every node: seed nodes for a client.
  std::vector<std::string> seeds() const;

  // Waits (at most `timeout`) until every replica has applied everything its
  // master has written so far.
  Status WaitForReplication(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // SIGKILLs master i (its replica will take over: WaitForFailover).
  void KillMaster(int i);
  // Waits (at most `timeout`) until a replica of every killed master is a
  // master, and every running node says cluster_state:ok and sees it so.
  Status WaitForFailover(std::chrono::milliseconds timeout = std::chrono::seconds(20));

 private:
  RedisCluster() = default;
  // The port of master `i`'s first replica (from its INFO replication); 0 if none.
  int ReplicaPortOf(int i) const;

  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<int> promoted_ports_;  // Replicas expected to take over killed masters.
};

}  // namespace kvtier::testing
