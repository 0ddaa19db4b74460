// CopyPlanner: path choice, coalescing of adjacent slots, submission caps.
#include <gtest/gtest.h>

#include <vector>

#include "kvtier/tiering/copy_planner.h"

namespace kvtier::tiering {
namespace {

constexpr size_t kKiB = 1024;

std::vector<PlannedCopy> All(const CopyPlan& plan) {
  std::vector<PlannedCopy> out;
  for (const auto& sub : plan.submissions) out.insert(out.end(), sub.begin(), sub.end());
  return out;
}

TEST(CopyPlannerTest, SmallBlocksUseTheKernelLargeOnesTheCopyEngines) {
  const std::vector<CopyOp> ops = {{0, 5}};
  CopyPlannerOptions o;
  EXPECT_EQ(PlanCopies(ops, 4 * kKiB, o).path, CopyPath::kKernel);
  EXPECT_EQ(PlanCopies(ops, 32 * kKiB, o).path, CopyPath::kKernel);
  EXPECT_EQ(PlanCopies(ops, 64 * kKiB, o).path, CopyPath::kMemcpy);
  EXPECT_EQ(PlanCopies(ops, 2048 * kKiB, o).path, CopyPath::kMemcpy);
  o.memcpy_min_block_bytes = 0;  // What a device that cannot read host memory through its host address gets.
  EXPECT_EQ(PlanCopies(ops, 4 * kKiB, o).path, CopyPath::kMemcpy);
}

TEST(CopyPlannerTest, CoalescesSlotsAdjacentOnBothSides) {
  const size_t slot = 2048 * kKiB;
  // 3,4,5 -> 10,11,12 is one run; 7 -> 20 breaks on the source; 8 -> 22 breaks on the destination.
  const std::vector<CopyOp> ops = {{4, 11}, {3, 10}, {5, 12}, {7, 20}, {8, 22}};
  const CopyPlan plan = PlanCopies(ops, slot, CopyPlannerOptions{});
  EXPECT_EQ(plan.blocks, 5u);
  const std::vector<PlannedCopy> want = {
      {3 * slot, 10 * slot, 3 * slot}, {7 * slot, 20 * slot, slot}, {8 * slot, 22 * slot, slot}};
  EXPECT_EQ(All(plan), want);
}

TEST(CopyPlannerTest, KernelRunsStopAtTheirByteCap) {
  const size_t slot = 16 * kKiB;
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 10; ++i) ops.push_back({i, 100 + i});
  CopyPlannerOptions o;  // 64 KiB per kernel copy: 4 slots.
  const std::vector<PlannedCopy> got = All(PlanCopies(ops, slot, o));
  const std::vector<PlannedCopy> want = {
      {0, 100 * slot, 4 * slot}, {4 * slot, 104 * slot, 4 * slot}, {8 * slot, 108 * slot, 2 * slot}};
  EXPECT_EQ(got, want);
}

TEST(CopyPlannerTest, RunsDoNotCrossPinnedChunks) {
  const size_t slot = 64 * kKiB;
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 6; ++i) ops.push_back({i, 2 + i});  // dst 2..7
  CopyPlannerOptions o;
  o.chunk_slots = 4;  // Chunk starts at 0, 4, 8: src breaks before 4, dst before 4.
  const std::vector<PlannedCopy> got = All(PlanCopies(ops, slot, o));
  const std::vector<PlannedCopy> want = {
      {0, 2 * slot, 2 * slot}, {2 * slot, 4 * slot, 2 * slot}, {4 * slot, 6 * slot, 2 * slot}};
  EXPECT_EQ(got, want);
}

TEST(CopyPlannerTest, SplitsIntoCappedSubmissions) {
  const size_t slot = 4 * kKiB;
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 2500; ++i) ops.push_back({2 * i, 2 * i});  // Never adjacent: 2,500 copies.
  CopyPlannerOptions o;
  o.max_copies_per_submission = 1000;
  const CopyPlan plan = PlanCopies(ops, slot, o);
  ASSERT_EQ(plan.submissions.size(), 3u);
  EXPECT_EQ(plan.submissions[0].size(), 1000u);
  EXPECT_EQ(plan.submissions[1].size(), 1000u);
  EXPECT_EQ(plan.submissions[2].size(), 500u);
  EXPECT_EQ(plan.blocks, 2500u);
}

TEST(CopyPlannerTest, CoversEveryOpExactlyOnce) {
  const size_t slot = 8 * kKiB;
  std::vector<CopyOp> ops;
  for (uint32_t i = 0; i < 300; ++i) ops.push_back({(i * 7919) % 300, (i * 104729 + 3) % 300});
  const CopyPlan plan = PlanCopies(ops, slot, CopyPlannerOptions{});
  std::vector<int> seen(300, 0);
  for (const PlannedCopy& c : All(plan)) {
    ASSERT_EQ(c.bytes % slot, 0u);
    for (uint64_t k = 0; k < c.bytes / slot; ++k) {
      const uint64_t s = c.src_offset / slot + k;
      ++seen[s];
      // The destination of source slot s is the op's, shifted along the run.
      bool found = false;
      for (const CopyOp& op : ops) found |= op.src_slot == s && op.dst_slot == c.dst_offset / slot + k;
      EXPECT_TRUE(found) << "src slot " << s;
    }
  }
  for (int n : seen) EXPECT_EQ(n, 1);
}

TEST(CopyPlannerTest, EmptyBatchPlansNothing) {
  const CopyPlan plan = PlanCopies({}, 4 * kKiB, CopyPlannerOptions{});
  EXPECT_TRUE(plan.submissions.empty());
  EXPECT_EQ(plan.blocks, 0u);
}

// Large-block copies use cudaMemcpyBatchAsync only where the toolkit, the
// driver and a probe batch at start all say it works; the log line says which
// path, and why.
TEST(CopyPlannerTest, BatchedMemcpyOnlyWhereEverythingSaysItWorks) {
  BatchedMemcpySupport s;
  EXPECT_FALSE(ChooseBatchedMemcpy(s).batched);
  EXPECT_NE(ChooseBatchedMemcpy(s).why.find("older than 13"), std::string::npos);
  s.toolkit = true;
  EXPECT_FALSE(ChooseBatchedMemcpy(s).batched);
  EXPECT_NE(ChooseBatchedMemcpy(s).why.find("needs 12.8"), std::string::npos);
  s.driver = true;
  s.probe_error = "cudaErrorInvalidValue: invalid argument";
  const BatchedMemcpyChoice refused = ChooseBatchedMemcpy(s);
  EXPECT_FALSE(refused.batched);
  EXPECT_NE(refused.why.find("per-copy cudaMemcpyAsync"), std::string::npos);
  EXPECT_NE(refused.why.find("cudaErrorInvalidValue"), std::string::npos) << refused.why;
  s.probe_error.clear();
  EXPECT_TRUE(ChooseBatchedMemcpy(s).batched);
  EXPECT_NE(ChooseBatchedMemcpy(s).why.find("cudaMemcpyBatchAsync"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::tiering
