// LeaseTable: live leases by id (grant order), the counts of each kind, the
// lease timeout's revocations (oldest first, up to a work bound per call) and
// what is kept of a revoked lease until its holder releases it.
#include "lease_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "tenant_ledger.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using Clock = LeaseTable::Clock;

constexpr milliseconds kTimeout{30000};

class LeaseTableTest : public ::testing::Test {
 protected:
  // Grant stamps a lease with Clock::now(). These wait until the clock has
  // passed the newest grant first, so that each lease is granted strictly
  // later than the one before (what the timeout's prefix rule is about).
  LeaseId GrantWrite(std::vector<uint32_t> slots) {
    AfterNewest();
    return table_.Grant(WriteSlots{std::move(slots), &tenant_});
  }
  LeaseId GrantRead(std::vector<uint32_t> records, bool promote_after = false) {
    AfterNewest();
    return table_.Grant(ReadRecords{std::move(records), promote_after});
  }
  Clock::time_point GrantedAt(LeaseId id) const {
    std::optional<Clock::time_point> at;
    table_.ForEach([&](LeaseId i, const Lease& l) {
      if (i == id) at = l.granted;
    });
    EXPECT_TRUE(at.has_value()) << "lease " << id << " is not live";
    return at.value_or(Clock::time_point{});
  }
  std::vector<LeaseId> LiveIds() const {
    std::vector<LeaseId> ids;
    table_.ForEach([&](LeaseId id, const Lease&) { ids.push_back(id); });
    return ids;
  }
  // Revokes what has expired at `now`; returns the sizes of the leases handed
  // to `end`, in the order they came, and whether expired leases are left.
  std::pair<std::vector<size_t>, bool> Revoke(Clock::time_point now, size_t work_limit = SIZE_MAX) {
    std::vector<size_t> ended;
    const bool more = table_.RevokeExpired(now, kTimeout, work_limit, [&](Lease& l) { ended.push_back(l.size()); });
    return {ended, more};
  }

  TenantAccount tenant_;
  LeaseTable table_;

 private:
  void AfterNewest() {
    std::optional<Clock::time_point> newest;
    table_.ForEach([&](LeaseId, const Lease& l) { newest = l.granted; });
    if (!newest) return;
    while (Clock::now() <= *newest) {
    }
  }
};

TEST_F(LeaseTableTest, AnEmptyTableHoldsNothingAndRevokesNothing) {
  EXPECT_TRUE(table_.empty());
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.write_count(), 0u);
  EXPECT_EQ(table_.read_count(), 0u);
  EXPECT_FALSE(table_.OldestGrant().has_value());
  EXPECT_EQ(table_.next_id(), 1u) << "0 is no lease (ReadLease::id)";
  EXPECT_EQ(table_.FindWrite(1), nullptr);
  EXPECT_EQ(table_.FindRead(1), nullptr);
  EXPECT_FALSE(table_.Take(1).has_value());
  EXPECT_FALSE(table_.IsRevoked(1));
  EXPECT_EQ(table_.FindRevoked(1), nullptr);
  EXPECT_FALSE(table_.ForgetRevoked(1).has_value());
  const auto [ended, more] = Revoke(Clock::now() + std::chrono::hours(24), /*work_limit=*/0);
  EXPECT_TRUE(ended.empty());
  EXPECT_FALSE(more);
}

TEST_F(LeaseTableTest, IdsGrowInGrantOrderAndEachKindIsCounted) {
  const LeaseId w1 = GrantWrite({4, 5});
  const LeaseId r1 = GrantRead({7});
  const LeaseId w2 = GrantWrite({});
  EXPECT_EQ(w1, 1u);
  EXPECT_EQ(r1, 2u);
  EXPECT_EQ(w2, 3u);
  EXPECT_EQ(table_.next_id(), 4u);
  EXPECT_EQ(LiveIds(), (std::vector<LeaseId>{1, 2, 3}));
  EXPECT_EQ(table_.size(), 3u);
  EXPECT_EQ(table_.write_count(), 2u);
  EXPECT_EQ(table_.read_count(), 1u);
  EXPECT_LT(GrantedAt(w1), GrantedAt(r1));
  EXPECT_LT(GrantedAt(r1), GrantedAt(w2));
  EXPECT_EQ(table_.OldestGrant(), GrantedAt(w1));
}

// A lease is found as the kind it is only; what is found is the table's own
// (Engine::PromoteOnRelease sets promote_after through FindRead).
TEST_F(LeaseTableTest, FindReturnsTheLiveLeaseOfThatKindInPlace) {
  const LeaseId w = GrantWrite({1, 2, 3});
  const LeaseId r = GrantRead({9, 8});
  EXPECT_EQ(table_.FindRead(w), nullptr);
  EXPECT_EQ(table_.FindWrite(r), nullptr);
  WriteSlots* ws = table_.FindWrite(w);
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->slots, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(ws->tenant, &tenant_);
  ReadRecords* rr = table_.FindRead(r);
  ASSERT_NE(rr, nullptr);
  EXPECT_EQ(rr->records, (std::vector<uint32_t>{9, 8}));
  EXPECT_FALSE(rr->promote_after);
  rr->promote_after = true;
  std::optional<Lease> taken = table_.Take(r);
  ASSERT_TRUE(taken.has_value());
  EXPECT_FALSE(taken->write());
  EXPECT_TRUE(std::get<ReadRecords>(taken->held).promote_after);
  EXPECT_EQ(taken->size(), 2u);
}

// Take ends a lease once; its id is never granted again.
TEST_F(LeaseTableTest, TakeRemovesALeaseOnceAndItsIdIsNotReused) {
  const LeaseId w = GrantWrite({1, 2});
  const LeaseId r = GrantRead({3});
  const Clock::time_point r_granted = GrantedAt(r);
  std::optional<Lease> lease = table_.Take(w);
  ASSERT_TRUE(lease.has_value());
  EXPECT_TRUE(lease->write());
  EXPECT_EQ(lease->size(), 2u);
  EXPECT_EQ(table_.write_count(), 0u);
  EXPECT_EQ(table_.read_count(), 1u);
  EXPECT_EQ(table_.OldestGrant(), r_granted) << "the oldest lease is gone";
  EXPECT_FALSE(table_.Take(w).has_value());
  EXPECT_EQ(table_.FindWrite(w), nullptr);
  EXPECT_FALSE(table_.IsRevoked(w)) << "released, not revoked";
  EXPECT_EQ(GrantWrite({}), 3u);
  ASSERT_TRUE(table_.Take(r).has_value());
  ASSERT_TRUE(table_.Take(3).has_value());
  EXPECT_TRUE(table_.empty());
  EXPECT_EQ(table_.read_count(), 0u) << "the read count must not wrap";
  EXPECT_EQ(table_.write_count(), 0u);
}

// A lease expires when it is `timeout` old, not a nanosecond before.
TEST_F(LeaseTableTest, ALeaseExpiresWhenItIsTimeoutOld) {
  const LeaseId w = GrantWrite({1, 2});
  const Clock::time_point g = GrantedAt(w);
  auto [ended, more] = Revoke(g + kTimeout - nanoseconds(1));
  EXPECT_TRUE(ended.empty());
  EXPECT_FALSE(more);
  EXPECT_NE(table_.FindWrite(w), nullptr);

  std::tie(ended, more) = Revoke(g + kTimeout);
  EXPECT_EQ(ended, std::vector<size_t>{2});
  EXPECT_FALSE(more);
  EXPECT_TRUE(table_.empty());
  EXPECT_EQ(table_.write_count(), 0u);
  EXPECT_EQ(table_.FindWrite(w), nullptr) << "revoked: no longer live";
  EXPECT_FALSE(table_.Take(w).has_value());
  EXPECT_TRUE(table_.IsRevoked(w));
  const RevokedLease* rev = table_.FindRevoked(w);
  ASSERT_NE(rev, nullptr);
  EXPECT_TRUE(rev->write);
  EXPECT_EQ(rev->held, kTimeout);
  EXPECT_EQ(rev->timeout, kTimeout);
}

// Ids are grant order, so the expired leases are a prefix: the oldest go
// first, and a younger lease stops the walk.
TEST_F(LeaseTableTest, TheTimeoutRevokesTheOldestLeasesOnly) {
  const LeaseId a = GrantWrite({1});
  const LeaseId b = GrantRead({2, 3});
  const LeaseId c = GrantWrite({4, 5, 6});
  const auto [ended, more] = Revoke(GrantedAt(b) + kTimeout);
  EXPECT_EQ(ended, (std::vector<size_t>{1, 2})) << "a, then b";
  EXPECT_FALSE(more) << "c is not expired";
  EXPECT_TRUE(table_.IsRevoked(a));
  EXPECT_TRUE(table_.IsRevoked(b));
  EXPECT_FALSE(table_.IsRevoked(c));
  EXPECT_EQ(LiveIds(), std::vector<LeaseId>{c});
  EXPECT_EQ(table_.OldestGrant(), GrantedAt(c));
  EXPECT_EQ(table_.write_count(), 1u);
  EXPECT_EQ(table_.read_count(), 0u);
  const RevokedLease* rb = table_.FindRevoked(b);
  ASSERT_NE(rb, nullptr);
  EXPECT_FALSE(rb->write);
  EXPECT_EQ(rb->held, kTimeout);
}

// One call gives back at most about `work_limit` slots and blocks, each lease
// counting one more; it always makes progress, and says when expired leases
// are left for the next call.
TEST_F(LeaseTableTest, ACallStopsAtTheWorkLimitAndSaysWhatIsLeft) {
  GrantWrite({1, 2, 3});  // Work 4.
  GrantRead({});          // Work 1.
  GrantRead({4, 5});      // Work 3.
  GrantWrite({6});        // Work 2.
  const LeaseId young = GrantRead({7});
  const Clock::time_point now = GrantedAt(young) + kTimeout - nanoseconds(1);  // All but the youngest.

  auto [ended, more] = Revoke(now, /*work_limit=*/0);
  EXPECT_TRUE(ended.empty()) << "no work allowed";
  EXPECT_TRUE(more);
  EXPECT_EQ(table_.size(), 5u);

  std::tie(ended, more) = Revoke(now, /*work_limit=*/1);
  EXPECT_EQ(ended, std::vector<size_t>{3}) << "a lease larger than the limit still goes, alone";
  EXPECT_TRUE(more);

  std::tie(ended, more) = Revoke(now, /*work_limit=*/1);
  EXPECT_EQ(ended, std::vector<size_t>{0}) << "an empty lease counts one";
  EXPECT_TRUE(more);

  std::tie(ended, more) = Revoke(now, /*work_limit=*/5);
  EXPECT_EQ(ended, (std::vector<size_t>{2, 1})) << "3 + 2 reaches the limit with the last expired one";
  EXPECT_FALSE(more) << "what is left has not expired";
  EXPECT_EQ(LiveIds(), std::vector<LeaseId>{young});
  for (LeaseId id = 1; id < young; ++id) EXPECT_TRUE(table_.IsRevoked(id)) << id;
}

// Many empty leases are bounded too: each counts one.
TEST_F(LeaseTableTest, EmptyLeasesAreBoundedByTheirCount) {
  for (int i = 0; i < 10; ++i) GrantRead({});
  const Clock::time_point now = *table_.OldestGrant() + std::chrono::hours(1);
  auto [ended, more] = Revoke(now, /*work_limit=*/4);
  EXPECT_EQ(ended.size(), 4u);
  EXPECT_TRUE(more);
  std::tie(ended, more) = Revoke(now, /*work_limit=*/6);
  EXPECT_EQ(ended.size(), 6u);
  EXPECT_FALSE(more) << "the sixth emptied the table";
  EXPECT_TRUE(table_.empty());
}

// What is kept of a revoked lease stays until its holder releases it, once.
TEST_F(LeaseTableTest, ARevokedLeaseIsKeptUntilItsHolderForgetsIt) {
  const LeaseId a = GrantRead({1});
  const LeaseId b = GrantWrite({2});
  Revoke(GrantedAt(b) + kTimeout + milliseconds(12));
  ASSERT_TRUE(table_.IsRevoked(a));
  ASSERT_TRUE(table_.IsRevoked(b));
  std::optional<RevokedLease> gone = table_.ForgetRevoked(a);
  ASSERT_TRUE(gone.has_value());
  EXPECT_FALSE(gone->write);
  EXPECT_GE(gone->held, kTimeout + milliseconds(12));
  EXPECT_FALSE(table_.IsRevoked(a));
  EXPECT_EQ(table_.FindRevoked(a), nullptr);
  EXPECT_FALSE(table_.ForgetRevoked(a).has_value()) << "a second release is of no lease";
  EXPECT_TRUE(table_.IsRevoked(b)) << "another revoked lease is kept";
  EXPECT_EQ(table_.FindRevoked(b)->held, kTimeout + milliseconds(12));
}

// An id is live or revoked, never both: forgetting a live lease does nothing.
TEST_F(LeaseTableTest, ForgettingALiveLeaseLeavesItLive) {
  const LeaseId w = GrantWrite({1});
  EXPECT_FALSE(table_.ForgetRevoked(w).has_value());
  EXPECT_NE(table_.FindWrite(w), nullptr);
  EXPECT_EQ(table_.write_count(), 1u);
}

// The age kept is whole milliseconds, never below the timeout that revoked it
// (the error says "expired after N ms (... N' ms)" with N >= N').
TEST_F(LeaseTableTest, TheAgeKeptIsInWholeMilliseconds) {
  const LeaseId r = GrantRead({1});
  Revoke(GrantedAt(r) + milliseconds(30012) + std::chrono::microseconds(999));
  const RevokedLease* rev = table_.FindRevoked(r);
  ASSERT_NE(rev, nullptr);
  EXPECT_EQ(rev->held, milliseconds(30012));
  EXPECT_EQ(rev->timeout, kTimeout);
}

TEST(DescribeExpiredTest, NamesTheKindTheAgeAndTheSetting) {
  EXPECT_EQ(DescribeExpired(7, RevokedLease{true, milliseconds(30012), milliseconds(30000)}),
            "write lease 7 expired after 30012 ms (limits.lease_timeout_ms: 30000)");
  EXPECT_EQ(DescribeExpired(18446744073709551615ull, RevokedLease{false, milliseconds(5), milliseconds(1)}),
            "read lease 18446744073709551615 expired after 5 ms (limits.lease_timeout_ms: 1)");
}

TEST(LeaseTest, ItsSizeIsItsSlotsOrItsBlocks) {
  EXPECT_EQ((Lease{WriteSlots{{1, 2, 3}, nullptr}, {}}.size()), 3u);
  EXPECT_EQ((Lease{ReadRecords{{4}, false}, {}}.size()), 1u);
  EXPECT_EQ((Lease{ReadRecords{}, {}}.size()), 0u);
  EXPECT_TRUE((Lease{WriteSlots{}, {}}.write()));
  EXPECT_FALSE((Lease{ReadRecords{}, {}}.write()));
}

}  // namespace
}  // namespace kvtier::tiering
