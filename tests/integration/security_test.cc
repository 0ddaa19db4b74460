// Access control and tenant isolation against a real kvtierd: peers refused by
// uid at accept, tenants that never share sessions or blocks, admin-only
// commands, per-tenant quotas, and the modes of the socket and segments.
//
// Tests that need a second uid run the client in a forked child that drops to
// numeric ids (no passwd entry needed); they skip unless the test runs as root.
#include <dirent.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/wire.h"
#include "process.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint32_t kGroup = 4242;     // Owns the socket and segments.
constexpr uint32_t kAliceUid = 4243;  // Tenant "a".
constexpr uint32_t kBobUid = 4244;    // Tenant "b", requestable by group 4245.
constexpr uint32_t kMalloryUid = 4246;

std::string Config(const std::string& extra) {
  return std::string(testing::kSmallDaemonConfig) + "access:\n  group: \"4242\"\n  mode: 0660\n" +
         "tenants:\n"
         "  - name: a\n    users: [\"4243\"]\n"
         "  - name: b\n    users: [\"4244\"]\n    groups: [\"4245\"]\n    allow_requested: true\n"
         "  - name: q\n    gpu_blocks: 4\n    host_blocks: 6\n" +
         extra;
}

std::vector<TokenId> Tokens(uint32_t blocks, uint32_t seed) {
  std::vector<TokenId> t(blocks * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(seed * 100000 + i);
  return t;
}

Result<std::unique_ptr<Client>> Connect(const DaemonProcess& d, const std::string& tenant = "") {
  ClientOptions o;
  o.socket_path = d.socket();
  o.client_name = "security-test";
  o.tenant = tenant;
  o.reconnect = false;
  return Client::Connect(o);
}

// Commits `blocks` fresh blocks under `session`.
Status CommitChain(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
  auto w = c.Allocate(static_cast<uint32_t>(tokens.size() / c.block_tokens()));
  if (!w.ok()) return w.status();
  auto r = c.Commit(*w, session, BlockKey{}, 0, tokens);
  return r.ok() ? Status::Ok() : r.status();
}

double Stat(Client& c, const std::string& name) {
  auto s = c.Stats();
  if (!s.ok()) return -1;
  for (const auto& [k, v] : *s) {
    if (k == name) return v;
  }
  return -1;
}

// Runs `body` in a child with uid `uid`, gid `gid` and supplementary `groups`;
// returns its exit code (body's return value), or -1 if it died otherwise.
int RunAs(uint32_t uid, uint32_t gid, std::vector<gid_t> groups, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    ::_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    ::chmod(daemon_.dir().c_str(), 0755);  // Other uids must reach the socket to be refused by kvtierd.
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  static void RequireRoot() {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (setuid in a child)";
  }
  DaemonProcess daemon_{Config("")};
};

TEST_F(SecurityTest, APeerNotAllowedIsRefusedWithPermissionDenied) {
  RequireRoot();
  if (IsSkipped()) return;
  // In the socket's group, so the file mode lets it connect: kvtierd refuses it.
  const int rc = RunAs(kMalloryUid, kGroup, {kGroup}, [&] {
    auto c = Connect(daemon_);
    if (c.ok()) return 1;
    if (c.status().code() != StatusCode::kPermissionDenied) {
      std::fprintf(stderr, "got %s\n", c.status().ToString().c_str());
      return 2;
    }
    return c.status().message().find("uid 4246") != std::string::npos ? 0 : 3;
  });
  EXPECT_EQ(rc, 0);
  auto admin = Connect(daemon_);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  EXPECT_EQ(Stat(**admin, "refused_connections"), 1);
  EXPECT_EQ((*admin)->ns(), Namespace::Make((*admin)->profile().Fingerprint(), "default"))
      << "a peer in no tenant maps to the default one";

  // A tenant member is let in, as its tenant, whatever it asks for.
  const int member = RunAs(kAliceUid, kGroup, {kGroup}, [&] {
    auto c = Connect(daemon_);
    if (!c.ok()) return 1;
    // The namespace salt is the authenticated tenant, not what the client asked for.
    if ((*c)->ns() != Namespace::Make((*c)->profile().Fingerprint(), "a")) return 4;
    auto as_b = Connect(daemon_, "b");  // b is requestable, but only by its members.
    if (as_b.ok() || as_b.status().code() != StatusCode::kPermissionDenied) return 2;
    auto as_default = Connect(daemon_, "default");  // The default tenant is for peers in none.
    if (as_default.ok() || as_default.status().code() != StatusCode::kPermissionDenied) return 5;
    return CommitChain(**c, "chat", Tokens(2, 1)).ok() ? 0 : 3;
  });
  EXPECT_EQ(member, 0);
  auto sessions = (*admin)->ListSessions("a");
  ASSERT_TRUE(sessions.ok()) << sessions.status().ToString();
  ASSERT_EQ(sessions->size(), 1u);
  EXPECT_EQ((*sessions)[0].id, "chat");
  EXPECT_EQ((*sessions)[0].tenant, "a");

  // A member of b's group may request b (allow_requested).
  const int requested = RunAs(kMalloryUid, kGroup, {kGroup, 4245}, [&] {
    auto c = Connect(daemon_, "b");
    return c.ok() ? 0 : 1;
  });
  EXPECT_EQ(requested, 0);
}

TEST_F(SecurityTest, SameSessionIdInTwoTenantsNeverShares) {
  auto a = Connect(daemon_, "a");  // Root is an admin and may act as any tenant.
  auto b = Connect(daemon_, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_NE(NamespaceTag((*a)->ns()), NamespaceTag((*b)->ns()));
  const auto ta = Tokens(3, 1), tb = Tokens(2, 2);
  ASSERT_TRUE(CommitChain(**a, "chat", ta).ok());
  ASSERT_TRUE(CommitChain(**b, "chat", tb).ok());
  auto all = (*a)->ListSessions();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u) << "one engine session per tenant";
  auto info_a = (*a)->GetSession("chat");
  auto info_b = (*b)->GetSession("chat");
  ASSERT_TRUE(info_a.ok() && info_b.ok());
  EXPECT_EQ(info_a->summary.blocks, 3u);
  EXPECT_EQ(info_b->summary.blocks, 2u);

  // Probes (shared memory) and acquires across tenants miss: other namespace, other keys.
  EXPECT_EQ((*a)->Probe(ta), 3u);
  EXPECT_EQ((*b)->Probe(ta), 0u);
  auto lease = (*b)->Acquire("", ta);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->matched(), 0u);

  // Evicting "chat" in b leaves a's "chat".
  auto ev = (*b)->Evict("chat");
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  auto left = (*a)->GetSession("chat");
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(left->summary.blocks, 3u);
  EXPECT_EQ((*a)->Probe(ta), 3u);
}

TEST_F(SecurityTest, ANonAdminCannotActOnAnotherTenant) {
  RequireRoot();
  if (IsSkipped()) return;
  auto b = Connect(daemon_, "b");
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(CommitChain(**b, "chat", Tokens(2, 5)).ok());
  const int rc = RunAs(kAliceUid, kGroup, {kGroup}, [&]() -> int {
    auto c = Connect(daemon_);
    if (!c.ok()) return 10;
    auto denied = [](StatusCode code) { return code == StatusCode::kPermissionDenied; };
    if (auto r = (*c)->EvictTenant("b"); r.ok() || !denied(r.status().code())) return 11;
    if (auto r = (*c)->EvictAll(); r.ok() || !denied(r.status().code())) return 12;
    if (auto r = (*c)->Config(); r.ok() || !denied(r.status().code())) return 13;
    if (auto r = (*c)->ListSessions("b"); r.ok() || !denied(r.status().code())) return 14;
    // Its own view holds none of b's sessions, and b's "chat" is not its "chat".
    auto mine = (*c)->ListSessions();
    if (!mine.ok() || !mine->empty()) return 15;
    if (auto r = (*c)->Evict("chat"); r.ok() || r.status().code() != StatusCode::kNotFound) return 16;
    if ((*c)->Probe(Tokens(2, 5)) != 0) return 17;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  auto still = (*b)->GetSession("chat");
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(still->summary.blocks, 2u);
}

TEST_F(SecurityTest, QuotaDemotesTheTenantsOwnBlocksThenRefuses) {
  auto q = Connect(daemon_, "q");
  auto other = Connect(daemon_, "a");
  ASSERT_TRUE(q.ok() && other.ok());
  ASSERT_TRUE(CommitChain(**other, "big", Tokens(6, 9)).ok());
  ASSERT_TRUE(CommitChain(**q, "s1", Tokens(4, 1)).ok());
  EXPECT_EQ(Stat(**q, "tenant.q.gpu_blocks"), 4);
  // Four more: s1's blocks make way (demoted to the host tier), not a's.
  ASSERT_TRUE(CommitChain(**q, "s2", Tokens(4, 2)).ok());
  EXPECT_EQ(Stat(**q, "tenant.q.gpu_blocks"), 4);
  EXPECT_EQ(Stat(**q, "tenant.q.host_blocks"), 4);
  EXPECT_EQ(Stat(**q, "tenant.q.gpu_quota"), 4);
  auto big = (*other)->GetSession("big");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->summary.gpu_blocks, 6u) << "another tenant's blocks never pay for q's quota";
  // More than the whole quota in one allocation (write-lease slots count
  // against it): a clear error naming it.
  auto w = (*q)->Allocate(5);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("quota"), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find("'q'"), std::string::npos) << w.status().message();
}

// The socket gets the configured mode and group; the segments have no name
// at all (sealed memfds, passed to each client it lets in).
TEST_F(SecurityTest, TheSocketGetsTheConfiguredModeAndGroupAndNoSegmentIsNamed) {
  RequireRoot();  // chown to another group needs root (or membership).
  if (IsSkipped()) return;
  struct stat st {};
  ASSERT_EQ(::stat(daemon_.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kGroup);
  auto c = Connect(daemon_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  DIR* dir = ::opendir("/dev/shm");
  ASSERT_NE(dir, nullptr);
  const std::string prefix = daemon_.instance() + ".";
  while (dirent* e = ::readdir(dir)) EXPECT_NE(std::string(e->d_name).rfind(prefix, 0), 0u) << e->d_name;
  ::closedir(dir);
}

TEST(SecurityModeTest, Mode0600KeepsEveryoneButTheOwnerOut) {
  DaemonProcess d(std::string(testing::kSmallDaemonConfig) + "access:\n  mode: 0600\n");
  const mode_t old = ::umask(0);  // The modes must not depend on the umask.
  const Status started = d.Start();
  ::umask(old);
  ASSERT_TRUE(started.ok()) << d.log();
  struct stat st {};
  ASSERT_EQ(::stat(d.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// ---- Limits: each one refused with an error naming it ----

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log(); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  DaemonProcess daemon_{std::string(testing::kSmallDaemonConfig) +
                        "limits:\n  max_clients: 2\n  max_leases_per_client: 2\n  max_blocks_per_request: 8\n"
                        "  max_frame_bytes: 4KiB\n  max_sessions_per_tenant: 2\n  hello_timeout_ms: 100\n"};
};

TEST_F(LimitsTest, MaxClients) {
  auto a = Connect(daemon_), b = Connect(daemon_);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = Connect(daemon_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("at most 2 clients"), std::string::npos) << c.status().message();
}

TEST_F(LimitsTest, MaxLeasesPerClient) {
  auto c = Connect(daemon_);
  ASSERT_TRUE(c.ok());
  auto w1 = (*c)->Allocate(1), w2 = (*c)->Allocate(1);
  ASSERT_TRUE(w1.ok() && w2.ok());
  auto w3 = (*c)->Allocate(1);
  ASSERT_FALSE(w3.ok());
  EXPECT_EQ(w3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w3.status().message().find("limits.max_leases_per_client"), std::string::npos) << w3.status().message();
}

TEST_F(LimitsTest, MaxBlocksPerRequest) {
  auto c = Connect(daemon_);
  ASSERT_TRUE(c.ok());
  auto w = (*c)->Allocate(9);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("not in [1, 8]"), std::string::npos) << w.status().message();
}

TEST_F(LimitsTest, MaxSessionsPerTenant) {
  auto a = Connect(daemon_, "a"), b = Connect(daemon_, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(CommitChain(**a, "s1", Tokens(1, 1)).ok());
  ASSERT_TRUE(CommitChain(**a, "s2", Tokens(1, 2)).ok());
  const Status third = CommitChain(**a, "s3", Tokens(1, 3));
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("limits.max_sessions_per_tenant"), std::string::npos) << third.message();
  EXPECT_TRUE(CommitChain(**a, "s2", Tokens(1, 4)).ok()) << "an existing session is not a new one";
  EXPECT_TRUE(CommitChain(**b, "s1", Tokens(1, 5)).ok()) << "another tenant has its own count";
  ASSERT_TRUE((*a)->Evict("s1").ok());
  EXPECT_TRUE(CommitChain(**a, "s3", Tokens(1, 3)).ok());
}

TEST_F(LimitsTest, MaxFrameBytes) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, daemon_.socket().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  wire::FrameHeader h;
  h.type = wire::MessageType::kHello;
  h.request_id = 7;
  h.payload_length = 8192;  // Announced only: kvtierd refuses it from the header.
  std::array<uint8_t, wire::kHeaderBytes> out{};
  wire::EncodeHeader(h, out);
  ASSERT_EQ(::write(fd, out.data(), out.size()), static_cast<ssize_t>(out.size()));
  std::vector<uint8_t> in(64 * 1024);
  size_t got = 0;
  for (ssize_t n; (n = ::read(fd, in.data() + got, in.size() - got)) > 0;) got += static_cast<size_t>(n);
  ::close(fd);
  ASSERT_GE(got, wire::kHeaderBytes);
  auto rh = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(in.data(), wire::kHeaderBytes));
  ASSERT_TRUE(rh.ok());
  EXPECT_EQ(rh->request_id, 7u);
  auto msg = wire::DecodePayload(*rh, std::span<const uint8_t>(in.data() + wire::kHeaderBytes, rh->payload_length));
  ASSERT_TRUE(msg.ok());
  const auto* err = std::get_if<wire::ErrorResponse>(&*msg);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->code, StatusCode::kResourceExhausted);
  EXPECT_NE(err->message.find("limits.max_frame_bytes (4096)"), std::string::npos) << err->message;
}

TEST_F(LimitsTest, HelloTimeout) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, daemon_.socket().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{30, 0};  // Only a bound against hanging; kvtierd closes it after 100 ms.
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte = 0;
  EXPECT_EQ(::read(fd, &byte, 1), 0) << "a silent connection is closed (EOF)";
  ::close(fd);
  EXPECT_NE(daemon_.log().find("sent no Hello within limits.hello_timeout_ms (100 ms)"), std::string::npos);
  auto c = Connect(daemon_);  // A prompt client is unaffected.
  EXPECT_TRUE(c.ok()) << c.status().ToString();
}

}  // namespace
}  // namespace kvtier
