// Attacks on sessions through the raw protocol: ids the daemon must refuse.
#include <gtest/gtest.h>

#include "attack.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::RawConnection;

class SessionAttack : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log(); }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_.log().c_str());
  }
  DaemonProcess daemon_{testing::kSmallDaemonConfig};
};

TEST_F(SessionAttack, ACommitWithoutSessionIdIsRefusedAndAnAnonymousAcquireCreatesNoSession) {
  auto c = RawConnection::Open(daemon_.socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Hello("t").ok());
  wire::AllocateRequest alloc;
  alloc.count = 1;
  ASSERT_TRUE(c->Send(2, alloc));
  auto granted = c->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  const auto* lease = std::get_if<wire::AllocateResponse>(&*granted);
  ASSERT_NE(lease, nullptr);
  wire::CommitRequest commit;  // No session id.
  commit.lease_id = lease->lease_id;
  commit.tokens.assign(16, 7);
  ASSERT_TRUE(c->Send(3, commit));
  auto r = c->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto* err = std::get_if<wire::ErrorResponse>(&*r);
  ASSERT_NE(err, nullptr) << "a commit needs a session id";
  EXPECT_EQ(err->code, StatusCode::kInvalidArgument) << err->message;

  wire::AcquireRequest a;  // A lookup outside any session, with nothing to look up.
  ASSERT_TRUE(c->Send(4, a));
  r = c->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(std::get_if<wire::AcquireResponse>(&*r), nullptr);

  ClientOptions o;
  o.socket_path = daemon_.socket();
  o.tenant = "t";
  auto admin = Client::Connect(o);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  auto sessions = (*admin)->ListSessions("t");
  ASSERT_TRUE(sessions.ok()) << sessions.status().ToString();
  EXPECT_TRUE(sessions->empty());
}

}  // namespace
}  // namespace kvtier
