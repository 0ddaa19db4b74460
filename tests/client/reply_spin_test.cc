// ReplySpin: when a client polls for kvtierd's reply, and when it stops.
#include "reply_spin.h"

#include <gtest/gtest.h>

namespace kvtier::client_internal {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = ReplySpin::Clock;

constexpr microseconds kWindow{50};

// A clock that starts far from the epoch, so "no reply yet" is long ago.
Clock::time_point T0() { return Clock::time_point{} + std::chrono::hours(1); }

TEST(ReplySpinTest, PollsOnlyForARequestThatFollowsAReplyWithinTheWindow) {
  ReplySpin spin(kWindow);
  const auto t = T0();
  EXPECT_EQ(spin.PollUntil(t), t) << "no reply yet: the daemon may sleep";
  spin.Replied(t);
  EXPECT_EQ(spin.PollUntil(t + microseconds(10)), t + microseconds(10) + kWindow);
  EXPECT_EQ(spin.PollUntil(t + microseconds(49)), t + microseconds(49) + kWindow);
  EXPECT_EQ(spin.PollUntil(t + kWindow), t + kWindow) << "the daemon stopped polling by now";
  EXPECT_EQ(spin.PollUntil(t + milliseconds(2)), t + milliseconds(2));
}

TEST(ReplySpinTest, AZeroWindowNeverPolls) {
  ReplySpin spin(microseconds(0));
  const auto t = T0();
  spin.Replied(t);
  EXPECT_EQ(spin.PollUntil(t), t);
  EXPECT_EQ(spin.PollUntil(t + microseconds(1)), t + microseconds(1));
}

TEST(ReplySpinTest, OneSpinRunningOutDoesNotStopPolling) {
  ReplySpin spin(kWindow);
  auto t = T0();
  for (int round = 0; round < 10; ++round) {
    spin.Found();
    spin.Replied(t);
    t += microseconds(5);
    ASSERT_GT(spin.PollUntil(t), t);
    // A slow reply from a polling daemon: the spin runs out, the reply follows.
    t += kWindow;
    spin.Missed(t);
    t += microseconds(20);
    spin.Replied(t);
    t += microseconds(5);
    // Then fast replies again, found by spinning.
    ASSERT_GT(spin.PollUntil(t), t) << "round " << round;
    spin.Found();
    spin.Replied(t + microseconds(8));
    t += microseconds(10);
  }
}

TEST(ReplySpinTest, MissesInARowPausePollingThenItResumes) {
  ReplySpin spin(kWindow);
  auto t = T0();
  spin.Found();
  spin.Replied(t);
  Clock::time_point paused_at;
  for (uint32_t i = 0; i < ReplySpin::kMissesBeforePause; ++i) {
    t += microseconds(5);
    ASSERT_GT(spin.PollUntil(t), t) << "miss " << i << " has not paused polling yet";
    t += kWindow;
    spin.Missed(t);
    paused_at = t;
    t += microseconds(30);  // A daemon that does not poll answers after its wake-up.
    spin.Replied(t);
  }
  t += microseconds(5);
  EXPECT_EQ(spin.PollUntil(t), t) << "paused after misses in a row";
  spin.Replied(t + microseconds(30));
  t = paused_at + ReplySpin::kPause - microseconds(10);
  spin.Replied(t);
  EXPECT_EQ(spin.PollUntil(t + microseconds(5)), t + microseconds(5)) << "still paused";
  t = paused_at + ReplySpin::kPause + microseconds(1);
  spin.Replied(t);
  EXPECT_GT(spin.PollUntil(t + microseconds(5)), t + microseconds(5)) << "the pause is over";
}

TEST(ReplySpinTest, AReplyFoundBySpinningStartsTheCountAgain) {
  ReplySpin spin(kWindow);
  auto t = T0();
  spin.Found();
  spin.Replied(t);
  // Misses interleaved with found replies never add up to a pause.
  for (int i = 0; i < 20; ++i) {
    for (uint32_t k = 0; k + 1 < ReplySpin::kMissesBeforePause; ++k) {
      t += microseconds(5);
      ASSERT_GT(spin.PollUntil(t), t);
      t += kWindow;
      spin.Missed(t);
      spin.Replied(t + microseconds(3));
      t += microseconds(3);
    }
    t += microseconds(5);
    ASSERT_GT(spin.PollUntil(t), t) << "i " << i;
    t += microseconds(7);
    spin.Found();
    spin.Replied(t);
  }
}

}  // namespace
}  // namespace kvtier::client_internal
