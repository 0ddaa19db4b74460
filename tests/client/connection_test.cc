// Connection: the Hello that opens each connection, the Welcome mapped into a
// new generation, Call and CallOn (which reply type, which connection), and
// what is resent on a new connection when the old one is lost.
#include "connection.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "scripted_server.h"

namespace kvtier::client_internal {
namespace {

using std::chrono::milliseconds;

class ConnectionTest : public ::testing::Test {
 protected:
  ClientOptions Options() const {
    ClientOptions o;
    o.socket_path = server_.path();
    o.client_name = "connection-test";
    o.tenant = "tenant-a";
    o.profile = "fake";
    o.connect_timeout = milliseconds(2000);
    return o;
  }
  // Accepts the next connection and answers its Hello with `segs`' Welcome;
  // the server's end, or -1.
  int AcceptHello(const WelcomeSegments& segs) {
    const int fd = server_.Accept();
    if (fd < 0) return -1;
    const std::vector<int> fds = segs.fds();
    auto hello = ScriptedServer::Answer(fd, segs.welcome, fds);
    EXPECT_TRUE(hello.has_value() && std::holds_alternative<wire::Hello>(hello->message));
    return fd;
  }

  ScriptedServer server_;
};

TEST_F(ConnectionTest, WithReconnectOffACallNeverConnects) {
  ClientOptions o = Options();
  o.reconnect = false;
  Connection c(o);
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("reconnect is off"), std::string::npos) << reply.status().message();
  EXPECT_FALSE(server_.Pending()) << "it connected";
}

// A lease's request goes on the connection that granted it or nowhere: never
// to a new connection, which may be another daemon's.
TEST_F(ConnectionTest, CallOnAGenerationNeverConnects) {
  Connection c(Options());
  auto reply = c.CallOn<wire::OkResponse>(1, "read lease", wire::ReleaseRequest{5, std::nullopt});
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("the read lease ended with its connection to kvtierd"), std::string::npos)
      << reply.status().message();
  EXPECT_FALSE(server_.Pending()) << "it connected";
}

TEST_F(ConnectionTest, AHelloAnsweredByAWelcomeMakesAGeneration) {
  WelcomeSegments segs(/*instance_id=*/11);
  Connection c(Options());
  std::jthread daemon([&] {
    const int fd = server_.Accept();
    ASSERT_GE(fd, 0);
    auto hello = ScriptedServer::Read(fd);
    ASSERT_TRUE(hello.has_value());
    const auto* h = std::get_if<wire::Hello>(&hello->message);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->client_name, "connection-test");
    EXPECT_EQ(h->tenant, "tenant-a");
    EXPECT_EQ(h->profile, "fake");
    EXPECT_EQ(h->pid, static_cast<uint32_t>(::getpid()));
    const std::vector<int> fds = segs.fds();
    ScriptedServer::Send(fd, hello->header.request_id, segs.welcome, fds);
    EXPECT_TRUE(ScriptedServer::Answer(fd, wire::Pong{8}).has_value());
  });
  ASSERT_TRUE(c.Reconnect().ok());
  const auto att = c.attachment();
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->welcome.instance_id, 11u);
  EXPECT_TRUE(c.Current(att));
  auto reply = c.Call<wire::Pong>(wire::Ping{7}, Resend::kNo);
  daemon.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->message.nonce, 8u);
  EXPECT_EQ(reply->generation, 1u);
  EXPECT_EQ(reply->attachment, att) << "the reply is read against the connection it came on";
}

// A Hello refused (or answered by anything but a Welcome) connects nothing:
// the connection is closed at once, and the attachment stays what it was.
TEST_F(ConnectionTest, AHelloNotAnsweredByAWelcomeConnectsNothing) {
  Connection c(Options());
  for (const wire::Message& answer :
       {wire::Message(wire::ErrorResponse{StatusCode::kPermissionDenied, "tenant-a may not connect"}),
        wire::Message(wire::Pong{})}) {
    std::jthread daemon([&] {
      const int fd = server_.Accept();
      ASSERT_GE(fd, 0);
      ScriptedServer::Answer(fd, answer);
      EXPECT_TRUE(ScriptedServer::ReadsEof(fd)) << "the client kept a connection that has no Welcome";
    });
    const Status st = c.Reconnect();
    daemon.join();
    if (std::holds_alternative<wire::Pong>(answer)) {
      EXPECT_EQ(st.code(), StatusCode::kProtocolError);
      EXPECT_NE(st.message().find("other than Welcome"), std::string::npos) << st.message();
    } else {
      EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
      EXPECT_NE(st.message().find("tenant-a may not connect"), std::string::npos) << st.message();
    }
    EXPECT_EQ(c.attachment(), nullptr);
  }
}

// A reconnect whose Welcome cannot be mapped fails whole: the attachment and
// the generation stay the last good connection's.
TEST_F(ConnectionTest, AFailedReconnectKeepsTheLastAttachmentAndGeneration) {
  WelcomeSegments segs;
  Connection c(Options());
  std::jthread daemon([&] {
    int fd = AcceptHello(segs);
    ASSERT_GE(fd, 0);
    fd = server_.Accept();  // The reconnect: a Welcome without its descriptors.
    ASSERT_GE(fd, 0);
    ScriptedServer::Answer(fd, segs.welcome);
    EXPECT_TRUE(ScriptedServer::ReadsEof(fd));
    fd = AcceptHello(segs);
    ASSERT_GE(fd, 0);
    ScriptedServer::Answer(fd, wire::Pong{});
  });
  ASSERT_TRUE(c.Reconnect().ok());
  const auto att = c.attachment();
  const Status st = c.Reconnect();
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.ToString();
  EXPECT_EQ(c.attachment(), att);
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kNo);
  daemon.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->generation, 2u) << "the failed reconnect made no generation";
  EXPECT_NE(reply->attachment, att);
}

// An ErrorResponse becomes its Status; a reply of another type than the one
// wanted is a protocol error. Neither breaks the connection.
TEST_F(ConnectionTest, TheReplyMustBeOfTheTypeWanted) {
  WelcomeSegments segs;
  Connection c(Options());
  std::jthread daemon([&] {
    const int fd = AcceptHello(segs);
    ASSERT_GE(fd, 0);
    ScriptedServer::Answer(fd, wire::ErrorResponse{StatusCode::kNotFound, "no session 'x'"});
    ScriptedServer::Answer(fd, wire::OkResponse{});
    ScriptedServer::Answer(fd, wire::Pong{3});
  });
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  EXPECT_EQ(reply.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reply.status().message(), "no session 'x'");
  reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(reply.status().message().find("unexpected reply OkResponse, wanted Pong"), std::string::npos)
      << reply.status().message();
  reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  daemon.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->generation, 1u) << "the same connection throughout";
}

// A connection lost under a request that holds nothing of it (Resend::kYes)
// is made again and the request sent once more: a new generation, with the
// new daemon's segments. Leases of the old one end with it.
TEST_F(ConnectionTest, ALostConnectionIsMadeAgainAndTheRequestResent) {
  WelcomeSegments first(/*instance_id=*/1);
  WelcomeSegments second(/*instance_id=*/2);
  Connection c(Options());
  std::jthread daemon([&] {
    int fd = AcceptHello(first);
    ASSERT_GE(fd, 0);
    ScriptedServer::Answer(fd, wire::Pong{1});
    EXPECT_TRUE(ScriptedServer::Read(fd).has_value());
    ::shutdown(fd, SHUT_RDWR);  // kvtierd restarts.
    fd = AcceptHello(second);
    ASSERT_GE(fd, 0);
    auto resent = ScriptedServer::Answer(fd, wire::Pong{2});
    ASSERT_TRUE(resent.has_value());
    EXPECT_EQ(std::get<wire::Ping>(resent->message).nonce, 99u) << "the same request";
  });
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  const auto old = reply->attachment;
  EXPECT_EQ(reply->generation, 1u);
  reply = c.Call<wire::Pong>(wire::Ping{99}, Resend::kYes);
  daemon.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->message.nonce, 2u);
  EXPECT_EQ(reply->generation, 2u);
  EXPECT_EQ(reply->attachment->welcome.instance_id, 2u);
  EXPECT_FALSE(c.Current(old));
  EXPECT_TRUE(c.Current(reply->attachment));
  auto stale = c.CallOn<wire::OkResponse>(1, "lease", wire::ReleaseRequest{5, std::nullopt});
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable) << "lease 5 was the old daemon's";
}

// A request that must not be resent (Resend::kNo) fails with the connection;
// the next call connects again.
TEST_F(ConnectionTest, WithoutResendALostConnectionFailsTheCall) {
  WelcomeSegments segs;
  Connection c(Options());
  std::jthread daemon([&] {
    int fd = AcceptHello(segs);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(ScriptedServer::Read(fd).has_value());
    ::shutdown(fd, SHUT_RDWR);
  });
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kNo);
  daemon.join();
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable) << reply.status().ToString();
  EXPECT_FALSE(server_.Pending()) << "it connected again";
  std::jthread again([&] {
    const int fd = AcceptHello(segs);
    ASSERT_GE(fd, 0);
    ScriptedServer::Answer(fd, wire::Pong{4});
  });
  reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kNo);
  again.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->generation, 2u);
}

// A daemon that did not answer in time is not asked again (one call waits at
// most request_timeout); the connection is dropped and the next call makes it.
TEST_F(ConnectionTest, ARequestThatTimedOutIsNotResent) {
  ClientOptions o = Options();
  // Long enough for the Hello's reply on a loaded machine under a sanitizer; the Ping then waits it out.
  o.request_timeout = milliseconds(2000);
  WelcomeSegments segs;
  Connection c(o);
  int fd = -1;
  std::jthread daemon([&] { fd = AcceptHello(segs); });
  ASSERT_TRUE(c.Reconnect().ok());
  daemon.join();
  ASSERT_GE(fd, 0);
  auto reply = c.Call<wire::Pong>(wire::Ping{}, Resend::kYes);
  EXPECT_EQ(reply.status().code(), StatusCode::kTimeout) << reply.status().ToString();
  EXPECT_TRUE(ScriptedServer::Read(fd).has_value());
  EXPECT_TRUE(ScriptedServer::ReadsEof(fd)) << "the connection is dropped";
  EXPECT_FALSE(server_.Pending()) << "the request was resent";
}

}  // namespace
}  // namespace kvtier::client_internal
