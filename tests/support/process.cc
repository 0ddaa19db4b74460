#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

extern char** environ;

namespace kvtier::testing {

using Clock = std::chrono::steady_clock;

Result<Process> Process::Spawn(const std::vector<std::string>& argv, const std::string& stderr_path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  if (!stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Internal("spawn " + argv[0] + ": " + std::strerror(rc));
  }
  Process p;
  p.pid_ = pid;
  p.out_fd_ = fds[0];
  return p;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    this->~Process();
    pid_ = std::exchange(other.pid_, -1);
    out_fd_ = std::exchange(other.out_fd_, -1);
    reaped_ = std::exchange(other.reaped_, false);
    status_ = other.status_;
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

Process::~Process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    (void)Wait(std::chrono::seconds(10));
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  out_fd_ = -1;
  pid_ = -1;
}

Result<std::string> Process::ReadLine(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status(StatusCode::kTimeout, "no line from pid " + std::to_string(pid_));
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n == 0) return NotFound("end of output of pid " + std::to_string(pid_) + (buffer_.empty() ? "" : ": " + buffer_));
    if (n > 0) buffer_.append(buf, static_cast<size_t>(n));
  }
}

void Process::Kill(int signal) {
  if (running()) ::kill(pid_, signal);
}

Result<int> Process::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!reaped_) {
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (Clock::now() > deadline) return Status(StatusCode::kTimeout, "pid " + std::to_string(pid_) + " still running");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  return 128 + WTERMSIG(status_);
}

DaemonProcess::DaemonProcess(const std::string& config_body) {
  static std::atomic<int> counter{0};
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
  dir_ = (std::filesystem::temp_directory_path() / ("kvtier-it-" + tag)).string();
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  socket_ = dir_ + "/kvtierd.sock";
  instance_ = "kvtier-it-" + tag;
  config_path_ = dir_ + "/kvtierd.yaml";
  log_path_ = dir_ + "/kvtierd.log";
  std::ofstream(config_path_) << "instance: " << instance_ << "\nsocket: " << socket_ << "\n" << config_body;
}

DaemonProcess::~DaemonProcess() {
  if (process_.running()) {
    process_.Kill(SIGTERM);
    if (!process_.Wait(std::chrono::seconds(10)).ok()) process_.Kill(SIGKILL);
  }
  process_ = Process();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
  RemoveSegments();
}

void DaemonProcess::RemoveSegments() const {
  // What the daemon leaves on purpose (warm_restart's host pool and manifest)
  // or after a crash: every /dev/shm/<instance>.* entry.
  std::error_code ec;
  const std::string prefix = instance_ + ".";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(entry.path(), ec);
  }
}

std::string DaemonProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Status DaemonProcess::Start(const std::vector<std::string>& extra_args) {
  const size_t log_before = log().size();
  std::vector<std::string> argv = {KvtierdPath(), "--config", config_path_};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto p = Process::Spawn(argv, log_path_);
  if (!p.ok()) return p.status();
  process_ = std::move(p).value();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    const std::string l = log();
    if (l.find("ready: listening", log_before) != std::string::npos) return Status::Ok();
    if (!process_.running() || process_.Wait(std::chrono::milliseconds(0)).ok()) {
      return Unavailable("kvtierd exited during start:\n" + l.substr(log_before));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status(StatusCode::kTimeout, "kvtierd not ready after 10 s:\n" + log().substr(log_before));
}

Result<int> DaemonProcess::StartSecondInstance() {
  auto p = Process::Spawn({KvtierdPath(), "--config", config_path_}, log_path_);
  if (!p.ok()) return p.status();
  return p->Wait(std::chrono::seconds(10));
}

// A test built without a program's path finds it on PATH.
#ifndef KVTIERD_PATH
#define KVTIERD_PATH "kvtierd"
#endif
#ifndef KVTIER_TEST_WORKER_PATH
#define KVTIER_TEST_WORKER_PATH "kvtier-test-worker"
#endif
#ifndef KVTIER_GPU_WORKER_PATH
#define KVTIER_GPU_WORKER_PATH "kvtier-gpu-test-worker"
#endif

namespace {

std::string FromEnv(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : built;
}

}  // namespace

std::string KvtierdPath() { return FromEnv("KVTIERD", KVTIERD_PATH); }
std::string WorkerPath() { return FromEnv("KVTIER_TEST_WORKER", KVTIER_TEST_WORKER_PATH); }
std::string GpuWorkerPath() { return FromEnv("KVTIER_GPU_WORKER", KVTIER_GPU_WORKER_PATH); }

double JsonNumber(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const size_t at = line.find(needle);
  if (at == std::string::npos) return -1;
  return std::strtod(line.c_str() + at + needle.size(), nullptr);
}

bool JsonTrue(const std::string& line, const std::string& key) {
  return line.find("\"" + key + "\":true") != std::string::npos;
}

}  // namespace kvtier::testing
