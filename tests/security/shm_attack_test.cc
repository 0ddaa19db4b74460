// Attacks on kvtierd's shared memory by a client in the allowed group: what
// the descriptors it is handed let it do to the segments the daemon trusts,
// squatted names in /dev/shm and the socket's directory, and an impostor on the
// socket. The daemon must stay up, keep serving others, and serve no byte it
// did not write.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "attack.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/shm_segment.h"
#include "process.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::RawConnection;
using testing::RunAs;

constexpr uint32_t kSquatterUid = 4260;

std::vector<TokenId> Tokens(uint32_t blocks, uint32_t seed) {
  std::vector<TokenId> t(size_t{blocks} * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(seed * 100000 + i);
  return t;
}

Result<std::unique_ptr<Client>> Connect(const std::string& socket, const std::string& tenant = "victim") {
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "shm-attack-test";
  o.tenant = tenant;
  o.reconnect = false;
  return Client::Connect(o);
}

std::byte Pattern(uint32_t block, size_t i) { return static_cast<std::byte>((block * 131 + i * 7) & 0xff); }

// Commits `blocks` blocks of a known pattern under `session`.
Status CommitPattern(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
  const uint32_t blocks = static_cast<uint32_t>(tokens.size() / c.block_tokens());
  auto w = c.Allocate(blocks);
  if (!w.ok()) return w.status();
  for (uint32_t b = 0; b < blocks; ++b) {
    for (size_t i = 0; i < w->slot_bytes(); ++i) w->data(b)[i] = Pattern(b, i);
  }
  auto r = c.Commit(*w, session, BlockKey{}, 0, tokens);
  return r.ok() ? Status::Ok() : r.status();
}

// Acquires the session's prefix and checks every byte; the number of blocks
// served, or -1 on a wrong byte.
int VerifiedBlocks(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
  auto l = c.Acquire(session, tokens);
  if (!l.ok() || !l->Wait(std::chrono::seconds(10)).ok()) return -2;
  for (size_t b = 0; b < l->size(); ++b) {
    for (size_t i = 0; i < l->slot_bytes(); ++i) {
      if (l->block(b).data[i] != Pattern(static_cast<uint32_t>(b), i)) return -1;
    }
  }
  return static_cast<int>(l->size());
}

bool IsRoot() { return ::geteuid() == 0; }

class ShmAttack : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log(); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  DaemonProcess daemon_{testing::kSmallDaemonConfig};
};

// A hostile client gets the same descriptors as every worker. Through them it
// can neither write what the daemon reads (index, fences, host tier) nor
// resize any segment (the truncate that killed the daemon with SIGBUS).
TEST_F(ShmAttack, TheDescriptorsAClientGetsCannotWriteOrResizeWhatTheDaemonTrusts) {
  auto victim = Connect(daemon_.socket());
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const auto tokens = Tokens(8, 1);
  ASSERT_TRUE(CommitPattern(**victim, "chat", tokens).ok());
  ASSERT_EQ((*victim)->Demote("chat").status().code(), StatusCode::kOk);  // Some blocks in the host tier too.

  auto c = RawConnection::Open(daemon_.socket());
  ASSERT_TRUE(c.ok());
  std::vector<int> fds;
  auto w = c->Hello("attacker", &fds);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(fds.size(), 4u) << "gpu pool, host pool, index, fences";
  const char* names[] = {"gpu pool", "host pool", "index", "fences"};
  for (size_t i = 0; i < fds.size(); ++i) {
    SCOPED_TRACE(names[i]);
    struct stat st {};
    ASSERT_EQ(::fstat(fds[i], &st), 0);
    const size_t bytes = static_cast<size_t>(st.st_size);
    EXPECT_NE(::ftruncate(fds[i], 0), 0) << "shrinking would SIGBUS the daemon";
    EXPECT_NE(::ftruncate(fds[i], static_cast<off_t>(bytes) * 2), 0);
    if (i == 0) continue;  // Workers write the GPU tier: the one writable mapping.
    EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0), MAP_FAILED);
    void* ro = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fds[i], 0);
    ASSERT_NE(ro, MAP_FAILED);
    EXPECT_NE(::mprotect(ro, bytes, PROT_READ | PROT_WRITE), 0);
    ::munmap(ro, bytes);
    const uint64_t huge = ~uint64_t{0};
    EXPECT_LT(::pwrite(fds[i], &huge, sizeof huge, 64), 0) << "e.g. forging fences' completed[]";
    EXPECT_NE(::fallocate(fds[i], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
    // A fresh descriptor of the same memory, opened read-write through /proc,
    // is no way around the seals.
    const int again = ::open(("/proc/self/fd/" + std::to_string(fds[i])).c_str(), O_RDWR);
    if (again >= 0) {
      EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0), MAP_FAILED);
      EXPECT_NE(::ftruncate(again, 0), 0);
      ::close(again);
    }
  }
  for (int fd : fds) ::close(fd);
  // Nothing of the instance is in /dev/shm to truncate or open by name.
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(e.path().filename().string().rfind(daemon_.instance(), 0), 0u) << e.path();
  }
  EXPECT_EQ(VerifiedBlocks(**victim, "chat", tokens), 8) << "every byte as written";
  EXPECT_TRUE((*victim)->Ping().ok());
}

// The names an attacker could squat in /dev/shm (the version-1 segment names,
// the locks and warm-restart files) neither stop kvtierd nor are used by it.
TEST(ShmSquat, NamesSquattedInDevShmNeitherBlockNorImpersonate) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to create the squatter's files as another uid";
  DaemonProcess d(std::string(testing::kSmallDaemonConfig) + "warm_restart: true\n");
  const std::string base = "/dev/shm/" + d.instance();
  std::vector<std::string> squatted;
  for (const char* suffix : {".fences", ".it.index", ".it.gpu", ".it.host", ".it.warm", ".it.warm.tmp"}) {
    squatted.push_back(base + suffix);
  }
  // A host pool of the right size and a manifest (here: junk), as if left by a
  // real kvtierd, but another uid's.
  const int rc = RunAs(kSquatterUid, [&] {
    for (const std::string& p : squatted) {
      const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
      if (fd < 0) return 1;
      const off_t size = p == base + ".it.host" ? off_t{1024} * 8192 : 4096;
      if (::ftruncate(fd, size) != 0) return 2;
      ::fchmod(fd, 0666);
      ::close(fd);
    }
    const int lock = ::open((base + ".lock").c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
    if (lock < 0) return 3;
    ::close(lock);
    return 0;
  });
  ASSERT_EQ(rc, 0);
  squatted.push_back(base + ".lock");
  std::vector<struct stat> before(squatted.size());
  for (size_t i = 0; i < squatted.size(); ++i) ASSERT_EQ(::stat(squatted[i].c_str(), &before[i]), 0);

  ASSERT_TRUE(d.Start().ok()) << d.log();
  auto c = Connect(d.socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto tokens = Tokens(4, 2);
  ASSERT_TRUE(CommitPattern(**c, "chat", tokens).ok());
  ASSERT_TRUE((*c)->Demote("chat").ok());
  EXPECT_EQ(VerifiedBlocks(**c, "chat", tokens), 4);
  EXPECT_NE(d.log().find("warm restart is off for this run"), std::string::npos) << d.log();
  d.Kill(SIGTERM);
  ASSERT_TRUE(d.Wait(std::chrono::seconds(10)).ok());
  // Untouched: same owner, size and contents (all zero).
  for (size_t i = 0; i < squatted.size(); ++i) {
    struct stat now {};
    ASSERT_EQ(::stat(squatted[i].c_str(), &now), 0) << squatted[i];
    EXPECT_EQ(now.st_uid, kSquatterUid) << squatted[i];
    EXPECT_EQ(now.st_size, before[i].st_size) << squatted[i];
    EXPECT_EQ(now.st_mtim.tv_sec, before[i].st_mtim.tv_sec) << squatted[i];
    ::unlink(squatted[i].c_str());
  }
}

// A squatted warm-restart host pool alone (the lock is free) turns warm
// restart off for that profile; a forged manifest is never adopted.
TEST(ShmSquat, AForgedManifestAndPoolOfAnotherUidAreNotAdopted) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to create the squatter's files as another uid";
  DaemonProcess d(std::string(testing::kSmallDaemonConfig) + "warm_restart: true\n");
  const std::string pool = "/dev/shm/" + d.instance() + ".it.host";
  const std::string manifest = "/dev/shm/" + d.instance() + ".it.warm";
  ASSERT_EQ(RunAs(kSquatterUid, [&] {
              for (const std::string& p : {pool, manifest}) {
                const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
                if (fd < 0 || ::ftruncate(fd, p == pool ? off_t{1024} * 8192 : 4096) != 0) return 1;
                ::close(fd);
              }
              return 0;
            }),
            0);
  ASSERT_TRUE(d.Start().ok()) << d.log();
  EXPECT_NE(d.log().find("belongs to uid " + std::to_string(kSquatterUid)), std::string::npos) << d.log();
  EXPECT_EQ(d.log().find("adopted"), std::string::npos) << d.log();
  auto c = Connect(d.socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = (*c)->ListSessions("");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->empty());
  const auto tokens = Tokens(2, 3);
  ASSERT_TRUE(CommitPattern(**c, "chat", tokens).ok());
  EXPECT_EQ(VerifiedBlocks(**c, "chat", tokens), 2);
  d.Kill(SIGTERM);
  ASSERT_TRUE(d.Wait(std::chrono::seconds(10)).ok());
  struct stat st {};
  ASSERT_EQ(::stat(manifest.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kSquatterUid) << "never written into";
  ::unlink(pool.c_str());
  ::unlink(manifest.c_str());
}

// Listens on `path` as the current process; accepts one connection and
// answers nothing. Returns the listening fd.
int Listen(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) return -1;
  return fd;
}

// A socket planted in a directory anyone may write (the old /tmp example) by
// another user: libkvtier refuses to talk to whoever serves it, before sending
// a byte; an explicit server_uid that does not match is refused too.
TEST(Impostor, AClientRefusesAServerThatIsNotKvtierdsUser) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to run the impostor as another uid";
  char tmpl[] = "/tmp/kvtier-impostor-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);  // Like /tmp.
  const std::string path = dir + "/kvtierd.sock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t impostor = ::fork();
  if (impostor == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kSquatterUid) != 0 || ::setuid(kSquatterUid) != 0) ::_exit(1);
    const int l = Listen(path);
    if (l < 0) ::_exit(2);
    ::chmod(path.c_str(), 0666);
    (void)!::write(ready[1], "x", 1);
    for (;;) {
      const int c = ::accept(l, nullptr, nullptr);
      char buf[4096];
      while (c >= 0 && ::read(c, buf, sizeof buf) > 0) {
        std::fprintf(stderr, "impostor: got a request\n");
        ::_exit(3);  // A request reached it: the client trusted it.
      }
      if (c >= 0) ::close(c);
    }
  }
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  ClientOptions o;
  o.socket_path = path;
  o.reconnect = false;
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("others may write"), std::string::npos) << c.status().message();
  o.server_uid = kSquatterUid + 1;  // Configured, and not whom it finds.
  c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("impostor"), std::string::npos) << c.status().message();
  int status = 0;
  EXPECT_EQ(::waitpid(impostor, &status, WNOHANG), 0) << "the impostor never saw a request";
  ::kill(impostor, SIGKILL);
  ::waitpid(impostor, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  std::filesystem::remove_all(dir);
}

// The real kvtierd passes: its uid is the socket's owner in a directory only
// it may write, or the configured server_uid.
TEST_F(ShmAttack, TheRealDaemonPassesTheServerCheck) {
  ClientOptions o;
  o.socket_path = daemon_.socket();
  o.reconnect = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  o.server_uid = ::geteuid();
  c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
}

}  // namespace
}  // namespace kvtier
