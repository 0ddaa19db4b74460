// FetchTurns: the order in which the store I/O thread gives fetches their
// turns (stores/src/fetch_turns.h), without a thread or a store.
#include "fetch_turns.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier::stores {
namespace {

Namespace Ns(uint64_t n) { return Namespace{BlockKey{n, n}}; }

// Runs the turns until none is left: each fetch in `chunks` needs that many
// turns (it is given another while it has some left). Returns the ids in the
// order their turns came.
std::vector<uint64_t> RunAll(FetchTurns& turns, std::vector<int> chunks) {
  std::vector<uint64_t> order;
  while (!turns.empty()) {
    const FetchTurns::Turn t = turns.Take();
    order.push_back(t.id);
    if (--chunks.at(t.id) > 0) turns.Add(t.ns, t.id);
  }
  return order;
}

TEST(FetchTurnsTest, NothingQueuedIsEmpty) {
  FetchTurns turns;
  EXPECT_TRUE(turns.empty());
  turns.Add(Ns(1), 7);
  EXPECT_FALSE(turns.empty());
  const FetchTurns::Turn t = turns.Take();
  EXPECT_EQ(t.id, 7u);
  EXPECT_EQ(t.ns, Ns(1));
  EXPECT_TRUE(turns.empty());
}

TEST(FetchTurnsTest, OneNamespacesFetchesTakeTurnsInTheOrderQueued) {
  FetchTurns turns;
  turns.Add(Ns(1), 0);
  turns.Add(Ns(1), 1);
  turns.Add(Ns(1), 2);
  // Two chunks each: round-robin over the three, not one after another.
  EXPECT_EQ(RunAll(turns, {2, 2, 2}), (std::vector<uint64_t>{0, 1, 2, 0, 1, 2}));
}

TEST(FetchTurnsTest, NamespacesTakeTurnsHoweverManyFetchesEachQueued) {
  FetchTurns turns;
  // Tenant 1 queued three long fetches before tenant 2's short one.
  turns.Add(Ns(1), 0);
  turns.Add(Ns(1), 1);
  turns.Add(Ns(1), 2);
  turns.Add(Ns(2), 3);
  const std::vector<uint64_t> order = RunAll(turns, {3, 3, 3, 1});
  // The short fetch's one turn comes second: after one chunk of tenant 1, not after its three fetches.
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(order[0], 0u);
  EXPECT_EQ(order[1], 3u);
  // Then tenant 1's fetches share its turns among themselves.
  EXPECT_EQ((std::vector<uint64_t>(order.begin() + 2, order.end())), (std::vector<uint64_t>{1, 2, 0, 1, 2, 0, 1, 2}));
}

TEST(FetchTurnsTest, TwoBusyNamespacesAlternateTurnByTurn) {
  FetchTurns turns;
  turns.Add(Ns(1), 0);
  turns.Add(Ns(1), 1);
  turns.Add(Ns(2), 2);
  const std::vector<uint64_t> order = RunAll(turns, {2, 2, 4});
  // 1, 2, 1, 2, ... while both have fetches; then tenant 2 alone.
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 2, 1, 2, 0, 2, 1, 2}));
}

TEST(FetchTurnsTest, ANamespaceThatEmptiedJoinsAtTheBackWhenItAsksAgain) {
  FetchTurns turns;
  turns.Add(Ns(1), 0);
  turns.Add(Ns(2), 1);
  EXPECT_EQ(turns.Take().id, 0u);  // Tenant 1 has nothing left: its lane is gone.
  turns.Add(Ns(3), 2);
  turns.Add(Ns(1), 3);  // Asks again: behind tenant 3, who was waiting.
  EXPECT_EQ(turns.Take().id, 1u);
  EXPECT_EQ(turns.Take().id, 2u);
  EXPECT_EQ(turns.Take().id, 3u);
  EXPECT_TRUE(turns.empty());
}

TEST(FetchTurnsTest, AFetchAddedToAWaitingNamespaceWaitsForThatNamespacesTurn) {
  FetchTurns turns;
  turns.Add(Ns(1), 0);
  turns.Add(Ns(2), 1);
  turns.Add(Ns(2), 2);  // Tenant 2's lane, not a turn of its own.
  turns.Add(Ns(1), 3);
  std::vector<uint64_t> order;
  while (!turns.empty()) order.push_back(turns.Take().id);
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 3, 2}));
}

}  // namespace
}  // namespace kvtier::stores
