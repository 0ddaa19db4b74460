// Transport: connecting to the socket, one request frame and its reply at a
// time, what a reply may carry (descriptors), and what breaks the connection.
// The daemon's end is a ScriptedServer the test scripts on a thread of its own.
#include "transport.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "scripted_server.h"

namespace kvtier::client_internal {
namespace {

using std::chrono::milliseconds;

size_t OpenDescriptors() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return n;
}

class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.socket_path = server_.path();
    options_.connect_timeout = milliseconds(2000);
  }
  // Opens the transport; the server's end of it, or -1.
  int Connect() {
    const Status st = transport_.Open();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? server_.Accept() : -1;
  }

  ScriptedServer server_;
  ClientOptions options_;
  Transport transport_{options_};  // Reads options_ at each call.
};

TEST_F(TransportTest, ARoundTripSendsOneFrameAndReadsItsReply) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  std::jthread daemon([&] {
    for (uint64_t expect_id : {1u, 2u}) {
      auto req = ScriptedServer::Read(fd);
      ASSERT_TRUE(req.has_value());
      EXPECT_EQ(req->header.request_id, expect_id) << "each request its own id, in order";
      const auto* ping = std::get_if<wire::Ping>(&req->message);
      ASSERT_NE(ping, nullptr);
      ScriptedServer::Send(fd, req->header.request_id, wire::Pong{ping->nonce + 1});
    }
  });
  for (uint64_t nonce : {10u, 20u}) {
    auto reply = transport_.RoundTrip(wire::Ping{nonce});
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_TRUE(std::holds_alternative<wire::Pong>(*reply));
    EXPECT_EQ(std::get<wire::Pong>(*reply).nonce, nonce + 1);
  }
  daemon.join();
  EXPECT_TRUE(transport_.connected());
}

// A reply for request 0 (a frame the daemon could not attribute) is read as
// this request's; a reply naming another request breaks the connection.
TEST_F(TransportTest, AReplyToAnotherRequestClosesTheConnection) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  std::jthread daemon([&] {
    auto req = ScriptedServer::Read(fd);
    ASSERT_TRUE(req.has_value());
    ScriptedServer::Send(fd, 0, wire::ErrorResponse{StatusCode::kProtocolError, "what was that"});
    req = ScriptedServer::Read(fd);
    ASSERT_TRUE(req.has_value());
    ScriptedServer::Send(fd, req->header.request_id + 1, wire::Pong{});
    EXPECT_TRUE(ScriptedServer::ReadsEof(fd)) << "the client hung up";
  });
  auto reply = transport_.RoundTrip(wire::Ping{});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_TRUE(std::holds_alternative<wire::ErrorResponse>(*reply));
  EXPECT_TRUE(transport_.connected());
  reply = transport_.RoundTrip(wire::Ping{});
  EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(reply.status().message().find("reply to another request"), std::string::npos) << reply.status().message();
  EXPECT_FALSE(transport_.connected());
  daemon.join();
}

TEST_F(TransportTest, APeerThatHangsUpIsUnavailable) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  std::jthread daemon([&] {
    EXPECT_TRUE(ScriptedServer::Read(fd).has_value());
    ::shutdown(fd, SHUT_RDWR);
  });
  auto reply = transport_.RoundTrip(wire::Ping{});
  daemon.join();
  EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(reply.status().message().find("closed the connection"), std::string::npos) << reply.status().message();
  EXPECT_FALSE(transport_.connected());
}

TEST_F(TransportTest, AMalformedReplyIsAProtocolError) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  std::jthread daemon([&] {
    EXPECT_TRUE(ScriptedServer::Read(fd).has_value());
    ScriptedServer::SendBytes(fd, std::vector<uint8_t>(wire::kHeaderBytes, 0xAB));
  });
  auto reply = transport_.RoundTrip(wire::Ping{});
  daemon.join();
  EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError) << reply.status().ToString();
  EXPECT_FALSE(transport_.connected());
}

// A daemon that takes the request and never answers: kTimeout after
// request_timeout, and the connection is dropped (a late reply must not be
// read as the next request's).
TEST_F(TransportTest, ASilentPeerTimesOutAndTheConnectionIsDropped) {
  options_.request_timeout = milliseconds(50);
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  auto reply = transport_.RoundTrip(wire::Ping{});
  EXPECT_EQ(reply.status().code(), StatusCode::kTimeout) << reply.status().ToString();
  EXPECT_NE(reply.status().message().find("did not answer in time"), std::string::npos);
  EXPECT_FALSE(transport_.connected());
  EXPECT_TRUE(ScriptedServer::Read(fd).has_value()) << "the request was sent";
  EXPECT_TRUE(ScriptedServer::ReadsEof(fd));
}

// A request_timeout of 0 (or less) is the shortest wait, not none: the socket's
// own timeout of 0 would mean "never" and hang the caller on a silent peer.
TEST_F(TransportTest, ARequestTimeoutOfZeroTimesOutAtOnceRatherThanNever) {
  for (const milliseconds timeout : {milliseconds(0), milliseconds(-5)}) {
    options_.request_timeout = timeout;
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    // Should the client wait forever, the peer hangs up after its own bound,
    // so the test fails (kUnavailable) rather than hangs.
    bool asked = false;  // The request reached the peer, which never answers it.
    std::thread peer([fd, &asked] {
      asked = ScriptedServer::Read(fd).has_value();
      (void)ScriptedServer::ReadsEof(fd);
      ::shutdown(fd, SHUT_RDWR);
    });
    auto reply = transport_.RoundTrip(wire::Ping{});
    peer.join();
    ::close(fd);
    EXPECT_TRUE(asked) << timeout.count() << " ms: the request never reached the peer";
    EXPECT_EQ(reply.status().code(), StatusCode::kTimeout) << timeout.count() << " ms: " << reply.status().ToString();
  }
}

// Descriptors that come with a reply are handed over only to a caller that
// asks for them; otherwise the kernel discards them (none leaks into the process).
TEST_F(TransportTest, DescriptorsComeWithAReplyOnlyWhenAsked) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  const int memfd = ::memfd_create("kvtier-test-passed", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::pwrite(memfd, "kv", 2, 0), 2);
  const size_t before = OpenDescriptors();
  std::jthread daemon([&] {
    const int fds[] = {memfd, memfd};
    ASSERT_TRUE(ScriptedServer::Answer(fd, wire::Pong{1}, fds).has_value());
    ASSERT_TRUE(ScriptedServer::Answer(fd, wire::Pong{2}, fds).has_value());
    ASSERT_TRUE(ScriptedServer::Answer(fd, wire::Pong{3}).has_value());
  });
  auto reply = transport_.RoundTrip(wire::Ping{}, nullptr);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(OpenDescriptors(), before) << "descriptors nobody asked for were installed";

  std::vector<int> passed;
  reply = transport_.RoundTrip(wire::Ping{}, &passed);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(passed.size(), 2u);
  for (int p : passed) {
    char buf[2] = {};
    EXPECT_EQ(::pread(p, buf, 2, 0), 2);
    EXPECT_EQ(std::string(buf, 2), "kv") << "the descriptor the daemon sent";
    EXPECT_NE(p, memfd);
    ::close(p);
  }
  std::vector<int> none;
  reply = transport_.RoundTrip(wire::Ping{}, &none);
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(none.empty());
  daemon.join();
  EXPECT_EQ(OpenDescriptors(), before);
  ::close(memfd);
}

// A reply larger than the receive buffer arrives whole, and a reply already
// buffered behind another is read by the next round trip.
TEST_F(TransportTest, RepliesArriveWholeWhateverTheirSizeOrTheirSegments) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  wire::AllocateResponse big;
  big.lease_id = 99;
  for (uint32_t i = 0; i < 100000; ++i) big.slots.push_back(i * 3);
  std::jthread daemon([&] {
    ASSERT_TRUE(ScriptedServer::Answer(fd, big).has_value());
    auto req = ScriptedServer::Read(fd);
    ASSERT_TRUE(req.has_value());
    std::vector<uint8_t> two = wire::EncodeFrame(req->header.request_id, wire::Pong{1});
    wire::AppendFrame(two, req->header.request_id + 1, wire::Pong{2});
    ScriptedServer::SendBytes(fd, two);
    EXPECT_TRUE(ScriptedServer::Read(fd).has_value()) << "the third request is sent, though answered already";
  });
  auto reply = transport_.RoundTrip(wire::AllocateRequest{1});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_TRUE(std::holds_alternative<wire::AllocateResponse>(*reply));
  EXPECT_EQ(std::get<wire::AllocateResponse>(*reply), big);
  for (uint64_t nonce : {1u, 2u}) {
    reply = transport_.RoundTrip(wire::Ping{});
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(std::get<wire::Pong>(*reply).nonce, nonce);
  }
  daemon.join();
}

// Bytes the old connection left unread (behind a reply that broke it) are
// gone with it: the new connection's reply is read from the new connection.
TEST_F(TransportTest, WhatABrokenConnectionLeftUnreadIsNotReadOnTheNextOne) {
  int fd = Connect();
  ASSERT_GE(fd, 0);
  {
    std::jthread daemon([&] {
      auto req = ScriptedServer::Read(fd);
      ASSERT_TRUE(req.has_value());
      // A reply to another request, and behind it one that would pass for the next request's.
      std::vector<uint8_t> two = wire::EncodeFrame(req->header.request_id + 5, wire::Pong{1});
      wire::AppendFrame(two, req->header.request_id + 1, wire::Pong{666});
      ScriptedServer::SendBytes(fd, two);
    });
    EXPECT_EQ(transport_.RoundTrip(wire::Ping{}).status().code(), StatusCode::kProtocolError);
  }
  ASSERT_FALSE(transport_.connected());
  fd = Connect();
  ASSERT_GE(fd, 0);
  std::jthread daemon([&] { EXPECT_TRUE(ScriptedServer::Answer(fd, wire::Pong{7}).has_value()); });
  auto reply = transport_.RoundTrip(wire::Ping{});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(std::get<wire::Pong>(*reply).nonce, 7u);
}

// Open closes the connection it had before making a new one.
TEST_F(TransportTest, OpenAgainClosesTheOldConnection) {
  const int first = Connect();
  ASSERT_GE(first, 0);
  const int second = Connect();
  ASSERT_GE(second, 0);
  EXPECT_TRUE(ScriptedServer::ReadsEof(first));
  std::jthread daemon([&] { EXPECT_TRUE(ScriptedServer::Answer(second, wire::Pong{5}).has_value()); });
  auto reply = transport_.RoundTrip(wire::Ping{});
  daemon.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(std::get<wire::Pong>(*reply).nonce, 5u);
}

TEST_F(TransportTest, NothingListeningIsUnavailableOnceTheConnectTimeoutPassed) {
  options_.socket_path = server_.dir() + "/nobody.sock";
  options_.connect_timeout = milliseconds(20);
  const Status st = transport_.Open();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("is kvtierd running?"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(options_.socket_path), std::string::npos) << st.message();
  EXPECT_FALSE(transport_.connected());
}

TEST_F(TransportTest, ASocketPathTooLongIsInvalid) {
  options_.socket_path = "/tmp/" + std::string(sizeof(sockaddr_un::sun_path), 'x');
  const Status st = transport_.Open();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_FALSE(transport_.connected());
}

// $KVTIER_SERVER_UID must be a uid: anything else refuses the connection
// rather than trusting whoever answers.
TEST_F(TransportTest, AServerUidInTheEnvironmentThatIsNoUidIsRefused) {
  struct Unset {
    ~Unset() { ::unsetenv("KVTIER_SERVER_UID"); }
  } unset;  // Whatever fails below: the other tests run without it.
  for (const char* bad : {"12x", "4294967296", "-1"}) {
    ASSERT_EQ(::setenv("KVTIER_SERVER_UID", bad, 1), 0);
    const Status st = transport_.Open();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.ToString();
    EXPECT_NE(st.message().find("is not a uid"), std::string::npos) << st.message();
    EXPECT_FALSE(transport_.connected());
  }
  ASSERT_EQ(::setenv("KVTIER_SERVER_UID", std::to_string(::geteuid()).c_str(), 1), 0);
  EXPECT_TRUE(transport_.Open().ok()) << "a uid that is ours";
}

}  // namespace
}  // namespace kvtier::client_internal
