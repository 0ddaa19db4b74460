// The reconnect race: one Client switched between two live kvtierd daemons
// while several threads acquire, allocate, write and commit through it.
//
// The client's socket path is a symlink; a switcher thread points it at the
// other daemon and calls Reconnect() every few milliseconds. Every lease must
// pair its daemon's slot numbers with that daemon's pools (checked by the
// bytes of every block a still-valid lease shows), and no lease id may reach a
// daemon that did not make it (a daemon answers a foreign id with kNotFound,
// or a commit of slots the lease does not hold with kInvalidArgument).
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "payload.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kThreads = 6;
constexpr int kPromptsPerThread = 8;
constexpr auto kRunFor = 8s;   // At least; longer (up to kMaxRun) until the race has been run enough.
constexpr auto kMaxRun = 40s;  // A loaded machine switches and commits slower.
constexpr auto kSwitchEvery = 25ms;

// What the worker threads saw, summed.
struct Tally {
  std::atomic<uint64_t> verified_blocks{0};  // Read through a lease that stayed valid throughout.
  std::atomic<uint64_t> corrupt_blocks{0};   // ... and held another block's bytes.
  std::atomic<uint64_t> commits{0};
  std::atomic<uint64_t> stale{0};        // Requests refused because their lease's connection was gone.
  std::atomic<uint64_t> foreign_ids{0};  // A lease id answered by a daemon that did not make it.
  std::atomic<uint64_t> unexpected{0};
  std::mutex mu;
  std::map<std::string, int> unexpected_samples;  // GUARDED_BY(mu)

  void Unexpected(const std::string& what, const Status& st) {
    ++unexpected;
    std::lock_guard lock(mu);
    ++unexpected_samples[what + ": " + st.ToString()];
  }
};

bool ForeignLeaseId(const Status& st) {
  return st.code() == StatusCode::kNotFound || (st.code() == StatusCode::kInvalidArgument &&
                                                st.message().find("not part of write lease") != std::string::npos);
}

// Points `link` at `target`, atomically (a connect() never finds it missing).
void PointLink(const std::string& link, const std::string& target) {
  const std::string tmp = link + ".next";
  std::filesystem::remove(tmp);
  std::filesystem::create_symlink(target, tmp);
  std::filesystem::rename(tmp, link);
}

class ClientReconnectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(a_.Start().ok()) << a_.log();
    ASSERT_TRUE(b_.Start().ok()) << b_.log();
    link_ = a_.dir() + "/switch.sock";
    PointLink(link_, a_.socket());
  }
  void TearDown() override {
    for (const DaemonProcess* d : {&a_, &b_}) {
      const std::string log = d->log();
      for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
        EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
      }
      if (HasFailure()) std::fprintf(stderr, "--- kvtierd log (%s) ---\n%s", d->socket().c_str(), log.c_str());
    }
  }

  DaemonProcess a_{kSmallDaemonConfig};
  DaemonProcess b_{kSmallDaemonConfig};
  std::string link_;
};

// One worker thread: its own prompts, acquired again and again, their
// uncached blocks written and committed.
void Work(Client& client, int thread, const std::atomic<bool>& stop, Tally& tally) {
  std::mt19937 rng(1000 + thread);
  const uint32_t bt = client.block_tokens();
  auto new_prompt = [&] {
    std::vector<TokenId> tokens((1 + rng() % 4) * bt);
    for (TokenId& t : tokens) t = rng() % 50000;
    return tokens;
  };
  std::vector<std::vector<TokenId>> prompts;
  for (int p = 0; p < kPromptsPerThread; ++p) prompts.push_back(new_prompt());
  while (!stop) {
    const int p = static_cast<int>(rng() % kPromptsPerThread);
    const std::string session = "t" + std::to_string(thread) + "-p" + std::to_string(p);
    const std::vector<TokenId> tokens = prompts[p];
    const std::vector<BlockKey> keys = client.Keys(tokens);

    auto lease = client.Acquire(session, tokens);
    if (!lease.ok()) {
      tally.Unexpected("acquire", lease.status());
      continue;
    }
    const size_t leased = lease->size();
    uint64_t corrupt = 0;
    if (leased > 0) {
      const Status waited = lease->Wait(5s);
      if (waited.code() == StatusCode::kUnavailable) {  // Reconnected since: the lease ended with its connection.
        ++tally.stale;
        continue;
      }
      if (!waited.ok()) tally.Unexpected("wait", waited);
      for (size_t i = 0; i < leased; ++i) {
        if (!PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) ++corrupt;
      }
    }
    // Only a lease its daemon still held when the bytes were read vouches for them.
    const Status released = lease->Release();
    if (released.ok()) {
      tally.verified_blocks += leased;
      tally.corrupt_blocks += corrupt;
    } else if (released.code() == StatusCode::kUnavailable) {
      ++tally.stale;
    } else if (ForeignLeaseId(released)) {
      ++tally.foreign_ids;
    } else {
      tally.Unexpected("release", released);
    }
    if (leased == keys.size()) {
      prompts[p] = new_prompt();  // Cached whole: the next turn of this session is new.
      continue;
    }

    const auto n = static_cast<uint32_t>(keys.size() - leased);
    auto w = client.Allocate(n);
    if (!w.ok()) {
      tally.Unexpected("allocate", w.status());
      continue;
    }
    for (uint32_t i = 0; i < n; ++i) FillPayload(keys[leased + i], w->data(i), w->slot_bytes());
    const BlockKey parent = leased == 0 ? BlockKey{} : keys[leased - 1];
    auto committed = client.Commit(*w, session, parent, static_cast<uint32_t>(leased),
                                   std::span<const TokenId>(tokens).subspan(leased * bt));
    if (committed.ok()) {
      ++tally.commits;
    } else if (committed.status().code() == StatusCode::kUnavailable) {
      ++tally.stale;
    } else if (ForeignLeaseId(committed.status())) {
      ++tally.foreign_ids;
    } else if (committed.status().code() == StatusCode::kFailedPrecondition) {
      // The session's prefix was acquired from the other daemon.
      ++tally.stale;
    } else {
      tally.Unexpected("commit", committed.status());
    }
    const Status given_back = w->Release();
    if (ForeignLeaseId(given_back)) {
      ++tally.foreign_ids;
    } else if (!given_back.ok() && given_back.code() != StatusCode::kUnavailable) {
      tally.Unexpected("release of a write lease", given_back);
    }
  }
}

TEST_F(ClientReconnectTest, LeasesKeepTheirDaemonWhileAnotherThreadReconnects) {
  ClientOptions o;
  o.socket_path = link_;
  o.client_name = "reconnect-race";
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();

  Tally tally;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::atomic<int> switches{0}, failed_switches{0};
  std::thread switcher([&] {
    bool on_a = true;
    while (!stop) {
      std::this_thread::sleep_for(kSwitchEvery);
      on_a = !on_a;
      PointLink(link_, on_a ? a_.socket() : b_.socket());
      if ((*client)->Reconnect().ok()) {
        ++switches;
      } else {
        ++failed_switches;
      }
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) workers.emplace_back([&, t] { Work(**client, t, stop, tally); });
  // The run races for real: many switches, and work done on both sides of them.
  auto raced_enough = [&] { return switches > 100 && tally.commits > 500u && tally.verified_blocks > 1000u; };
  for (;;) {
    const auto ran = std::chrono::steady_clock::now() - start;
    if ((ran >= kRunFor && raced_enough()) || ran >= kMaxRun) break;
    std::this_thread::sleep_for(100ms);
  }
  stop = true;
  for (auto& w : workers) w.join();
  switcher.join();

  std::printf("switches %d (failed %d); blocks verified %llu, corrupt %llu; commits %llu; stale %llu; "
              "foreign lease ids %llu; unexpected %llu\n",
              switches.load(), failed_switches.load(), static_cast<unsigned long long>(tally.verified_blocks.load()),
              static_cast<unsigned long long>(tally.corrupt_blocks.load()),
              static_cast<unsigned long long>(tally.commits.load()), static_cast<unsigned long long>(tally.stale.load()),
              static_cast<unsigned long long>(tally.foreign_ids.load()),
              static_cast<unsigned long long>(tally.unexpected.load()));
  for (const auto& [what, count] : tally.unexpected_samples) std::printf("  %dx %s\n", count, what.c_str());

  EXPECT_EQ(tally.corrupt_blocks, 0u) << "leased blocks held another block's bytes";
  EXPECT_EQ(tally.foreign_ids, 0u) << "lease ids reached a daemon that did not make them";
  EXPECT_EQ(tally.unexpected, 0u);
  EXPECT_EQ(failed_switches, 0);
  EXPECT_GT(switches, 100);
  EXPECT_GT(tally.commits, 500u);
  EXPECT_GT(tally.verified_blocks, 1000u);
  for (const DaemonProcess* d : {&a_, &b_}) {
    ClientOptions own;
    own.socket_path = d->socket();
    auto c = Client::Connect(own);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto stats = (*c)->Stats();
    ASSERT_TRUE(stats.ok());
    double blocks = 0;
    for (const auto& [name, value] : *stats) {
      if (name == "blocks") blocks = value;
    }
    EXPECT_GT(blocks, 0) << d->socket() << " never got a commit";
  }
}

}  // namespace
}  // namespace kvtier::testing
