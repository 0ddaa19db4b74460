// FenceBoard: each stream's completed sequence, kept in the board's own memory
// and published (with the submitted one) in the segment clients map; local
// waiters, the copy statistics and the completion notifier.
#include "kvtier/tiering/fence_board.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "kvtier/fence_layout.h"
#include "kvtier/index_layout.h"
#include "kvtier/shm_segment.h"
#include "support/test_names.h"

namespace kvtier::tiering {
namespace {

using std::chrono::milliseconds;

constexpr auto kWait = std::chrono::seconds(10);
constexpr CopyDirection kUp = CopyDirection::kHostToGpu;
constexpr CopyDirection kDown = CopyDirection::kGpuToHost;
constexpr int kUpStream = static_cast<int>(kUp);
constexpr int kDownStream = static_cast<int>(kDown);

ShmSegment SealedSegment() {
  auto seg = ShmSegment::CreateSealed("kvtier.test.fences", sizeof(FenceSegment), ShmSegment::Sharing::kReadOnly);
  EXPECT_TRUE(seg.ok()) << seg.status().ToString();
  return seg.ok() ? std::move(seg).value() : ShmSegment();
}

// The segment as a client maps it: read-only, from the descriptor passed.
const FenceSegment* ClientView(const FenceBoard& board, ShmSegment& mapping) {
  auto m = ShmSegment::MapPassed(board.share_fd(), /*writable=*/false, sizeof(FenceSegment), "fences");
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  mapping = std::move(m).value();
  return reinterpret_cast<const FenceSegment*>(mapping.data());
}

TEST(FenceBoardTest, ANewBoardPublishesAnEmptySegment) {
  FenceBoard board(SealedSegment());
  ASSERT_GE(board.share_fd(), 0);
  ShmSegment mapping;
  const FenceSegment* seen = ClientView(board, mapping);
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(seen->magic, kFenceMagic);
  EXPECT_EQ(seen->abi_version, kShmAbiVersion);
  for (int s = 0; s < kCopyStreams; ++s) {
    EXPECT_EQ(seen->completed[s], 0u);
    EXPECT_EQ(seen->submitted[s], 0u);
  }
  EXPECT_TRUE(board.IsComplete(Fence{})) << "the null fence waits for nothing";
  EXPECT_FALSE(board.IsComplete(Fence{1, kUp}));
  EXPECT_FALSE(board.IsComplete(Fence{1, kDown}));
  EXPECT_EQ(board.stats(kUp).batches, 0u);
  EXPECT_EQ(board.stats(kDown).batches, 0u);
}

// Submitting completes nothing; it is published for clients, per stream.
TEST(FenceBoardTest, SubmittedIsPublishedAndCompletesNothing) {
  FenceBoard board(SealedSegment());
  ShmSegment mapping;
  const FenceSegment* seen = ClientView(board, mapping);
  ASSERT_NE(seen, nullptr);
  board.Submitted(kDownStream, 4);
  EXPECT_EQ(seen->submitted[kDownStream], 4u);
  EXPECT_EQ(seen->submitted[kUpStream], 0u);
  EXPECT_FALSE(board.IsComplete(Fence{1, kDown}));
  EXPECT_EQ(seen->completed[kDownStream], 0u);
}

// A completion covers every batch of its stream up to its sequence, and no
// batch of the other stream; clients see it in the segment.
TEST(FenceBoardTest, ACompletionCoversItsStreamUpToItsSequence) {
  FenceBoard board(SealedSegment());
  ShmSegment mapping;
  const FenceSegment* seen = ClientView(board, mapping);
  ASSERT_NE(seen, nullptr);
  board.Submitted(kUpStream, 4);
  board.Completed(kUpStream, 3, /*blocks=*/1, /*bytes=*/256, /*busy_seconds=*/0.5);
  EXPECT_TRUE(board.IsComplete(Fence{1, kUp}));
  EXPECT_TRUE(board.IsComplete(Fence{3, kUp}));
  EXPECT_FALSE(board.IsComplete(Fence{4, kUp}));
  EXPECT_FALSE(board.IsComplete(Fence{1, kDown})) << "streams are independent";
  EXPECT_EQ(seen->completed[kUpStream], 3u);
  EXPECT_EQ(seen->completed[kDownStream], 0u);
  EXPECT_TRUE(board.Wait(Fence{2, kUp}, milliseconds(0)).ok());
}

TEST(FenceBoardTest, StatisticsAreKeptPerDirection) {
  FenceBoard board(SealedSegment());
  board.Completed(kDownStream, 1, 3, 768, 0.25);
  board.Completed(kDownStream, 2, 2, 512, 0.5);
  board.Completed(kUpStream, 1, 1, 256, 0.125);
  const CopyStats down = board.stats(kDown);
  EXPECT_EQ(down.batches, 2u);
  EXPECT_EQ(down.blocks, 5u);
  EXPECT_EQ(down.bytes, 1280u);
  EXPECT_DOUBLE_EQ(down.busy_seconds, 0.75);
  const CopyStats up = board.stats(kUp);
  EXPECT_EQ(up.batches, 1u);
  EXPECT_EQ(up.blocks, 1u);
  EXPECT_EQ(up.bytes, 256u);
  EXPECT_DOUBLE_EQ(up.busy_seconds, 0.125);
}

TEST(FenceBoardTest, AWaitForAPendingFenceTimesOut) {
  FenceBoard board(SealedSegment());
  EXPECT_TRUE(board.Wait(Fence{}, milliseconds(0)).ok());
  board.Completed(kUpStream, 1, 1, 1, 0);
  const Status st = board.Wait(Fence{2, kUp}, milliseconds(0));
  EXPECT_EQ(st.code(), StatusCode::kTimeout);
  EXPECT_NE(st.message().find("copy fence 2 still pending"), std::string::npos) << st.message();
}

// A waiter on another thread is woken by the completion that covers its
// fence, not by an earlier one (kWait only bounds a broken wake-up).
TEST(FenceBoardTest, AWaiterIsWokenByTheCompletionOfItsFence) {
  FenceBoard board(SealedSegment());
  std::atomic<bool> woke{false};
  Status waited;
  std::thread waiter([&] {
    waited = board.Wait(Fence{2, kDown}, kWait);
    woke = true;
  });
  board.Completed(kDownStream, 1, 1, 1, 0);
  board.Completed(kUpStream, 5, 1, 1, 0);
  EXPECT_FALSE(board.IsComplete(Fence{2, kDown}));
  board.Completed(kDownStream, 2, 1, 1, 0);
  waiter.join();
  EXPECT_TRUE(woke);
  EXPECT_TRUE(waited.ok()) << waited.ToString();
}

// The daemon believes its own memory, never the segment: a value written into
// the segment (by anyone who could) completes nothing, and the next
// completion overwrites it.
TEST(FenceBoardTest, AForgedSegmentCompletesNothing) {
  const std::string name = "/" + testing::UniqueShmPrefix("fence-board");
  auto seg = ShmSegment::Create(name, sizeof(FenceSegment));
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  FenceBoard board(std::move(seg).value());
  auto forger = ShmSegment::Open(name, /*writable=*/true);
  ASSERT_TRUE(forger.ok()) << forger.status().ToString();
  auto* forged = reinterpret_cast<FenceSegment*>(forger->data());
  ASSERT_EQ(forged->magic, kFenceMagic);
  forged->completed[kDownStream] = 100;
  forged->completed[kUpStream] = 100;
  EXPECT_FALSE(board.IsComplete(Fence{5, kDown}));
  EXPECT_FALSE(board.IsComplete(Fence{1, kUp}));
  EXPECT_EQ(board.Wait(Fence{5, kDown}, milliseconds(0)).code(), StatusCode::kTimeout);
  board.Completed(kDownStream, 1, 1, 1, 0);
  EXPECT_EQ(forged->completed[kDownStream], 1u) << "what is published is what completed";
  EXPECT_FALSE(board.IsComplete(Fence{2, kDown}));
}

// The notifier runs once per completion, after the completion is visible and
// outside the board's lock: it may call back into the board.
TEST(FenceBoardTest, TheNotifierRunsAfterEachCompletionOutsideTheLock) {
  FenceBoard board(SealedSegment());
  int calls = 0;
  uint64_t batches_seen = 0;
  bool complete_seen = false;
  board.SetNotifier([&] {
    ++calls;
    batches_seen = board.stats(kUp).batches;  // Takes the board's lock.
    complete_seen = board.Wait(Fence{static_cast<uint64_t>(calls), kUp}, milliseconds(0)).ok();
  });
  board.Completed(kUpStream, 1, 1, 1, 0);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(batches_seen, 1u);
  EXPECT_TRUE(complete_seen);
  board.Completed(kUpStream, 2, 1, 1, 0);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(batches_seen, 2u);
  EXPECT_TRUE(complete_seen);

  int replaced_calls = 0;
  board.SetNotifier([&] { ++replaced_calls; });
  board.Completed(kDownStream, 1, 1, 1, 0);
  EXPECT_EQ(calls, 2) << "the old notifier no longer runs";
  EXPECT_EQ(replaced_calls, 1);
  board.SetNotifier(nullptr);
  board.Completed(kDownStream, 2, 1, 1, 0);  // No notifier: nothing to call.
  EXPECT_EQ(replaced_calls, 1);
  EXPECT_TRUE(board.IsComplete(Fence{2, kDown}));
}

}  // namespace
}  // namespace kvtier::tiering
