// Multi-process tests: a real kvtierd, real worker processes, real shared memory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/wire.h"
#include "payload.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kConfig = kSmallDaemonConfig;

Result<std::string> RunWorker(const std::string& socket, const std::vector<std::string>& args,
                              std::chrono::milliseconds timeout = 20s) {
  std::vector<std::string> argv = {WorkerPath(), socket};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Process::Spawn(argv);
  if (!p.ok()) return p.status();
  auto line = p->ReadLine(timeout);
  auto rc = p->Wait(timeout);
  if (!line.ok()) return line.status();
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return Internal("worker exited " + std::to_string(*rc) + ": " + *line);
  return line;
}

std::map<std::string, double> StatsOf(Client& c) {
  std::map<std::string, double> out;
  auto s = c.Stats();
  if (s.ok()) {
    for (const auto& [k, v] : *s) out[k] = v;
  }
  return out;
}

std::unique_ptr<Client> Connect(const std::string& socket, std::chrono::milliseconds timeout = 2000ms) {
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "integration-test";
  o.connect_timeout = timeout;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log(); }
  void TearDown() override {
    const std::string log = daemon_.log();
    // A sanitizer build's daemon reports into its log, which the test owns.
    for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
      EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
    }
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", log.c_str());
  }
  DaemonProcess daemon_{kConfig};
};

// A client that never touches KV bytes (cachectl, monitoring) need not open the
// GPU tier: on the cuda backend that would load the driver and cost a context's
// GPU memory. It probes, acquires, lists and reads stats as any other; only
// its GPU-tier block addresses are null and it may not write.
TEST_F(IntegrationTest, AClientThatDoesNotOpenTheGpuTierStillProbesAcquiresAndReads) {
  auto writer = Connect(daemon_.socket());
  ASSERT_NE(writer, nullptr);
  const std::vector<TokenId> hot(64, 5), cold(64, 6);
  for (const auto* tokens : {&hot, &cold}) {
    auto w = writer->Allocate(4);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE(writer->Commit(*w, tokens == &hot ? "hot" : "cold", BlockKey{}, 0, *tokens).ok());
  }
  ASSERT_TRUE(writer->Demote("cold").ok());
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = writer->GetSession("cold");
    if (s.ok() && s->summary.host_blocks == 4) break;
    std::this_thread::sleep_for(5ms);
  }

  ClientOptions o;
  o.socket_path = daemon_.socket();
  o.client_name = "monitor";
  o.open_gpu = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Client& mon = **c;
  EXPECT_EQ(mon.Probe(hot), 4u);
  auto l = mon.Acquire("hot", hot, kvtier::Promote::kNo);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), 4u);
  for (const BlockRef& b : l->blocks()) {
    EXPECT_EQ(b.tier, Tier::kGpu);
    EXPECT_EQ(b.data, nullptr) << "the GPU tier is not mapped";
  }
  auto h = mon.Acquire("cold", cold, kvtier::Promote::kNo);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->size(), 4u);
  EXPECT_EQ(h->block(0).tier, Tier::kHost);
  EXPECT_NE(h->block(0).data, nullptr) << "the host tier is mapped (read-only)";
  EXPECT_TRUE(h->Wait(1s).ok());
  const Status refused = mon.Allocate(1).status();
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("open_gpu"), std::string::npos) << refused.message();
  EXPECT_EQ(StatsOf(mon)["sessions"], 2);
  EXPECT_TRUE(mon.ListSessions().ok());
}

// A CPU worker copies the prefix out of the pool anyway: with
// Promote::kAfterRead it reads host-tier hits where they lie at once, and
// kvtierd promotes them when the lease is released.
TEST_F(IntegrationTest, APromoteAfterReadAcquireReadsTheHostTierAtOnceAndPromotesAtRelease) {
  auto c = Connect(daemon_.socket());
  ASSERT_NE(c, nullptr);
  const std::vector<TokenId> tokens(64, 9);
  auto w = c->Allocate(4);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (size_t i = 0; i < 4; ++i) std::memset(w->data(i), 0x40 + static_cast<int>(i), w->slot_bytes());
  ASSERT_TRUE(c->Commit(*w, "chat", BlockKey{}, 0, tokens).ok());
  ASSERT_TRUE(c->Demote("chat").ok());
  const auto blocks_in = [&](Tier t) {
    auto s = c->GetSession("chat");
    return !s.ok() ? -1 : int(t == Tier::kHost ? s->summary.host_blocks : s->summary.gpu_blocks);
  };
  const auto wait_for = [&](Tier t) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (blocks_in(t) != 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return blocks_in(t) == 4;
  };
  ASSERT_TRUE(wait_for(Tier::kHost));

  auto l = c->Acquire("chat", tokens, Promote::kAfterRead);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), 4u);
  EXPECT_EQ(l->promoted(), 0u) << "nothing to wait for";
  for (size_t i = 0; i < 4; ++i) {
    const BlockRef& b = l->block(i);
    EXPECT_EQ(b.tier, Tier::kHost);
    const std::vector<std::byte> want(l->slot_bytes(), std::byte(0x40 + i));
    EXPECT_EQ(std::memcmp(b.data, want.data(), want.size()), 0) << "block " << i;
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(blocks_in(Tier::kHost), 4) << "nothing moves while the lease is held";
  ASSERT_TRUE(l->Release().ok());
  EXPECT_TRUE(wait_for(Tier::kGpu)) << "promoted once released";
  EXPECT_GE(StatsOf(*c)["promoted_blocks"], 4);
  EXPECT_EQ(StatsOf(*c)["after_read_promotions"], 4);
  EXPECT_EQ(StatsOf(*c)["after_read_given_up"], 0);
  auto again = c->Acquire("chat", tokens);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->promoted(), 0u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(again->block(i).tier, Tier::kGpu);
}

TEST_F(IntegrationTest, SecondProcessHitsThePrefixTheFirstCommitted) {
  auto a = RunWorker(daemon_.socket(), {"commit", "chat-a", "7", "8"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(JsonNumber(*a, "matched"), 0);
  EXPECT_EQ(JsonNumber(*a, "stored"), 8);
  // Another process, another session, the same tokens: every block hits, same bytes.
  auto b = RunWorker(daemon_.socket(), {"read", "chat-b", "7", "8"});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(JsonNumber(*b, "probed"), 8) << *b;  // Straight from shared memory.
  EXPECT_EQ(JsonNumber(*b, "matched"), 8) << *b;
  EXPECT_EQ(JsonNumber(*b, "leased"), 8) << *b;
  EXPECT_TRUE(JsonTrue(*b, "intact")) << *b;
  // A longer prompt with the same beginning hits the shared prefix only.
  auto c = RunWorker(daemon_.socket(), {"commit", "chat-c", "8", "4"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(JsonNumber(*c, "matched"), 0) << "another seed is another prompt";

  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  auto sessions = client->ListSessions();
  ASSERT_TRUE(sessions.ok());
  EXPECT_EQ(sessions->size(), 3u);
  auto stats = StatsOf(*client);
  EXPECT_EQ(stats["blocks"], 12);
  EXPECT_EQ(stats["gpu_used"], 12);
}

TEST_F(IntegrationTest, ConcurrentCommitsOfOnePrefixKeepOneCopy) {
  constexpr int kWorkers = 4;
  std::vector<Process> workers;
  for (int i = 0; i < kWorkers; ++i) {
    auto p = Process::Spawn({WorkerPath(), daemon_.socket(), "commit", "race-" + std::to_string(i), "99", "16"});
    ASSERT_TRUE(p.ok());
    workers.push_back(std::move(p).value());
  }
  double stored = 0, duplicates = 0, matched = 0;
  for (auto& w : workers) {
    auto line = w.ReadLine(20s);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    ASSERT_TRUE(JsonTrue(*line, "ok")) << *line;
    stored += JsonNumber(*line, "stored");
    duplicates += JsonNumber(*line, "duplicates");
    matched += JsonNumber(*line, "matched");
    auto rc = w.Wait(10s);
    ASSERT_TRUE(rc.ok() && *rc == 0);
  }
  EXPECT_EQ(stored, 16) << "exactly one copy of each block is published";
  EXPECT_EQ(stored + duplicates + matched, kWorkers * 16.0);
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  auto stats = StatsOf(*client);
  EXPECT_EQ(stats["blocks"], 16);
  EXPECT_EQ(stats["gpu_used"], 16) << "duplicate slots were freed";
  EXPECT_EQ(stats["write_leases"], 0);
}

TEST_F(IntegrationTest, KilledWorkerLosesItsLeasesAndSlots) {
  ASSERT_TRUE(RunWorker(daemon_.socket(), {"commit", "base", "5", "8"}).ok());
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  auto holder = Process::Spawn({WorkerPath(), daemon_.socket(), "hold", "victim", "5", "8", "32"});
  ASSERT_TRUE(holder.ok());
  auto line = holder->ReadLine(10s);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_EQ(JsonNumber(*line, "holding"), 8);
  auto during = StatsOf(*client);
  EXPECT_EQ(during["read_leases"], 1);
  EXPECT_EQ(during["write_leases"], 1);
  EXPECT_EQ(during["gpu_used"], 8 + 32);

  holder->Kill(SIGKILL);
  ASSERT_TRUE(holder->Wait(5s).ok());
  // The daemon notices the closed socket at once; give its loop a moment.
  std::map<std::string, double> after;
  for (int i = 0; i < 200; ++i) {
    after = StatsOf(*client);
    if (after["write_leases"] == 0 && after["read_leases"] == 0) break;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(after["read_leases"], 0);
  EXPECT_EQ(after["write_leases"], 0);
  EXPECT_EQ(after["gpu_used"], 8) << "the killed worker's uncommitted slots came back";
  // Everyone else is unaffected: the cached prefix is still there and intact.
  auto r = RunWorker(daemon_.socket(), {"read", "after", "5", "8"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(JsonNumber(*r, "matched"), 8);
  EXPECT_TRUE(JsonTrue(*r, "intact"));
}

TEST_F(IntegrationTest, ClientsReconnectAfterTheDaemonIsKilledAndRestarted) {
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  const uint64_t first = client->instance_id();
  const std::vector<TokenId> tokens(64, 17);
  auto w = client->Allocate(4);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(client->Commit(*w, "s", BlockKey{}, 0, tokens).ok());
  auto lease = client->Acquire("s", tokens);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->size(), 4u);

  daemon_.Kill(SIGKILL);
  ASSERT_TRUE(daemon_.Wait(5s).ok());
  // The dead daemon left its socket and segments behind; a new one replaces them.
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();

  const auto t0 = std::chrono::steady_clock::now();
  auto pong = client->Ping();
  const auto reconnect = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(pong.ok()) << pong.status().ToString();
  EXPECT_LT(reconnect, 1s);
  EXPECT_NE(client->instance_id(), first);
  // The old lease ended with the old daemon: a clear status, never a crash,
  // and never a wait on its fence or a stream wait on its events.
  const Status waited = lease->Wait(5s);
  EXPECT_EQ(waited.code(), StatusCode::kUnavailable) << waited.ToString();
  EXPECT_NE(waited.message().find("reconnected"), std::string::npos) << waited.message();
  EXPECT_EQ(lease->WaitOnStream(nullptr, 5s).code(), StatusCode::kUnavailable);
  const Status rel = lease->Release();
  EXPECT_EQ(rel.code(), StatusCode::kUnavailable) << rel.ToString();
  // The cache starts empty and works.
  auto again = client->Acquire("s", tokens);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->matched(), 0u);
  auto w2 = client->Allocate(4);
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  EXPECT_EQ(w->Release().code(), StatusCode::kUnavailable);
}

TEST_F(IntegrationTest, WorkersRideOutDaemonRestarts) {
  auto worker = Process::Spawn({WorkerPath(), daemon_.socket(), "loop", "3", "3.0"});
  ASSERT_TRUE(worker.ok());
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(400ms);
    daemon_.Kill(SIGKILL);
    ASSERT_TRUE(daemon_.Wait(5s).ok());
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  }
  auto line = worker->ReadLine(20s);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  EXPECT_TRUE(JsonTrue(*line, "ok")) << *line;
  EXPECT_GT(JsonNumber(*line, "turns"), 10) << *line;
  EXPECT_GE(JsonNumber(*line, "reconnects"), 1) << *line;
  EXPECT_EQ(JsonNumber(*line, "corrupt"), 0) << *line;
  auto rc = worker->Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
}

TEST_F(IntegrationTest, OneClientSharedByManyThreads) {
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 4;
  constexpr int kTurns = 60;
  std::atomic<int> corrupt{0}, failures{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int turn = 0; turn < kTurns; ++turn) {
        // Threads share conversation prefixes, so their hits and commits overlap;
        // each thread has its own sessions (a session is one conversation's turn order).
        const int conv = (turn + t) % 6;
        const std::string session = "conv-" + std::to_string(conv) + "-t" + std::to_string(t);
        std::vector<TokenId> tokens(16 * (2 + turn % 7));
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(conv * 1000 + i);
        const std::vector<BlockKey> keys = client->Keys(tokens);
        auto lease = client->Acquire(session, tokens);
        if (!lease.ok() || !lease->Wait(10s).ok()) {
          ++failures;
          continue;
        }
        hits += static_cast<int>(lease->size());
        for (size_t i = 0; i < lease->size(); ++i) {
          corrupt += PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes()) ? 0 : 1;
        }
        const uint32_t have = static_cast<uint32_t>(lease->size());
        if (have == keys.size()) continue;
        auto w = client->Allocate(static_cast<uint32_t>(keys.size()) - have);
        if (!w.ok()) {
          ++failures;
          continue;
        }
        for (size_t i = 0; i < w->size(); ++i) FillPayload(keys[have + i], w->data(i), w->slot_bytes());
        auto r = client->Commit(*w, session, have ? keys[have - 1] : BlockKey{}, have,
                                std::span<const TokenId>(tokens).subspan(size_t{have} * 16));
        if (!r.ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_GT(hits.load(), kThreads * kTurns);
  auto stats = StatsOf(*client);
  EXPECT_EQ(stats["read_leases"], 0) << "every RAII lease was released";
  EXPECT_EQ(stats["write_leases"], 0);
  EXPECT_EQ(stats["gpu_used"] + stats["host_used"], stats["blocks"]) << "no slot leaked";
}

// Writers saving as they decode (Client::Save): each thread's conversation
// starts on a prefix another thread may have cached (adopted by its last key,
// no Acquire), then saves one block at a time through the lease each save
// hands back. Every chain reads back intact, and nothing stays leased.
TEST_F(IntegrationTest, WritersSavingAsTheyDecodeAdoptPrefixesAndReuseTheirLease) {
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 3;
  constexpr uint32_t kPrompt = 4, kDecode = 12;
  std::atomic<int> failures{0}, adopted{0}, allocations{0};
  std::vector<std::vector<TokenId>> chats(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<TokenId>& tokens = chats[t];
      tokens.resize(16 * kPrompt);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(7000 + i);  // Shared prompt.
      const std::string session = "decode-" + std::to_string(t);
      std::optional<WriteLease> lease;
      BlockKey last;
      uint32_t have = 0;
      for (uint32_t step = 0; step <= kDecode; ++step) {
        if (step > 0) {  // One more block decoded: this thread's own tokens.
          for (int i = 0; i < 16; ++i) tokens.push_back(static_cast<TokenId>(100000 * (t + 1) + tokens.size()));
        }
        const std::vector<BlockKey> keys = client->Keys(tokens);
        const uint32_t total = static_cast<uint32_t>(keys.size());
        if (have == 0) {
          have = static_cast<uint32_t>(client->Probe(tokens));  // What another thread cached of the prompt.
          last = have ? keys[have - 1] : BlockKey{};
          if (have >= total) continue;
        }
        const uint32_t n = total - have;
        if (!lease || lease->id() == 0 || !lease->fresh() || lease->size() < n) {
          auto w = client->Allocate(n);
          if (!w.ok()) {
            ++failures;
            return;
          }
          ++allocations;
          lease = std::move(*w);
        }
        for (uint32_t i = 0; i < n; ++i) FillPayload(keys[have + i], lease->data(i), lease->slot_bytes());
        auto r = client->Save(*lease, session, last, have, std::span<const TokenId>(tokens).subspan(size_t{have} * 16),
                              SaveOptions{.adopt = true, .refill = 2});
        if (!r.ok()) {
          ADD_FAILURE() << r.status().ToString();
          ++failures;
          return;
        }
        adopted += static_cast<int>(r->adopted);
        if (r->last != keys.back()) ++failures;
        last = r->last;
        have = total;
      }
      if (lease && !lease->Release().ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LT(allocations.load(), kThreads * 3) << "the decode saves wrote into the slots each save handed back";
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<BlockKey> keys = client->Keys(chats[t]);
    auto lease = client->Acquire("check-" + std::to_string(t), chats[t]);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_TRUE(lease->Wait(10s).ok());
    ASSERT_EQ(lease->size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_TRUE(PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes()))
          << "thread " << t << " block " << i;
    }
    auto info = client->GetSession("decode-" + std::to_string(t));
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->chain.size(), keys.size()) << "the session holds its whole chain, adopted prefix included";
  }
  auto stats = StatsOf(*client);
  EXPECT_EQ(stats["write_leases"], 0);
  EXPECT_EQ(stats["read_leases"], 0);
  EXPECT_EQ(stats["gpu_used"] + stats["host_used"], stats["blocks"]) << "no slot leaked";
}

// A raw connection for sending arbitrary bytes.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConn() { ::close(fd_); }
  bool ok() const { return ok_; }
  void Send(const std::vector<uint8_t>& b) { (void)!::send(fd_, b.data(), b.size(), MSG_NOSIGNAL); }
  // The next frame, decoded; an error status at EOF.
  Result<wire::Message> Receive() {
    std::array<uint8_t, wire::kHeaderBytes> h{};
    if (!ReadAll(h.data(), h.size())) return Unavailable("closed");
    auto header = wire::DecodeHeader(std::span<const uint8_t, wire::kHeaderBytes>(h));
    if (!header.ok()) return header.status();
    std::vector<uint8_t> payload(header->payload_length);
    if (!ReadAll(payload.data(), payload.size())) return Unavailable("closed mid-frame");
    return wire::DecodePayload(*header, payload);
  }
  // True once the daemon closed the connection (EOF or reset), within 5 s.
  bool Closed() {
    uint8_t b;
    const ssize_t r = ::recv(fd_, &b, 1, 0);
    if (r > 0) std::fprintf(stderr, "unexpected byte 0x%02x after the error frame\n", b);
    return r == 0 || (r < 0 && errno == ECONNRESET);
  }

 private:
  bool ReadAll(uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t r = ::recv(fd_, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  int fd_ = -1;
  bool ok_ = false;
};

StatusCode ErrorCodeOf(const Result<wire::Message>& m) {
  if (!m.ok()) return StatusCode::kOk;
  const auto* e = std::get_if<wire::ErrorResponse>(&*m);
  return e == nullptr ? StatusCode::kOk : e->code;
}

TEST_F(IntegrationTest, BadFramesCloseOnlyTheirConnection) {
  auto good = Connect(daemon_.socket());
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Ping().ok());

  {  // Garbage instead of a header.
    RawConn c(daemon_.socket());
    ASSERT_TRUE(c.ok());
    c.Send(std::vector<uint8_t>(24, 0xAB));
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kProtocolError);
    EXPECT_TRUE(c.Closed());
  }
  {  // A wrong protocol version.
    RawConn c(daemon_.socket());
    auto frame = wire::EncodeFrame(1, wire::Ping{1});
    frame[4] = 9;
    c.Send(frame);
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kVersionMismatch);
    EXPECT_TRUE(c.Closed());
  }
  {  // A header declaring a 4 GiB payload: refused before any payload is read.
    RawConn c(daemon_.socket());
    auto frame = wire::EncodeFrame(1, wire::Ping{1});
    frame[16] = frame[17] = frame[18] = frame[19] = 0xFF;
    c.Send(frame);
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kProtocolError);
    EXPECT_TRUE(c.Closed());
  }
  {  // A well-formed frame before Hello.
    RawConn c(daemon_.socket());
    c.Send(wire::EncodeFrame(1, wire::StatsRequest{}));
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(c.Closed());
  }
  {  // A valid header with a payload that does not decode.
    RawConn c(daemon_.socket());
    c.Send(wire::EncodeFrame(1, wire::Hello{}));
    ASSERT_TRUE(c.Receive().ok());
    auto frame = wire::EncodeFrame(2, wire::AcquireRequest{"s", 1, {BlockKey{1, 2}}, std::vector<TokenId>(16, 3)});
    frame[wire::kHeaderBytes + 4 + 1 + 1] = 0xFF;  // Corrupt the key count.
    c.Send(frame);
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kProtocolError);
    EXPECT_TRUE(c.Closed());
  }
  {  // A client that says Hello with an unsupported protocol range.
    RawConn c(daemon_.socket());
    wire::Hello h;
    h.min_version = wire::kProtocolVersion + 1;
    h.max_version = wire::kProtocolVersion + 2;
    c.Send(wire::EncodeFrame(1, h));
    EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kVersionMismatch);
  }
  // The daemon still serves the well-behaved client, and new ones.
  ASSERT_TRUE(good->Ping().ok());
  auto r = RunWorker(daemon_.socket(), {"commit", "fine", "1", "2"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

// After a Hello, a request that is not allowed is answered with an error and
// the connection goes on: a second Hello, and a reply type sent as a request.
TEST_F(IntegrationTest, ASecondHelloAndNonRequestsAreRefusedWithoutClosing) {
  RawConn c(daemon_.socket());
  ASSERT_TRUE(c.ok());
  c.Send(wire::EncodeFrame(1, wire::Hello{}));
  auto welcome = c.Receive();
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  ASSERT_TRUE(std::holds_alternative<wire::Welcome>(*welcome));
  EXPECT_EQ(std::get<wire::Welcome>(*welcome).backend, wire::BackendKind::kHost);
  c.Send(wire::EncodeFrame(2, wire::Hello{}));
  EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kFailedPrecondition);
  c.Send(wire::EncodeFrame(3, wire::OkResponse{}));
  EXPECT_EQ(ErrorCodeOf(c.Receive()), StatusCode::kInvalidArgument);
  c.Send(wire::EncodeFrame(4, wire::Ping{7}));
  auto pong = c.Receive();
  ASSERT_TRUE(pong.ok()) << pong.status().ToString();
  ASSERT_TRUE(std::holds_alternative<wire::Pong>(*pong));
  EXPECT_EQ(std::get<wire::Pong>(*pong).nonce, 7u);
}

TEST_F(IntegrationTest, ASecondDaemonOnTheSameSocketRefuses) {
  auto rc = daemon_.StartSecondInstance();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 1);
  EXPECT_NE(daemon_.log().find("another kvtierd is running"), std::string::npos) << daemon_.log();
  auto client = Connect(daemon_.socket());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Ping().ok()) << "the first daemon still serves";
}

// Without warm restart kvtierd names nothing in /dev/shm (its segments are
// sealed memfds), and SIGTERM removes its socket.
TEST_F(IntegrationTest, SigtermRemovesTheSocketAndNothingIsNamedInDevShm) {
  const std::string socket = daemon_.socket();
  auto client = Connect(socket);
  ASSERT_NE(client, nullptr);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(e.path().filename().string().rfind(daemon_.instance(), 0), 0u) << e.path();
  }
  daemon_.Kill(SIGTERM);
  auto rc = daemon_.Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
  EXPECT_NE(::access(socket.c_str(), F_OK), 0);
}

// An Allocate that must wait for demotions is parked, not waited for on the
// daemon's thread: it is answered once the copies land, and counted.
TEST(RoomWaitTest, AnAllocateThatNeedsDemotionsIsAnsweredWhenTheyLand) {
  // 1 MiB blocks, watermarks that never act: only the Allocate makes room.
  DaemonProcess daemon(R"(backend: host
log_level: info
profiles:
  - name: big
    layers: 16
    kv_heads: 4
    head_dim: 64
    dtype: fp32
    block_tokens: 16
    gpu_blocks: 32
    host_blocks: 64
tiering:
  gpu_high_watermark: 1.0
  gpu_low_watermark: 1.0
  host_high_watermark: 1.0
  host_low_watermark: 1.0
)");
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  auto writer = Connect(daemon.socket());
  auto other = Connect(daemon.socket());
  ASSERT_TRUE(writer && other);
  const uint32_t bt = writer->block_tokens();
  std::vector<TokenId> tokens(32 * bt);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 1);
  {
    auto w = writer->Allocate(32);  // The whole GPU tier.
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const std::vector<BlockKey> keys = writer->Keys(tokens);
    for (uint32_t i = 0; i < 32; ++i) FillPayload(keys[i], w->data(i), w->slot_bytes());
    ASSERT_TRUE(writer->Commit(*w, "full", BlockKey{}, 0, tokens).ok());
  }
  EXPECT_EQ(StatsOf(*other)["room_waits"], 0);
  auto w = writer->Allocate(16);
  ASSERT_TRUE(w.ok()) << w.status().ToString() << "\n" << daemon.log();
  EXPECT_EQ(w->size(), 16u);
  const auto stats = StatsOf(*other);
  EXPECT_EQ(stats.at("room_waits"), 1) << "the Allocate was deferred until the demotions landed";
  EXPECT_EQ(stats.at("room_wait_timeouts"), 0);
  EXPECT_GE(stats.at("demoted_blocks"), 16);
  EXPECT_EQ(stats.at("dropped_blocks"), 0) << "room came from demotion: nothing was lost";
  ASSERT_TRUE(w->Release().ok());
  // The demoted blocks still hold their bytes; the whole prefix is served.
  const std::vector<BlockKey> keys = writer->Keys(tokens);
  auto lease = other->Acquire("reader", tokens);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->matched(), 32u);
  ASSERT_TRUE(lease->Wait(5s).ok());
  for (uint32_t i = 0; i < lease->size(); ++i) {
    EXPECT_TRUE(PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) << "block " << i;
  }
}

}  // namespace
}  // namespace kvtier::testing
