// Attacks on kvtierd's socket front end: replies never read, headers that
// announce what never comes, frames left incomplete, connection floods, the
// descriptor limit, and an oversized configuration at SIGHUP.
//
// Each runs against a real kvtierd and checks that it stays up, answers a
// normal client within a bound and keeps its VmRSS within a bound.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attack.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "process.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
using testing::DaemonProcess;
using testing::RawConnection;
using testing::StatOf;
using testing::VmRssKiB;

constexpr long kRssGrowthKiB = 64 * 1024;  // What an attack may cost the daemon.

#if defined(__SANITIZE_ADDRESS__)
#define KVTIER_ATTACK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVTIER_ATTACK_ASAN 1
#endif
#endif

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Result<std::unique_ptr<Client>> Connect(const DaemonProcess& d) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.client_name = "bystander";
  o.reconnect = false;
  return Client::Connect(o);
}

// A fresh client connects, says Hello and gets its Stats: how long that took.
Result<Clock::duration> Bystander(const DaemonProcess& d) {
  const auto start = Clock::now();
  auto c = Connect(d);
  if (!c.ok()) return c.status();
  auto s = (*c)->Stats();
  if (!s.ok()) return s.status();
  return Clock::now() - start;
}

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));  // After "pid (comm) ".
  std::string field;
  long ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stol(field);  // Fields 14 and 15: utime, stime.
  }
  return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A frame header announcing `payload` bytes of a Ping.
std::vector<uint8_t> Header(uint64_t request_id, uint32_t payload) {
  wire::FrameHeader h;
  h.type = wire::MessageType::kPing;
  h.request_id = request_id;
  h.payload_length = payload;
  std::vector<uint8_t> out(wire::kHeaderBytes);
  wire::EncodeHeader(h, std::span<uint8_t, wire::kHeaderBytes>(out.data(), wire::kHeaderBytes));
  return out;
}

class ServerAttack : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure() && daemon_) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_->log().c_str());
  }
  // Starts kvtierd on the small configuration plus `extra`; returns its VmRSS
  // once a client has been served (the baseline).
  long Start(const std::string& extra = "") {
#ifdef KVTIER_ATTACK_ASAN
    // ASan keeps up to 256 MiB of freed memory in quarantine, which would look
    // like growth; kvtierd (built alike) gets a small one.
    if (std::getenv("ASAN_OPTIONS") == nullptr) ::setenv("ASAN_OPTIONS", "quarantine_size_mb=16", 1);
#endif
    daemon_ = std::make_unique<DaemonProcess>(std::string(testing::kSmallDaemonConfig) + extra);
    const Status st = daemon_->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return -1;
    EXPECT_TRUE(Bystander(*daemon_).ok());
    return VmRssKiB(daemon_->pid());
  }
  // The daemon is up, a client is served within `bound`, and its VmRSS grew
  // less than kRssGrowthKiB since `baseline`.
  void ExpectHealthy(long baseline, std::chrono::milliseconds bound = std::chrono::milliseconds(1000)) {
    auto took = Bystander(*daemon_);
    ASSERT_TRUE(took.ok()) << took.status().ToString();
    EXPECT_LT(*took, bound) << "a client waited " << Seconds(*took) << " s";
    const long rss = VmRssKiB(daemon_->pid());
    EXPECT_LT(rss - baseline, kRssGrowthKiB) << "VmRSS " << baseline << " -> " << rss << " KiB";
    std::printf("  VmRSS %ld -> %ld KiB (%+ld); a client served in %.1f ms\n", baseline, rss, rss - baseline,
                Seconds(*took) * 1e3);
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// A client pipelines Stats requests and never reads a reply: kvtierd stops
// reading it once its unsent replies pass limits.max_reply_backlog_bytes, so
// the attacker's sends block, instead of the daemon growing without bound.
// Every request it did take is answered once the client reads.
TEST_F(ServerAttack, AClientThatNeverReadsItsRepliesIsNoLongerRead) {
  const long baseline = Start();
  ASSERT_GT(baseline, 0);
  auto c = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Hello("t").ok());

  std::vector<uint8_t> batch;
  for (int i = 0; i < 1000; ++i) wire::AppendFrame(batch, 100 + i, wire::StatsRequest{});
  const size_t frame = batch.size() / 1000;
  size_t sent = 0;
  auto last_progress = Clock::now();
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < until && Clock::now() - last_progress < std::chrono::milliseconds(300)) {
    const size_t off = sent % batch.size();
    const ssize_t n = ::send(c->fd(), batch.data() + off, batch.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      last_progress = Clock::now();
    } else {
      ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
      pollfd p{c->fd(), POLLOUT, 0};
      ::poll(&p, 1, 20);
    }
  }
  const bool blocked = Clock::now() - last_progress >= std::chrono::milliseconds(300);
  const size_t requests = sent / frame;
  std::printf("  %zu Stats requests (%zu KiB) taken before the daemon stopped reading\n", requests, sent >> 10);
  EXPECT_TRUE(blocked) << "the daemon kept reading a client that reads nothing";
  EXPECT_LT(requests, 100000u);
  ExpectHealthy(baseline);

  // Each complete request is answered, in order, once the client reads.
  const auto drain = Clock::now();
  for (size_t i = 0; i < requests; ++i) {
    auto r = c->Receive(std::chrono::seconds(5));
    ASSERT_TRUE(r.ok()) << "reply " << i << " of " << requests << ": " << r.status().ToString();
    ASSERT_NE(std::get_if<wire::StatsResponse>(&*r), nullptr) << "reply " << i;
  }
  std::printf("  %zu replies read in %.0f ms\n", requests, Seconds(Clock::now() - drain) * 1e3);
  EXPECT_NE(daemon_->log().find("ready: listening"), std::string::npos);
}

// The same client, left alone: a connection whose replies stay unread for
// limits.frame_timeout_ms is closed, so it cannot hold its backlog forever.
TEST_F(ServerAttack, AClientThatLeavesItsRepliesUnreadIsClosedAfterTheFrameTimeout) {
  const long baseline = Start("limits:\n  frame_timeout_ms: 300\n");
  ASSERT_GT(baseline, 0);
  auto c = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->Hello("t").ok());
  std::vector<uint8_t> batch;
  for (int i = 0; i < 1000; ++i) wire::AppendFrame(batch, 100 + i, wire::StatsRequest{});
  const auto start = Clock::now();
  size_t sent = 0;
  while (Clock::now() - start < std::chrono::seconds(5)) {  // Until the daemon stops reading it.
    const size_t off = sent % batch.size();
    const ssize_t n = ::send(c->fd(), batch.data() + off, batch.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;  // Closed already.
    pollfd p{c->fd(), POLLOUT | POLLRDHUP, 0};
    if (::poll(&p, 1, 50) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) break;
  }
  // Closed without this side reading a byte (reading would drain the backlog).
  bool closed = false;
  while (!closed && Clock::now() - start < std::chrono::seconds(8)) {
    pollfd p{c->fd(), POLLRDHUP, 0};
    closed = ::poll(&p, 1, 50) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  EXPECT_TRUE(closed) << "a client that reads nothing kept its connection";
  std::printf("  closed %.0f ms after the flood began\n", Seconds(Clock::now() - start) * 1e3);
  EXPECT_NE(daemon_->log().find("its replies went unread"), std::string::npos) << daemon_->log();
  ExpectHealthy(baseline);
}

// 40 welcomed connections each send a header announcing a 16 MiB payload (and
// a little of it): the daemon holds what arrived, not what was announced. The
// same header before Hello is refused at once (64 KiB may come before it).
TEST_F(ServerAttack, HeadersAnnouncingSixteenMiBReserveNothing) {
  const long baseline = Start();
  ASSERT_GT(baseline, 0);
  constexpr uint32_t kAnnounced = 16u << 20;
  std::vector<RawConnection> held;
  for (int i = 0; i < 40; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(c->Hello("t").ok());
    std::vector<uint8_t> bytes = Header(7, kAnnounced);
    bytes.resize(bytes.size() + 1000, 0xab);
    ASSERT_TRUE(c->SendBytes(bytes));
    held.push_back(std::move(*c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ExpectHealthy(baseline);
  for (auto& c : held) EXPECT_FALSE(c.ClosedByPeer(std::chrono::milliseconds(0)));

  for (int i = 0; i < 40; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE(c->SendBytes(Header(9, kAnnounced)));
    auto r = c->Receive(std::chrono::seconds(2));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto* err = std::get_if<wire::ErrorResponse>(&*r);
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->code, StatusCode::kResourceExhausted) << err->message;
    EXPECT_NE(err->message.find("before Hello"), std::string::npos) << err->message;
    EXPECT_TRUE(c->ClosedByPeer(std::chrono::seconds(1)));
  }
  ExpectHealthy(baseline);

  // A large frame that does come is still read whole, in pieces: 8 MiB of a
  // Ping that does not decode gets its error once the last byte is in.
  auto big = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(big->Hello("t").ok());
  std::vector<uint8_t> bytes = Header(11, 8u << 20);
  bytes.resize(bytes.size() + (8u << 20), 0x5a);
  ASSERT_TRUE(big->SendBytes(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1)));
  EXPECT_EQ(big->Receive(std::chrono::milliseconds(300)).status().code(), StatusCode::kTimeout);
  ASSERT_TRUE(big->SendBytes({bytes.back()}));
  auto r = big->Receive(std::chrono::seconds(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto* err = std::get_if<wire::ErrorResponse>(&*r);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->code, StatusCode::kProtocolError) << err->message;
}

// A welcomed connection that stops in the middle of a frame, or trickles it a
// byte at a time, is closed once limits.frame_timeout_ms passed since the frame
// began; an idle connection (no frame begun) is not.
TEST_F(ServerAttack, AFrameLeftIncompleteIsClosedAfterFrameTimeout) {
  const long baseline = Start("limits:\n  frame_timeout_ms: 300\n");
  ASSERT_GT(baseline, 0);
  auto idle = RawConnection::Open(daemon_->socket());
  auto stalled = RawConnection::Open(daemon_->socket());
  auto trickle = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(idle.ok() && stalled.ok() && trickle.ok());
  for (RawConnection* c : {&*idle, &*stalled, &*trickle}) ASSERT_TRUE(c->Hello("t").ok());

  std::vector<uint8_t> half = Header(5, 100);
  half.resize(half.size() + 50, 0);
  auto start = Clock::now();
  ASSERT_TRUE(stalled->SendBytes(half));
  ASSERT_TRUE(stalled->ClosedByPeer(std::chrono::seconds(2))) << "a stalled frame was never closed";
  const auto stalled_took = Clock::now() - start;
  EXPECT_GE(stalled_took, std::chrono::milliseconds(290));
  EXPECT_LT(stalled_took, std::chrono::milliseconds(1000));

  start = Clock::now();
  const std::vector<uint8_t> header = Header(6, 100);
  bool trickle_closed = false;
  for (size_t i = 0; i < 40 && !trickle_closed; ++i) {  // A byte every 50 ms: 2 s for 40 bytes.
    trickle_closed =
        !trickle->SendBytes({header[i % header.size()]}) || trickle->ClosedByPeer(std::chrono::milliseconds(50));
  }
  const auto trickle_took = Clock::now() - start;
  EXPECT_TRUE(trickle_closed) << "a frame trickled a byte at a time was never closed";
  EXPECT_LT(trickle_took, std::chrono::milliseconds(1000));
  std::printf("  a stalled frame closed after %.0f ms, a trickled one after %.0f ms (frame_timeout_ms 300)\n",
              Seconds(stalled_took) * 1e3, Seconds(trickle_took) * 1e3);

  // The idle connection is still served.
  ASSERT_TRUE(idle->Send(8, wire::Ping{}));
  auto pong = idle->Receive(std::chrono::seconds(1));
  ASSERT_TRUE(pong.ok()) << pong.status().ToString();
  EXPECT_NE(std::get_if<wire::Pong>(&*pong), nullptr);
  EXPECT_NE(daemon_->log().find("limits.frame_timeout_ms (300 ms)"), std::string::npos);
  ExpectHealthy(baseline);
}

// With max_clients: 4, kvtierd holds 4 + 16 connections (the 16 for peers
// still before their Hello); 30 more are closed at accept, counted, and logged
// a line per second at most.
TEST_F(ServerAttack, ConnectionsBeyondTheLimitAreRefusedAtAccept) {
  const long baseline = Start("limits:\n  max_clients: 4\n");
  ASSERT_GT(baseline, 0);
  std::vector<RawConnection> silent;
  for (int i = 0; i < 20; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    silent.push_back(std::move(*c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<pollfd> polls;
  for (const auto& c : silent) polls.push_back(pollfd{c.fd(), POLLIN, 0});
  EXPECT_EQ(::poll(polls.data(), polls.size(), 0), 0) << "a connection within the limit was closed";

  const auto start = Clock::now();
  for (int i = 0; i < 30; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto r = c->Receive(std::chrono::seconds(1));
    ASSERT_TRUE(r.ok()) << "connection " << i << " past the limit: " << r.status().ToString();
    const auto* err = std::get_if<wire::ErrorResponse>(&*r);
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->code, StatusCode::kResourceExhausted) << err->message;
    EXPECT_TRUE(c->ClosedByPeer(std::chrono::seconds(1))) << "connection " << i << " past the limit stayed open";
  }
  std::printf("  30 connections past the limit refused in %.0f ms\n", Seconds(Clock::now() - start) * 1e3);

  silent.resize(16);  // Room for one.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ExpectHealthy(baseline);
  auto admin = Connect(*daemon_);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  EXPECT_EQ(StatOf(**admin, "connections_over_limit"), 30);
  EXPECT_LE(Count(daemon_->log(), "refused a connection at accept"), 2u) << "not rate-limited";
}

// A process reconnecting in a loop (each Hello passes every segment's
// descriptor: the costliest request) is held to limits.connects_per_second
// per uid: past a burst of one second's worth, its connections are refused at
// accept, said so and counted; a client connected before keeps being served,
// and a second later the uid may connect again.
TEST_F(ServerAttack, ConnectionsFasterThanTheRateAreRefusedAtAccept) {
  const long baseline = Start("limits:\n  connects_per_second: 40\n");  // Start's bystander took one.
  ASSERT_GT(baseline, 0);
  auto established = Connect(*daemon_);
  ASSERT_TRUE(established.ok()) << established.status().ToString();
  int admitted = 0, refused = 0;
  const auto start = Clock::now();
  std::vector<RawConnection> conns;
  for (int i = 0; i < 200; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    conns.push_back(std::move(*c));
  }
  const double took = Seconds(Clock::now() - start);  // kvtierd accepted them meanwhile, or just after.
  for (auto& c : conns) {
    auto r = c.Receive(std::chrono::milliseconds(50));
    if (r.ok()) {
      const auto* err = std::get_if<wire::ErrorResponse>(&*r);
      ASSERT_NE(err, nullptr);
      EXPECT_EQ(err->code, StatusCode::kResourceExhausted) << err->message;
      EXPECT_NE(err->message.find("limits.connects_per_second"), std::string::npos) << err->message;
      ++refused;
    } else {
      ++admitted;  // Nothing said: it waits for its Hello.
    }
  }
  std::printf("  200 connections in %.2f s: %d admitted, %d refused (40 a second, a burst of 40)\n", took, admitted,
              refused);
  // The burst (40, less the two Start and this test connected) plus 40 a second.
  EXPECT_LE(admitted, 40 + static_cast<int>(took * 40) + 1);
  EXPECT_GE(refused, 200 - 40 - static_cast<int>(took * 40) - 1);
  auto stats = (*established)->Stats();
  ASSERT_TRUE(stats.ok()) << "a client connected before the flood: " << stats.status().ToString();
  EXPECT_EQ(StatOf(**established, "connections_too_fast"), refused);
  EXPECT_LE(Count(daemon_->log(), "refused a connection at accept"), 2u + static_cast<size_t>(took)) << "not rate-limited";
  conns.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ExpectHealthy(baseline);
}

// At RLIMIT_NOFILE, accept fails with EMFILE while connections stay queued:
// kvtierd waits (10 ms doubling to 1 s) instead of retrying at once, on its
// socket and on the metrics endpoint alike, so a flood of connections held
// open costs it little CPU and few log lines, and it serves again once the
// flood ends.
TEST_F(ServerAttack, AtTheDescriptorLimitAcceptBacksOff) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 64;  // kvtierd inherits it; its own descriptors take about 20.
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const long baseline = Start("metrics:\n  listen: 127.0.0.1:0\n");
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  ASSERT_GT(baseline, 0);
  const std::string serving = "metrics: serving http://127.0.0.1:";
  const std::string started = daemon_->log();
  ASSERT_NE(started.find(serving), std::string::npos) << started;
  const int port = std::stoi(started.substr(started.find(serving) + serving.size()));

  std::vector<RawConnection> flood;
  for (int i = 0; i < 100; ++i) {
    auto c = RawConnection::Open(daemon_->socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    flood.push_back(std::move(*c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // The daemon is at its limit now.
  // One scrape waits in the metrics endpoint's queue too.
  const int scrape = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(scrape, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(scrape, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const size_t log_before = daemon_->log().size();
  const double cpu_before = CpuSeconds(daemon_->pid());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu = CpuSeconds(daemon_->pid()) - cpu_before;
  const std::string log = daemon_->log();
  const size_t logged = log.size() - log_before;
  std::printf("  over 2 s of a flood at the descriptor limit: %.2f s of CPU, %zu bytes of log\n", cpu, logged);
  EXPECT_LT(cpu, 0.3) << "kvtierd spun on accept";
  EXPECT_LT(logged, 4096u) << log.substr(log_before, 2000);
  EXPECT_NE(log.find("accept: Too many open files"), std::string::npos) << "the flood never reached the limit";
  EXPECT_NE(log.find("metrics: accept: Too many open files"), std::string::npos) << log.substr(log_before, 2000);

  flood.clear();
  const auto end = Clock::now();
  Result<Clock::duration> served = Status(StatusCode::kUnavailable, "not tried");
  while (Clock::now() - end < std::chrono::seconds(5)) {
    served = Bystander(*daemon_);
    if (served.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  std::printf("  served again %.0f ms after the flood ended\n", Seconds(Clock::now() - end) * 1e3);
  EXPECT_LT(Clock::now() - end, std::chrono::seconds(3));
  // The scrape is taken up too (within the metrics endpoint's 1 s backoff).
  const std::string get = "GET /metrics HTTP/1.1\r\nHost: kvtier\r\n\r\n";
  ASSERT_EQ(::send(scrape, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  pollfd p{scrape, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 3000), 1) << "the scrape was never answered";
  char reply[32] = {};
  ASSERT_GT(::recv(scrape, reply, sizeof reply - 1, 0), 0);
  EXPECT_EQ(std::string(reply).rfind("HTTP/1.1 200", 0), 0u) << reply;
  ::close(scrape);
  ExpectHealthy(baseline);
}

// SIGHUP with an 8 MiB configuration: the file is refused unparsed (past 1 MiB),
// the running configuration stays, and the event loop never stalls.
TEST_F(ServerAttack, AnOversizedConfigIsRejectedAtReloadWithoutStalling) {
  const long baseline = Start();
  ASSERT_GT(baseline, 0);
  {
    std::ofstream out(daemon_->config_path(), std::ios::app);
    out << "padding:\n";
    const std::string item = "  - abcdefghij\n";
    for (size_t n = 0; n < (8u << 20); n += item.size()) out << item;
  }
  auto c = Connect(*daemon_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto start = Clock::now();
  daemon_->Kill(SIGHUP);
  std::chrono::nanoseconds worst{0};
  Clock::duration rejected_after{};
  while (Clock::now() - start < std::chrono::milliseconds(1500)) {
    auto rtt = (*c)->Ping();
    ASSERT_TRUE(rtt.ok()) << rtt.status().ToString();
    worst = std::max(worst, *rtt);
    if (rejected_after == Clock::duration{} && daemon_->log().find("reload rejected") != std::string::npos) {
      rejected_after = Clock::now() - start;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string log = daemon_->log();
  std::printf("  reload rejected after %.0f ms; the slowest Ping meanwhile took %.1f ms\n",
              Seconds(rejected_after) * 1e3, worst.count() / 1e6);
  ASSERT_NE(log.find("reload rejected, the running configuration stays"), std::string::npos) << log;
  EXPECT_NE(log.find("larger than the limit of 1048576 bytes"), std::string::npos) << log;
  EXPECT_LT(rejected_after, std::chrono::milliseconds(1000));
  EXPECT_LT(worst, std::chrono::milliseconds(250)) << "the event loop stalled";
  ExpectHealthy(baseline);
}

}  // namespace
}  // namespace kvtier
