// systemd notifications as systemd receives them: datagrams on $NOTIFY_SOCKET.
#include "notify.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace kvtier::daemon {
namespace {

// A datagram socket standing in for systemd's, named in NOTIFY_SOCKET while it lives.
class FakeSystemd {
 public:
  FakeSystemd() {
    path_ = ::testing::TempDir() + "kvtier-notify-" + std::to_string(::getpid());
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~FakeSystemd() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // The next message, or "" after a second.
  std::string Next() {
    timeval tv{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(NotifyTest, SlowStartUpExtendsSystemdsStartTimeout) {
  if (!notify::Available()) GTEST_SKIP() << "built without libsystemd: notifications are compiled out";
  FakeSystemd systemd;
  ASSERT_TRUE(systemd.bound());
  notify::ExtendStartTimeout(std::chrono::seconds(60));
  EXPECT_EQ(systemd.Next(), "EXTEND_TIMEOUT_USEC=60000000");
  notify::SetStatus("pinning host pool 'default': 256 of 1024 MiB (25%)");
  EXPECT_EQ(systemd.Next(), "STATUS=pinning host pool 'default': 256 of 1024 MiB (25%)");
}

}  // namespace
}  // namespace kvtier::daemon
