// MirrorQueue: committed blocks being copied to host slots for the stores, in
// submission order: a batch is taken once its fence completed, never before an
// older one; WaitAll waits for each batch without taking any.
#include "mirror_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

// A backend whose fences complete when the test says, in any order (a real
// stream completes in order; the queue must not rely on it more than on its
// own order), and that records the waits it is asked for.
class FenceOnlyBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kHost; }
  std::string Describe() const override { return "fences only (test)"; }
  Result<std::unique_ptr<Pool>> CreatePool(const PoolSpec&) override { return Unavailable("no pools"); }
  Result<Fence> SubmitCopies(CopyDirection, const Pool&, const Pool&, std::span<const CopyOp>) override {
    return Unavailable("no copies");
  }
  bool IsComplete(const Fence& f) const override { return f.IsNull() || complete.count(f.seq) != 0; }
  Status Wait(const Fence& f, milliseconds timeout) const override {
    waits.emplace_back(f.seq, timeout);
    return IsComplete(f) ? Status::Ok() : Status(StatusCode::kTimeout, "pending");
  }
  void SetCompletionNotifier(std::function<void()>) override {}
  std::string FenceSegmentName() const override { return ""; }
  int FenceSegmentFd() const override { return -1; }
  CopyStats copy_stats(CopyDirection) const override { return {}; }

  std::set<uint64_t> complete;                               // Sequences of the demotion stream.
  mutable std::vector<std::pair<uint64_t, milliseconds>> waits;  // (seq, timeout) per Wait.
};

MirrorQueue::Batch MakeBatch(uint64_t seq, std::vector<MirrorQueue::Copy> copies) {
  return MirrorQueue::Batch{Fence{seq, CopyDirection::kGpuToHost}, std::move(copies)};
}

std::vector<uint32_t> RecordsInFlight(const MirrorQueue& q) {
  std::vector<uint32_t> out;
  q.ForEachCopy([&](const MirrorQueue::Copy& c) { out.push_back(c.record); });
  return out;
}

TEST(MirrorQueueTest, AnEmptyQueueHasNothingLandedOrInFlight) {
  FenceOnlyBackend backend;
  MirrorQueue q;
  EXPECT_FALSE(q.TakeLanded(backend).has_value());
  EXPECT_TRUE(RecordsInFlight(q).empty());
  q.WaitAll(backend, milliseconds(5));
  EXPECT_TRUE(backend.waits.empty());
}

TEST(MirrorQueueTest, ABatchIsTakenWithItsCopiesOnceItsFenceCompleted) {
  FenceOnlyBackend backend;
  MirrorQueue q;
  q.Add(MakeBatch(1, {{10, 0}, {11, 1}}));
  EXPECT_FALSE(q.TakeLanded(backend).has_value()) << "its copies have not landed";
  EXPECT_EQ(RecordsInFlight(q), (std::vector<uint32_t>{10, 11})) << "a pending batch stays";
  backend.complete.insert(1);
  std::optional<MirrorQueue::Batch> landed = q.TakeLanded(backend);
  ASSERT_TRUE(landed.has_value());
  EXPECT_EQ(landed->fence, (Fence{1, CopyDirection::kGpuToHost}));
  ASSERT_EQ(landed->copies.size(), 2u);
  EXPECT_EQ(landed->copies[0].record, 10u);
  EXPECT_EQ(landed->copies[0].host_slot, 0u);
  EXPECT_EQ(landed->copies[1].record, 11u);
  EXPECT_EQ(landed->copies[1].host_slot, 1u);
  EXPECT_FALSE(q.TakeLanded(backend).has_value()) << "taken once";
  EXPECT_TRUE(RecordsInFlight(q).empty());
}

// Submission order: a newer batch that landed first waits behind the oldest,
// and each call takes one batch.
TEST(MirrorQueueTest, BatchesAreTakenInSubmissionOrderOneAtATime) {
  FenceOnlyBackend backend;
  MirrorQueue q;
  q.Add(MakeBatch(1, {{1, 5}}));
  q.Add(MakeBatch(2, {{2, 6}}));
  q.Add(MakeBatch(3, {{3, 7}}));
  backend.complete.insert(2);
  backend.complete.insert(3);
  EXPECT_FALSE(q.TakeLanded(backend).has_value()) << "batch 1 is still in flight";
  EXPECT_EQ(RecordsInFlight(q), (std::vector<uint32_t>{1, 2, 3}));
  backend.complete.insert(1);
  std::vector<uint64_t> order;
  while (auto b = q.TakeLanded(backend)) order.push_back(b->fence.seq);
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));
}

// WaitAll waits for every batch in order, each with the timeout given, and
// takes none: their slots stay owned until the engine takes them.
TEST(MirrorQueueTest, WaitAllWaitsForEveryBatchAndTakesNone) {
  FenceOnlyBackend backend;
  MirrorQueue q;
  q.Add(MakeBatch(4, {{1, 1}}));
  q.Add(MakeBatch(5, {}));
  q.Add(MakeBatch(6, {{2, 2}, {3, 3}}));
  backend.complete.insert(5);
  q.WaitAll(backend, milliseconds(250));
  ASSERT_EQ(backend.waits.size(), 3u) << "a timed-out wait does not stop the others";
  EXPECT_EQ(backend.waits[0], std::make_pair(uint64_t{4}, milliseconds(250)));
  EXPECT_EQ(backend.waits[1], std::make_pair(uint64_t{5}, milliseconds(250)));
  EXPECT_EQ(backend.waits[2], std::make_pair(uint64_t{6}, milliseconds(250)));
  EXPECT_EQ(RecordsInFlight(q), (std::vector<uint32_t>{1, 2, 3}));
  backend.complete.insert(4);
  auto first = q.TakeLanded(backend);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->fence.seq, 4u);
  auto empty_batch = q.TakeLanded(backend);
  ASSERT_TRUE(empty_batch.has_value());
  EXPECT_TRUE(empty_batch->copies.empty());
  EXPECT_FALSE(q.TakeLanded(backend).has_value());
}

}  // namespace
}  // namespace kvtier::tiering
