// Attacks on leases: a tenant leasing the whole GPU tier past its quota, and
// holders that take every slot and then stop (a SIGSTOPped worker, a raw
// connection that never commits or releases) to starve everyone else.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attack.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/wire.h"
#include "payload.h"
#include "process.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using testing::DaemonProcess;
using testing::RawConnection;
using testing::StatOf;

constexpr uint32_t kGpuSlots = 256;  // kSmallDaemonConfig's GPU tier.
constexpr uint32_t kQuota = 16;
constexpr auto kReply = std::chrono::seconds(10);

// The small daemon with a lease timeout, tenant q (16 GPU blocks) and two
// tenants without quotas. The test runs as kvtierd's own user, an admin, so
// it may connect as any of them.
std::string Config(uint32_t lease_timeout_ms, const std::string& limits = "") {
  return std::string(testing::kSmallDaemonConfig) + "limits:\n  lease_timeout_ms: " + std::to_string(lease_timeout_ms) +
         "\n" + limits +
         "tenants:\n"
         "  - name: q\n    gpu_blocks: " +
         std::to_string(kQuota) +
         "\n"
         "  - name: hog\n"
         "  - name: victim\n";
}

std::vector<TokenId> Tokens(uint32_t blocks, uint32_t seed) {
  std::vector<TokenId> t(blocks * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(seed * 1000003u + i);
  return t;
}

Result<std::unique_ptr<Client>> Connect(const DaemonProcess& d, const std::string& tenant) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.client_name = "lease-attack-test";
  o.tenant = tenant;
  o.reconnect = false;
  return Client::Connect(o);
}

// Fills `lease`'s first slots with the payloads of `tokens`' blocks and commits
// them as `session`.
Status WriteAndCommit(Client& c, WriteLease& lease, const std::string& session, const std::vector<TokenId>& tokens) {
  const std::vector<BlockKey> keys = c.Keys(tokens);
  if (keys.size() > lease.size()) return InvalidArgument("lease too small");
  for (size_t i = 0; i < keys.size(); ++i) testing::FillPayload(keys[i], lease.data(i), lease.slot_bytes());
  auto r = c.Commit(lease, session, BlockKey{}, 0, tokens);
  if (!r.ok()) return r.status();
  if (r->stored != keys.size()) return Internal("stored " + std::to_string(r->stored) + " blocks");
  return Status::Ok();
}

Status CommitKnown(Client& c, const std::string& session, const std::vector<TokenId>& tokens) {
  auto w = c.Allocate(static_cast<uint32_t>(tokens.size() / c.block_tokens()));
  if (!w.ok()) return w.status();
  return WriteAndCommit(c, *w, session, tokens);
}

// Every block of `tokens` is cached and holds the bytes committed for it.
Status ExpectIntact(Client& c, const std::vector<TokenId>& tokens, Promote promote = Promote::kNow) {
  const std::vector<BlockKey> keys = c.Keys(tokens);
  auto lease = c.Acquire("", tokens, promote);
  if (!lease.ok()) return lease.status();
  if (lease->size() != keys.size()) {
    return Internal(std::to_string(lease->size()) + " of " + std::to_string(keys.size()) + " blocks cached");
  }
  KVTIER_RETURN_IF_ERROR(lease->Wait(kReply));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!testing::PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) {
      return Internal("block " + std::to_string(i) + " does not hold its bytes");
    }
  }
  return Status::Ok();
}

// One request on a raw connection and its reply.
Result<wire::Message> Ask(RawConnection& c, uint64_t id, const wire::Message& request) {
  if (!c.Send(id, request)) return Unavailable("kvtierd closed the connection");
  return c.Receive(kReply);
}

const wire::ErrorResponse* ErrorOf(const Result<wire::Message>& r) {
  return r.ok() ? std::get_if<wire::ErrorResponse>(&*r) : nullptr;
}

// Retries Allocate(count) until it succeeds or `limit` passes; the time it took.
Result<std::pair<WriteLease, milliseconds>> AllocateWhenRoom(Client& c, uint32_t count, milliseconds limit) {
  const auto start = steady_clock::now();
  for (;;) {
    auto w = c.Allocate(count);
    const auto took = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
    if (w.ok()) return std::pair<WriteLease, milliseconds>(std::move(w).value(), took);
    if (w.status().code() != StatusCode::kResourceExhausted || took > limit) return w.status();
    std::this_thread::sleep_for(milliseconds(25));
  }
}

// A reader that keeps its prompts leased: each Renew leases every prompt again
// (under session "s<i>", or none), then releases the previous leases, and
// checks the bytes of every block leased. Renew returns the blocks in the GPU
// tier, or -1 when a lease went wrong (`whole`: each must hold its whole prompt).
class RenewingReader {
 public:
  RenewingReader(std::vector<std::vector<TokenId>> prompts, bool sessions, bool whole)
      : prompts_(std::move(prompts)), held_(prompts_.size()), sessions_(sessions), whole_(whole) {}
  int Renew(Client& c) {
    int in_gpu = 0;
    std::vector<Lease> next;
    for (size_t s = 0; s < prompts_.size(); ++s) {
      auto lease = c.Acquire(sessions_ ? "s" + std::to_string(s) : "", prompts_[s]);
      if (!lease.ok() || !lease->Wait(kReply).ok()) return -1;
      const std::vector<BlockKey> keys = c.Keys(prompts_[s]);
      if (whole_ && lease->matched() != keys.size()) return -1;
      for (size_t i = 0; i < lease->size(); ++i) {
        if (!testing::PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes())) return -1;
        in_gpu += lease->block(i).tier == Tier::kGpu ? 1 : 0;
      }
      next.push_back(std::move(*lease));
    }
    for (Lease& l : held_) {
      if (l.size() > 0 && !l.Release().ok()) return -1;
    }
    held_ = std::move(next);
    return in_gpu;
  }

 private:
  const std::vector<std::vector<TokenId>> prompts_;
  std::vector<Lease> held_;
  const bool sessions_;
  const bool whole_;
};

class LeaseAttack : public ::testing::Test {
 protected:
  void Start(const std::string& config) {
    daemon_ = std::make_unique<DaemonProcess>(config);
    ASSERT_TRUE(daemon_->Start().ok()) << daemon_->log();
    rss_before_ = testing::VmRssKiB(daemon_->pid());
  }
  void TearDown() override {
    if (daemon_ == nullptr) return;
    if (!HasFailure()) {
      const long rss = testing::VmRssKiB(daemon_->pid());
      ASSERT_GT(rss, 0) << "kvtierd is gone";
      // The pools (10 MiB) are shared memory the daemon touches as it copies;
      // the bound is for anything that grows with the attack.
      EXPECT_LT(rss - rss_before_, 64 * 1024) << "kvtierd's resident memory grew by " << rss - rss_before_ << " KiB";
    }
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", daemon_->log().c_str());
  }
  // What a victim worker saw in 3 s beside a reader that renews its leases.
  struct Race {
    int failures = 0;        // Allocates refused before its first success,
    int failures_after = 0;  // and after it.
    int commits = 0;
    milliseconds first_success{-1};
    int renewals = 0;
    int bad_renewals = 0;  // Renewals that went wrong (renew returned -1).
    int min_in_gpu = 0;    // The fewest of the reader's blocks in the GPU tier after a renewal.
    double share_limited = 0;
    std::vector<TokenId> last;  // The victim's last commit.
  };
  // Runs `renew` (which returns the reader's blocks in the GPU tier, or -1)
  // every ~100 ms on a thread while `victim`, a worker, writes a new turn of
  // its session every ~50 ms (each commit replaces the last, so it holds a
  // few blocks at a time), for 3 s.
  Race RaceAVictim(Client& victim, const std::function<int()>& renew) {
    Race out;
    out.min_in_gpu = static_cast<int>(kGpuSlots);
    std::atomic<bool> stop{false};
    std::atomic<int> renewals{0}, bad_renewals{0}, min_in_gpu{static_cast<int>(kGpuSlots)};
    std::thread reader([&] {
      while (!stop.load()) {
        const int in_gpu = renew();
        if (in_gpu < 0) ++bad_renewals;
        if (in_gpu >= 0 && in_gpu < min_in_gpu.load()) min_in_gpu = in_gpu;
        ++renewals;
        std::this_thread::sleep_for(milliseconds(100));
      }
    });
    constexpr uint32_t kVictimBlocks = 4;
    const auto start = steady_clock::now();
    while (steady_clock::now() - start < std::chrono::seconds(3)) {
      auto w = victim.Allocate(kVictimBlocks);
      if (w.ok()) {
        out.last = Tokens(kVictimBlocks, 500 + out.commits);
        const Status put = WriteAndCommit(victim, *w, "v", out.last);
        EXPECT_TRUE(put.ok()) << put.ToString();
        if (out.commits++ == 0) {
          out.first_success = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
        }
      } else {
        EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status().ToString();
        ++(out.commits == 0 ? out.failures : out.failures_after);
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    stop = true;
    reader.join();
    out.renewals = renewals.load();
    out.bad_renewals = bad_renewals.load();
    out.min_in_gpu = min_in_gpu.load();
    out.share_limited = StatOf(victim, "share_limited");
    std::fprintf(stderr,
                 "victim: %d allocate failures before its first success (after %lld ms), %d after it, %d commits of "
                 "%u blocks in 3 s; reader: %d renewals, at least %d of %u blocks in the gpu tier; share_limited "
                 "%.0f\n",
                 out.failures, static_cast<long long>(out.first_success.count()), out.failures_after, out.commits,
                 kVictimBlocks, out.renewals, out.min_in_gpu, kGpuSlots, out.share_limited);
    return out;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  long rss_before_ = 0;
};

// Tenant q (gpu_blocks: 16) asks for the whole GPU tier at once, then slot by
// slot on two connections: it gets its quota and no more, while tenant victim
// still allocates, commits and reads back its blocks. Its charge goes when it
// disconnects.
TEST_F(LeaseAttack, ATenantWithAQuotaOf16CannotLeaseTheGpuTier) {
  Start(Config(30000));
  auto q1 = RawConnection::Open(daemon_->socket());
  auto q2 = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(q1.ok() && q2.ok());
  ASSERT_TRUE(q1->Hello("q").ok());
  ASSERT_TRUE(q2->Hello("q").ok());

  auto whole = Ask(*q1, 2, wire::AllocateRequest{kGpuSlots});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const wire::ErrorResponse* refused = ErrorOf(whole);
  ASSERT_NE(refused, nullptr) << "the whole tier was leased to a tenant with a quota of 16";
  EXPECT_EQ(refused->code, StatusCode::kResourceExhausted);
  EXPECT_NE(refused->message.find("tenant 'q'"), std::string::npos) << refused->message;
  EXPECT_NE(refused->message.find("its quota is 16 (tenants: gpu_blocks)"), std::string::npos) << refused->message;

  // Slot by slot, alternating connections, until refused (or far past the quota).
  uint32_t granted = 0, refusals = 0;
  for (uint64_t id = 3; id < 3 + 2 * kGpuSlots && refusals < 2; ++id) {
    RawConnection& c = id % 2 == 0 ? *q1 : *q2;
    auto r = Ask(c, id, wire::AllocateRequest{1});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (const auto* got = std::get_if<wire::AllocateResponse>(&*r)) {
      granted += static_cast<uint32_t>(got->slots.size());
    } else {
      const wire::ErrorResponse* e = ErrorOf(r);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->code, StatusCode::kResourceExhausted) << e->message;
      EXPECT_NE(e->message.find("16 of them slots of uncommitted write leases"), std::string::npos) << e->message;
      ++refusals;
    }
  }
  std::printf("tenant q (gpu_blocks: %u) was granted %u of %u GPU slots in write leases\n", kQuota, granted, kGpuSlots);
  EXPECT_EQ(granted, kQuota);

  // Another tenant is not affected: it leases and commits most of the tier.
  auto victim = Connect(*daemon_, "victim");
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const std::vector<TokenId> big = Tokens(kGpuSlots - kQuota, 1);
  ASSERT_TRUE(CommitKnown(**victim, "chat", big).ok());
  EXPECT_TRUE(ExpectIntact(**victim, big).ok());
  EXPECT_EQ(StatOf(**victim, "tenant.q.leased_blocks"), kQuota);
  EXPECT_EQ(StatOf(**victim, "tenant.q.gpu_blocks"), 0);
  EXPECT_EQ(StatOf(**victim, "tenant.victim.leased_blocks"), 0) << "its lease was committed and released";

  // Disconnecting gives q's slots and its quota back.
  q1->Close();
  q2->Close();
  const auto deadline = steady_clock::now() + std::chrono::seconds(5);
  while (StatOf(**victim, "tenant.q.leased_blocks") != 0 && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(StatOf(**victim, "tenant.q.leased_blocks"), 0);
  auto q = Connect(*daemon_, "q");
  ASSERT_TRUE(q.ok());
  const std::vector<TokenId> mine = Tokens(kQuota, 2);
  EXPECT_TRUE(CommitKnown(**q, "s", mine).ok());
  EXPECT_TRUE(ExpectIntact(**q, mine).ok());
  EXPECT_TRUE(ExpectIntact(**victim, big).ok());
}

// A worker (a forked child, tenant hog, no quota) leases every GPU slot,
// writes into them and is stopped (SIGSTOP) before it commits. After
// lease_timeout_ms another tenant gets room and commits; the stopped worker,
// continued, fails to commit cleanly ("expired"), and every block anyone
// reads holds the bytes committed for it.
TEST_F(LeaseAttack, AStoppedWorkerHoldingEveryGpuSlotLosesItsLeasesAfterTheTimeout) {
  constexpr uint32_t kTimeoutMs = 1000;
  constexpr uint32_t kChunk = 64;
  Start(Config(kTimeoutMs));
  const std::vector<TokenId> before = Tokens(32, 10), after = Tokens(kGpuSlots / 2, 11),
                             hog_tokens = Tokens(kChunk, 12);
  {
    auto victim = Connect(*daemon_, "victim");
    ASSERT_TRUE(victim.ok());
    ASSERT_TRUE(CommitKnown(**victim, "before", before).ok());
  }

  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t hog = ::fork();
  ASSERT_GE(hog, 0);
  if (hog == 0) {
    // The worker: every slot it can get, written, then stopped before its commits.
    ::close(report[0]);
    auto c = Connect(*daemon_, "hog");
    if (!c.ok()) ::_exit(2);
    std::vector<WriteLease> leases;
    uint32_t slots = 0;
    for (;;) {
      auto w = (*c)->Allocate(kChunk);
      if (!w.ok()) break;
      for (size_t i = 0; i < w->size(); ++i) std::memset(w->data(i), 0xee, w->slot_bytes());
      slots += static_cast<uint32_t>(w->size());
      leases.push_back(std::move(w).value());
    }
    if (::write(report[1], &slots, sizeof slots) != sizeof slots) ::_exit(3);
    ::raise(SIGSTOP);
    // Continued, long after the timeout: every commit fails, and says why.
    int wrong = 0;
    for (WriteLease& w : leases) {
      auto r = (*c)->Commit(w, "hog", BlockKey{}, 0, hog_tokens);
      if (r.ok() || r.status().code() != StatusCode::kFailedPrecondition ||
          r.status().message().find("expired") == std::string::npos) {
        std::fprintf(stderr, "hog commit: %s\n", r.ok() ? "ok" : r.status().ToString().c_str());
        ++wrong;
      }
    }
    ::_exit(wrong == 0 ? 0 : 10 + wrong);
  }
  ::close(report[1]);
  uint32_t hog_slots = 0;
  ASSERT_EQ(::read(report[0], &hog_slots, sizeof hog_slots), static_cast<ssize_t>(sizeof hog_slots));
  ::close(report[0]);
  const auto stopped_at = steady_clock::now();
  int status = 0;
  ASSERT_EQ(::waitpid(hog, &status, WUNTRACED), hog);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(hog_slots, kGpuSlots) << "the worker took the whole GPU tier (the victim's blocks were demoted)";

  auto victim = Connect(*daemon_, "victim");
  ASSERT_TRUE(victim.ok());
  auto now = (*victim)->Allocate(kChunk);
  ASSERT_FALSE(now.ok()) << "the stopped worker holds every slot";
  EXPECT_EQ(now.status().code(), StatusCode::kResourceExhausted) << now.status().ToString();
  EXPECT_EQ(StatOf(**victim, "leased_slots"), kGpuSlots);
  // The age has millisecond resolution, and all of the above can take less.
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_GT(StatOf(**victim, "oldest_lease_age_s"), 0);

  auto room = AllocateWhenRoom(**victim, kGpuSlots / 2, milliseconds(kTimeoutMs + 5000));
  ASSERT_TRUE(room.ok()) << room.status().ToString();
  std::printf("room for %u blocks %lld ms after the worker stopped (lease_timeout_ms: %u)\n", kGpuSlots / 2,
              static_cast<long long>(room->second.count()), kTimeoutMs);
  EXPECT_LT(steady_clock::now() - stopped_at, milliseconds(kTimeoutMs + 3000));
  ASSERT_TRUE(WriteAndCommit(**victim, room->first, "after", after).ok());
  room->first.Release();
  EXPECT_TRUE(ExpectIntact(**victim, after).ok());
  EXPECT_TRUE(ExpectIntact(**victim, before).ok()) << "demoted for the worker, never lost";
  // The worker's last lease was granted after the demotions its room took: wait
  // for it to expire too before the worker goes on.
  const auto deadline = steady_clock::now() + milliseconds(kTimeoutMs + 3000);
  while (StatOf(**victim, "write_leases_expired") < kGpuSlots / kChunk && steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(StatOf(**victim, "write_leases_expired"), kGpuSlots / kChunk);
  EXPECT_EQ(StatOf(**victim, "leased_slots"), 0);

  // The worker goes on: its commits fail cleanly, nothing of it is published.
  ASSERT_EQ(::kill(hog, SIGCONT), 0);
  ASSERT_EQ(::waitpid(hog, &status, 0), hog);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a commit of an expired lease did not fail with 'expired'";
  auto hog_view = Connect(*daemon_, "hog");
  ASSERT_TRUE(hog_view.ok());
  EXPECT_EQ((*hog_view)->Probe(hog_tokens), 0u);
  EXPECT_TRUE(ExpectIntact(**victim, after).ok());
  EXPECT_TRUE(ExpectIntact(**victim, before).ok());
  const std::string log = daemon_->log();
  EXPECT_NE(
      log.find("gpu slots back to the pool) and 0 read leases held longer than limits.lease_timeout_ms (1000 ms)"),
      std::string::npos)
      << "a line for the revocations";
  EXPECT_NE(log.find("committed lease"), std::string::npos);
  EXPECT_NE(log.find("which had expired"), std::string::npos);
}

// A raw connection pins a tenant's blocks (a read lease) and leases the rest
// of the GPU tier, then never commits or releases. After the timeout the pins
// end (the blocks are demoted for another tenant's allocation of the whole
// tier) and the slots come free; the raw client's commit and releases are
// answered with clear errors, its connection stays usable, and its expired
// leases still count against max_leases_per_client until it releases them.
TEST_F(LeaseAttack, ARawClientThatNeverLetsGoLosesItsPinsAndSlotsAfterTheTimeout) {
  constexpr uint32_t kTimeoutMs = 500;
  Start(Config(kTimeoutMs, "  max_leases_per_client: 8\n"));
  const std::vector<TokenId> pinned = Tokens(32, 20), whole = Tokens(kGpuSlots, 21);
  auto hog = Connect(*daemon_, "hog");
  ASSERT_TRUE(hog.ok());
  ASSERT_TRUE(CommitKnown(**hog, "h", pinned).ok());

  auto raw = RawConnection::Open(daemon_->socket());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw->Hello("hog").ok());
  wire::AcquireRequest pin;
  pin.flags = wire::kAcquirePromote;
  pin.keys = (*hog)->Keys(pinned);
  pin.tokens = pinned;
  auto pinned_reply = Ask(*raw, 2, pin);
  ASSERT_TRUE(pinned_reply.ok());
  const auto* read = std::get_if<wire::AcquireResponse>(&*pinned_reply);
  ASSERT_NE(read, nullptr);
  ASSERT_EQ(read->blocks.size(), 32u);
  auto rest = Ask(*raw, 3, wire::AllocateRequest{kGpuSlots - 32});
  ASSERT_TRUE(rest.ok());
  const auto* write = std::get_if<wire::AllocateResponse>(&*rest);
  ASSERT_NE(write, nullptr);

  auto victim = Connect(*daemon_, "victim");
  ASSERT_TRUE(victim.ok());
  EXPECT_EQ((*victim)->Allocate(1).status().code(), StatusCode::kResourceExhausted) << "every slot is pinned or leased";
  auto room = AllocateWhenRoom(**victim, kGpuSlots, milliseconds(kTimeoutMs + 5000));
  ASSERT_TRUE(room.ok()) << room.status().ToString();
  std::printf("room for the whole GPU tier %lld ms after the first refusal (lease_timeout_ms: %u)\n",
              static_cast<long long>(room->second.count()), kTimeoutMs);
  ASSERT_TRUE(WriteAndCommit(**victim, room->first, "all", whole).ok());
  room->first.Release();
  EXPECT_TRUE(ExpectIntact(**victim, whole).ok());
  EXPECT_TRUE(ExpectIntact(**hog, pinned, Promote::kNo).ok()) << "unpinned and demoted, never lost";
  EXPECT_EQ(StatOf(**victim, "read_leases_expired"), 1);
  EXPECT_EQ(StatOf(**victim, "write_leases_expired"), 1);
  ASSERT_TRUE((*victim)->Evict("all").ok());  // Room for what follows.

  wire::CommitRequest late;
  late.lease_id = write->lease_id;
  late.session = "late";
  late.tokens = Tokens(1, 22);
  late.slots = {write->slots[0]};
  const auto committed = Ask(*raw, 4, late);
  const wire::ErrorResponse* e = ErrorOf(committed);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, StatusCode::kFailedPrecondition);
  EXPECT_NE(e->message.find("expired"), std::string::npos) << e->message;
  const auto unpin = Ask(*raw, 5, wire::ReleaseRequest{read->lease_id, std::nullopt});
  e = ErrorOf(unpin);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, StatusCode::kNotFound);
  EXPECT_NE(e->message.find("read lease " + std::to_string(read->lease_id) + " expired after"), std::string::npos)
      << e->message;
  EXPECT_NE(e->message.find("may be another block's"), std::string::npos) << e->message;
  const auto unpin_again = Ask(*raw, 6, wire::ReleaseRequest{read->lease_id, std::nullopt});
  e = ErrorOf(unpin_again);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->message.find("is not yours"), std::string::npos) << "released: forgotten";
  EXPECT_EQ((*hog)->Probe(late.tokens), 0u);
  auto pong = Ask(*raw, 7, wire::Ping{7});
  ASSERT_TRUE(pong.ok());
  EXPECT_NE(std::get_if<wire::Pong>(&*pong), nullptr) << "the connection is still served";

  // The expired write lease still counts against max_leases_per_client (8):
  // the remembered revocations are bounded by what the client holds.
  uint32_t held = 1;
  for (uint64_t id = 8; held < 9; ++id) {
    auto r = Ask(*raw, id, wire::AllocateRequest{1});
    ASSERT_TRUE(r.ok());
    if (ErrorOf(r) != nullptr) {
      EXPECT_NE(ErrorOf(r)->message.find("limits.max_leases_per_client"), std::string::npos) << ErrorOf(r)->message;
      break;
    }
    ++held;
  }
  EXPECT_EQ(held, 8u);
  const auto unlease = Ask(*raw, 100, wire::ReleaseRequest{write->lease_id, std::nullopt});
  e = ErrorOf(unlease);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->code, StatusCode::kNotFound);
  auto again = Ask(*raw, 101, wire::AllocateRequest{1});
  ASSERT_TRUE(again.ok());
  EXPECT_NE(std::get_if<wire::AllocateResponse>(&*again), nullptr) << "released, the expired lease no longer counts";
  EXPECT_TRUE(ExpectIntact(**hog, pinned, Promote::kNo).ok());
}

// The adversarial probe's finding: with no quota configured (the default), a
// live tenant renewing read leases on its GPU blocks (each Acquire pins them
// again before the previous lease is released) made another tenant's Allocate
// fail for as long as it went on (239 failures in 12 s); the lease timeout only
// covers stopped holders. While another tenant waits for GPU room, a tenant
// without a quota now gives way down to its share (EngineOptions::
// gpu_share_window): its renewed leases stop before its blocks past the share,
// which are demoted once the older leases end. Alone, it keeps the whole tier.
// No tenants: configured, so the Hello's labels are the tenants.
TEST_F(LeaseAttack, ALiveReaderRenewingEveryGpuBlockGivesWayToAWaitingTenant) {
  constexpr uint32_t kChunk = 64;
  constexpr uint32_t kSessions = kGpuSlots / kChunk;
  Start(std::string(testing::kSmallDaemonConfig) +
        "tiering:\n  gpu_high_watermark: 1.0\n  gpu_low_watermark: 1.0\nlimits:\n  lease_timeout_ms: 30000\n");
  auto hog = Connect(*daemon_, "hog");
  ASSERT_TRUE(hog.ok()) << hog.status().ToString();
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t s = 0; s < kSessions; ++s) {
    prompts.push_back(Tokens(kChunk, 100 + s));
    ASSERT_TRUE(CommitKnown(**hog, "s" + std::to_string(s), prompts.back()).ok());
  }
  ASSERT_EQ(StatOf(**hog, "tenant.hog.gpu_blocks"), kGpuSlots);

  RenewingReader reader(prompts, /*sessions=*/true, /*whole=*/true);

  // Alone (nobody waits), the reader keeps the whole GPU tier.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(reader.Renew(**hog), static_cast<int>(kGpuSlots)) << "renewal " << i;

  // The reader renews every ~100 ms while the victim tries to Allocate+Commit.
  auto victim = Connect(*daemon_, "victim");
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const Race race = RaceAVictim(**victim, [&] { return reader.Renew(**hog); });
  ASSERT_GT(race.commits, 0) << "the victim never got a GPU slot in 3 s (" << race.failures << " failures)";
  EXPECT_EQ(race.failures_after, 0) << "once the reader gave way, the victim's turns found room";
  EXPECT_GT(race.renewals, 5) << "the reader kept renewing meanwhile";
  EXPECT_EQ(race.bad_renewals, 0) << "every lease of the reader holds its bytes";
  EXPECT_GE(race.min_in_gpu, static_cast<int>(kGpuSlots / 2)) << "the reader keeps its share";
  EXPECT_GT(race.share_limited, 0);
  EXPECT_TRUE(ExpectIntact(**victim, race.last).ok());
  for (const auto& p : prompts) EXPECT_TRUE(ExpectIntact(**hog, p, Promote::kNo).ok()) << "nothing of the reader's was lost";
}

// The same reader without sessions: it evicts them once its leases hold its
// blocks, and renews leases taken without a session id, so no session chain
// reaches its blocks. Before, the share's marks were taken from chains alone,
// and the victim's Allocate failed for as long as the reader renewed.
TEST_F(LeaseAttack, ASessionlessRenewingReaderGivesWayToAWaitingTenant) {
  constexpr uint32_t kChunk = 64;
  constexpr uint32_t kPrompts = kGpuSlots / kChunk;
  Start(std::string(testing::kSmallDaemonConfig) +
        "tiering:\n  gpu_high_watermark: 1.0\n  gpu_low_watermark: 1.0\nlimits:\n  lease_timeout_ms: 30000\n");
  auto hog = Connect(*daemon_, "hog");
  ASSERT_TRUE(hog.ok()) << hog.status().ToString();
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t s = 0; s < kPrompts; ++s) {
    prompts.push_back(Tokens(kChunk, 100 + s));
    ASSERT_TRUE(CommitKnown(**hog, "s" + std::to_string(s), prompts.back()).ok());
  }
  // Without a session id, each lease a prefix as long as what is still cached.
  RenewingReader reader(prompts, /*sessions=*/false, /*whole=*/false);
  ASSERT_EQ(reader.Renew(**hog), static_cast<int>(kGpuSlots));
  for (uint32_t s = 0; s < kPrompts; ++s) ASSERT_TRUE((*hog)->Evict("s" + std::to_string(s)).ok());
  ASSERT_EQ(StatOf(**hog, "tenant.hog.gpu_blocks"), kGpuSlots) << "its leases alone hold the whole tier";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(reader.Renew(**hog), static_cast<int>(kGpuSlots)) << "alone, it keeps it";

  auto victim = Connect(*daemon_, "victim");
  ASSERT_TRUE(victim.ok()) << victim.status().ToString();
  const Race race = RaceAVictim(**victim, [&] { return reader.Renew(**hog); });
  ASSERT_GT(race.commits, 0) << "the victim never got a GPU slot in 3 s (" << race.failures << " failures)";
  EXPECT_EQ(race.failures_after, 0) << "once the reader gave way, the victim's turns found room";
  EXPECT_GT(race.renewals, 5) << "the reader kept renewing meanwhile";
  EXPECT_EQ(race.bad_renewals, 0) << "every lease of the reader holds its bytes";
  // Marks take the ends of every prompt first: each keeps its beginning.
  EXPECT_GE(race.min_in_gpu, static_cast<int>(kGpuSlots / 2)) << "the reader keeps its share";
  for (const auto& p : prompts) {
    auto l = (*hog)->Acquire("", p, Promote::kNo);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_GE(l->matched(), kChunk / 2) << "the beginning of every prompt is still cached";
  }
  EXPECT_GT(race.share_limited, 0);
  EXPECT_TRUE(ExpectIntact(**victim, race.last).ok());
}

}  // namespace
}  // namespace kvtier
