// Child processes for the integration tests: a real kvtierd and real workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::testing {

class Process {
 public:
  // Starts argv[0] with `argv`. stdout goes to a pipe this object reads;
  // stderr goes to `stderr_path` (appended) or is inherited when empty.
  static Result<Process> Spawn(const std::vector<std::string>& argv, const std::string& stderr_path = "");

  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  ~Process();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  // Next stdout line; kTimeout if none within `timeout`, kNotFound at EOF.
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);
  void Kill(int signal);
  // Exit code, or 128 + signal; kTimeout if it did not end in time.
  Result<int> Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string buffer_;
};

// A kvtierd on a private socket and instance name, with its log in a file.
class DaemonProcess {
 public:
  // Writes `config_yaml` + socket/instance lines into a fresh directory.
  explicit DaemonProcess(const std::string& config_body);
  ~DaemonProcess();

  // Starts kvtierd (with `extra_args` after --config) and waits for its ready
  // line (at most 10 s). It inherits this process's environment.
  Status Start(const std::vector<std::string>& extra_args = {});
  void Kill(int signal) { process_.Kill(signal); }
  pid_t pid() const { return process_.pid(); }
  Result<int> Wait(std::chrono::milliseconds timeout) { return process_.Wait(timeout); }
  // Starts a second kvtierd on the same config and returns its exit code.
  Result<int> StartSecondInstance();

  const std::string& socket() const { return socket_; }
  const std::string& instance() const { return instance_; }
  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  std::string log() const;
  // Removes every /dev/shm/<instance>.* segment. REQUIRES: the daemon is not
  // running. The destructor calls it.
  void RemoveSegments() const;

 private:
  std::string dir_, socket_, instance_, config_path_, log_path_;
  Process process_;
};

// The programs the tests start: $KVTIERD, $KVTIER_TEST_WORKER and
// $KVTIER_GPU_WORKER when set (a bundle run far from its build tree:
// scripts/gpu_bundle.sh), else the paths the build compiled in.
std::string KvtierdPath();
std::string WorkerPath();
std::string GpuWorkerPath();
// The number after "key": in a one-line JSON object; -1 if absent.
double JsonNumber(const std::string& line, const std::string& key);
bool JsonTrue(const std::string& line, const std::string& key);

}  // namespace kvtier::testing
