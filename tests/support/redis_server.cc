#include "redis_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "process.h"

namespace kvtier::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

const std::string& RedisServerPath() {
  static const std::string path = FindProgram("redis-server");
  return path;
}

const std::string& RedisCliPath() {
  static const std::string path = FindProgram("redis-cli");
  return path;
}

bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A port that is free, with its cluster bus port (+10000) free too, and that
// this process has not handed out before.
int PickPort() {
  static std::mutex mu;
  static std::set<int> given;
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                          static_cast<unsigned>(Clock::now().time_since_epoch().count()));
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> dist(20000, 50000);
  for (int i = 0; i < 1000; ++i) {
    const int port = dist(rng);
    if (given.count(port) == 0 && PortFree(port) && PortFree(port + 10000)) {
      given.insert(port);
      return port;
    }
  }
  return 0;
}

// fork + exec with the child bound to this thread's life (PR_SET_PDEATHSIG)
// and its stdout and stderr appended to `log_path`.
Result<pid_t> SpawnBound(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int null = ::open("/dev/null", O_RDONLY);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Runs a short-lived program; its exit code and stdout lines ('\r' dropped).
struct ToolRun {
  int exit_code = -1;
  std::string out;
};
// `label` names it in errors (argv may hold a password).
Result<ToolRun> RunTool(const std::vector<std::string>& argv, const std::string& label, milliseconds timeout,
                        const std::string& stderr_path) {
  const auto deadline = Clock::now() + timeout;
  auto p = Process::Spawn(argv, stderr_path);
  if (!p.ok()) return p.status();
  ToolRun run;
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    auto line = p->ReadLine(std::max(left, milliseconds(1)));
    if (!line.ok()) {
      if (line.status().code() == StatusCode::kTimeout) {
        return Status(StatusCode::kTimeout,
                      label + ": no end within " + std::to_string(timeout.count()) + " ms; output so far:\n" + run.out);
      }
      break;  // End of output.
    }
    std::string l = std::move(line).value();
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (!run.out.empty()) run.out += '\n';
    run.out += l;
  }
  while (!run.out.empty() && run.out.back() == '\n') run.out.pop_back();  // Error replies end in a blank line.
  auto code = p->Wait(std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1000)));
  if (!code.ok()) return code.status();
  run.exit_code = code.value();
  return run;
}

// The value of "name:value" in an INFO reply; empty if absent.
std::string InfoField(const std::string& info, const std::string& name) {
  std::stringstream lines(info);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + ":", 0) == 0) return line.substr(name.size() + 1);
  }
  return "";
}

std::string Loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace

bool RedisInstalled() { return !RedisServerPath().empty() && !RedisCliPath().empty(); }

// ---------------------------------------------------------------- RedisServer

Result<std::unique_ptr<RedisServer>> RedisServer::Start(const RedisServerOptions& options) {
  if (!RedisInstalled()) return Unavailable("redis-server or redis-cli is not on PATH");
  static std::atomic<int> counter{0};
  std::unique_ptr<RedisServer> s(new RedisServer());
  s->options_ = options;
  s->dir_ = (std::filesystem::temp_directory_path() /
             ("kvtier-redis-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
  std::filesystem::remove_all(s->dir_);
  std::filesystem::create_directories(s->dir_);
  Status last;
  // Another process may take the port between the check and the bind: then
  // the server exits at once, and another port is tried.
  for (int attempt = 0; attempt < 5; ++attempt) {
    s->port_ = PickPort();
    if (s->port_ == 0) return Unavailable("no free port pair for redis-server");
    last = s->Launch();
    if (last.ok()) last = s->WaitForPing(milliseconds(5000));
    if (last.ok()) return s;
    if (s->running()) break;  // Up but not answering: not a port clash.
  }
  return last;
}

RedisServer::~RedisServer() {
  Kill(SIGKILL);
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string RedisServer::address() const { return Loopback(port_); }

std::string RedisServer::log() const {
  std::ifstream in(dir_ + "/redis.log");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Status RedisServer::Launch() {
  std::vector<std::string> argv = {
      RedisServerPath(),  "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
      "--appendonly",     "no",     "--daemonize",         "no",     "--dir",     dir_,     "--logfile",
      dir_ + "/redis.log"};
  if (!options_.password.empty()) {
    argv.insert(argv.end(), {"--requirepass", options_.password});
    if (options_.cluster) argv.insert(argv.end(), {"--masterauth", options_.password});
  }
  if (!options_.acl_user.empty()) {
    argv.insert(argv.end(), {"--user", options_.acl_user, "on", ">" + options_.acl_password, "~*", "&*", "+@all"});
  }
  if (options_.cluster) {
    argv.insert(argv.end(),
                {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"});
  }
  argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
  auto pid = SpawnBound(argv, dir_ + "/stdout.log");
  if (!pid.ok()) return pid.status();
  pid_ = pid.value();
  return Status::Ok();
}

Status RedisServer::WaitForPing(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last;
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Unavailable("redis-server on port " + std::to_string(port_) + " exited during start; its log:\n" + log());
    }
    auto pong = Command({"PING"}, milliseconds(1000));
    if (pong.ok() && pong.value() == "PONG") return Status::Ok();
    last = pong.ok() ? pong.value() : pong.status().ToString();
    std::this_thread::sleep_for(milliseconds(10));
  }
  return Status(StatusCode::kTimeout, "redis-server on port " + std::to_string(port_) + " did not answer PING in " +
                                          std::to_string(timeout.count()) + " ms (last: " + last + "); its log:\n" +
                                          log());
}

void RedisServer::Kill(int signal) {
  if (pid_ <= 0) return;
  ::kill(pid_, signal);
  ::kill(pid_, SIGCONT);  // A paused server handles SIGTERM only once it runs.
  const auto deadline = Clock::now() + milliseconds(5000);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  pid_ = -1;
}

void RedisServer::Pause() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void RedisServer::Resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

Status RedisServer::Restart() {
  Kill(SIGKILL);
  KVTIER_RETURN_IF_ERROR(Launch());
  return WaitForPing(milliseconds(5000));
}

Result<std::string> RedisServer::Command(const std::vector<std::string>& args, milliseconds timeout) const {
  std::vector<std::string> argv = {RedisCliPath(), "-h", "127.0.0.1", "-p", std::to_string(port_)};
  if (!options_.password.empty()) argv.insert(argv.end(), {"-a", options_.password, "--no-auth-warning"});
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = RunTool(argv, "redis-cli -p " + std::to_string(port_) + " " + (args.empty() ? "" : args[0]), timeout,
                     dir_ + "/redis-cli.log");
  if (!run.ok()) return run.status();
  return std::move(run->out);
}

// --------------------------------------------------------------- RedisCluster

Result<std::unique_ptr<RedisCluster>> RedisCluster::Start(int masters, int replicas_per_master,
                                                          const RedisServerOptions& options) {
  if (masters < 3) return InvalidArgument("a Redis Cluster needs at least 3 masters");
  std::unique_ptr<RedisCluster> c(new RedisCluster());
  RedisServerOptions node_options = options;
  node_options.cluster = true;
  const int total = masters * (1 + replicas_per_master);
  std::vector<std::string> argv = {RedisCliPath(), "--cluster", "create"};
  for (int i = 0; i < total; ++i) {
    auto s = RedisServer::Start(node_options);
    if (!s.ok()) return s.status();
    argv.push_back(s.value()->address());
    c->nodes_.push_back(std::move(s).value());
  }
  argv.insert(argv.end(), {"--cluster-replicas", std::to_string(replicas_per_master), "--cluster-yes"});
  if (!options.password.empty()) argv.insert(argv.end(), {"-a", options.password, "--no-auth-warning"});
  auto created =
      RunTool(argv, "redis-cli --cluster create", milliseconds(30000), c->nodes_[0]->dir() + "/redis-cli.log");
  if (!created.ok()) return created.status();
  if (created->exit_code != 0) return Unavailable("redis-cli --cluster create failed:\n" + created->out);

  // With every node on one host, redis-cli makes the first `masters` nodes the masters.
  const auto deadline = Clock::now() + milliseconds(20000);
  std::string waiting_for;
  while (Clock::now() < deadline) {
    waiting_for.clear();
    for (int i = 0; i < total && waiting_for.empty(); ++i) {
      RedisServer& node = *c->nodes_[static_cast<size_t>(i)];
      auto info = node.Command({"CLUSTER", "INFO"});
      if (!info.ok() || InfoField(*info, "cluster_state") != "ok" ||
          InfoField(*info, "cluster_known_nodes") != std::to_string(total)) {
        waiting_for = node.address() + " to see " + std::to_string(total) + " nodes and cluster_state:ok";
        continue;
      }
      auto repl = node.Command({"INFO", "replication"});
      const std::string role = repl.ok() ? InfoField(*repl, "role") : "";
      if (role != (i < masters ? "master" : "slave")) {
        waiting_for = node.address() + " to be a " + (i < masters ? "master" : "replica") + " (is " + role + ")";
      } else if (i < masters) {
        int online = 0;
        for (int r = 0; r < replicas_per_master; ++r) {
          if (InfoField(*repl, "slave" + std::to_string(r)).find("state=online") != std::string::npos) ++online;
        }
        if (online != replicas_per_master) waiting_for = node.address() + "'s replicas to be online";
      }
    }
    if (waiting_for.empty()) return c;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return Status(StatusCode::kTimeout, "redis cluster not ready in 20 s: waiting for " + waiting_for);
}

std::vector<std::string> RedisCluster::seeds() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->address());
  return out;
}

int RedisCluster::ReplicaPortOf(int i) const {
  auto repl = nodes_[static_cast<size_t>(i)]->Command({"INFO", "replication"});
  if (!repl.ok()) return 0;
  const std::string slave = InfoField(*repl, "slave0");  // ip=127.0.0.1,port=N,state=...
  const size_t at = slave.find("port=");
  return at == std::string::npos ? 0 : std::atoi(slave.c_str() + at + 5);
}

Status RedisCluster::WaitForReplication(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& master : nodes_) {
    if (!master->running()) continue;
    auto repl = master->Command({"INFO", "replication"});
    if (!repl.ok()) return repl.status();
    if (InfoField(*repl, "role") != "master") continue;
    const long long written = std::atoll(InfoField(*repl, "master_repl_offset").c_str());
    for (int r = 0;; ++r) {
      const std::string slave = InfoField(*repl, "slave" + std::to_string(r));
      if (slave.empty()) break;
      const size_t at = slave.find("port=");
      const int port = at == std::string::npos ? 0 : std::atoi(slave.c_str() + at + 5);
      for (const auto& replica : nodes_) {
        if (replica->port() != port || !replica->running()) continue;
        for (;;) {
          auto info = replica->Command({"INFO", "replication"});
          if (info.ok() && std::atoll(InfoField(*info, "slave_repl_offset").c_str()) >= written) break;
          if (Clock::now() > deadline) {
            return Status(StatusCode::kTimeout, "replica " + replica->address() + " of " + master->address() +
                                                    " did not reach offset " + std::to_string(written));
          }
          std::this_thread::sleep_for(milliseconds(10));
        }
      }
    }
  }
  return Status::Ok();
}

void RedisCluster::KillMaster(int i) {
  const int replica = ReplicaPortOf(i);
  if (replica != 0) promoted_ports_.push_back(replica);
  nodes_[static_cast<size_t>(i)]->Kill(SIGKILL);
}

Status RedisCluster::WaitForFailover(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string waiting_for;
  while (Clock::now() < deadline) {
    waiting_for.clear();
    for (const int port : promoted_ports_) {
      for (const auto& n : nodes_) {
        if (n->port() != port || !waiting_for.empty()) continue;
        auto repl = n->Command({"INFO", "replication"});
        if (!repl.ok() || InfoField(*repl, "role") != "master") waiting_for = n->address() + " to become a master";
      }
    }
    for (const auto& n : nodes_) {
      if (!n->running() || !waiting_for.empty()) continue;
      auto info = n->Command({"CLUSTER", "INFO"});
      if (!info.ok() || InfoField(*info, "cluster_state") != "ok") {
        waiting_for = n->address() + " to say cluster_state:ok";
        continue;
      }
      auto nodes = n->Command({"CLUSTER", "NODES"});
      if (!nodes.ok()) {
        waiting_for = n->address() + " to answer CLUSTER NODES";
        continue;
      }
      // "<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>..."
      for (const int port : promoted_ports_) {
        std::stringstream lines(*nodes);
        std::string line;
        bool serving = false;
        while (std::getline(lines, line)) {
          std::stringstream fields(line);
          std::vector<std::string> f;
          for (std::string w; fields >> w;) f.push_back(w);
          if (f.size() >= 3 && f[1].rfind(Loopback(port) + "@", 0) == 0) {
            serving = f[2].find("master") != std::string::npos && f.size() > 8;
          }
        }
        if (!serving) waiting_for = n->address() + " to see " + Loopback(port) + " serve slots as a master";
      }
    }
    if (waiting_for.empty()) return Status::Ok();
    std::this_thread::sleep_for(milliseconds(100));
  }
  return Status(StatusCode::kTimeout,
                "failover not finished in " + std::to_string(timeout.count()) + " ms: waiting for " + waiting_for);
}

}  // namespace kvtier::testing
