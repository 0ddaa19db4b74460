// kvtierd's side of the KV events helper (events_helper.h): starts it, hands
// it batches without ever waiting, and starts it again when it dies.
//
// The loop's thread owns a link. Send queues a batch for the helper (at most
// queue_batches wait; past that, or while no helper runs, the batch is
// dropped) and writes what the socket takes; Tick, at every tick, writes the
// rest, reaps a helper that ended (waitpid, WNOHANG: no SIGCHLD handler, so
// nothing to share with the server's signal handling), logs it and, after a
// backoff (100 ms, doubling to 5 s; back to 100 ms once a helper lived 10 s),
// starts another. The link keeps its own copy of the last replay_batches
// batches it queued and sends them to each new helper first, kept for replays
// only, so a replay after a restart still serves what came before.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "events/events_helper.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

class EventsLink {
 public:
  // Starts the helper and waits (at most 10 s) until it has bound both
  // endpoints; its error (a bind that failed) is returned as is.
  static Result<std::unique_ptr<EventsLink>> Start(HelperConfig config);
  // Closes the stream (the helper exits at EOF) and reaps the helper: waits
  // for it at most 2 s, then kills it. Batches not written yet are lost.
  ~EventsLink();
  EventsLink(const EventsLink&) = delete;
  EventsLink& operator=(const EventsLink&) = delete;

  // Queues `batch` (encoded, sequence number `seq`) for publishing. False:
  // dropped (no helper, queue full, or larger than kMaxFrameBody).
  bool Send(uint64_t seq, std::shared_ptr<const std::string> batch);
  // Writes what waits; reaps, logs and restarts the helper as needed.
  void Tick();

  // Helpers started after the first (each after one ended).
  uint64_t restarts() const { return restarts_.load(std::memory_order_relaxed); }
  uint64_t replays() const { return counters_->replays.load(std::memory_order_relaxed); }
  uint64_t replays_refused() const { return counters_->replays_refused.load(std::memory_order_relaxed); }
  pid_t helper_pid() const { return pid_; }  // -1 while none runs.

 private:
  using Clock = std::chrono::steady_clock;
  struct Out {
    FrameHeader header;
    std::shared_ptr<const std::string> body;
    size_t written = 0;  // Of header and body together.
  };
  EventsLink(HelperConfig config, int shm, HelperCounters* counters);
  Status Spawn();
  void Queue(FrameKind kind, uint64_t seq, std::shared_ptr<const std::string> body);
  void Pump();
  // Reads what the helper said (its "OK"/"ERR" line) into said_; false at EOF.
  bool Listen();
  // A helper that ended: reaped (true) or not yet.
  bool Reaped(bool wait);
  // Forgets the helper that ended with `status`; `log`: says so (rate-limited).
  void Ended(int status, bool log);

  const HelperConfig config_;
  const std::shared_ptr<const std::string> config_frame_;
  const int shm_;
  HelperCounters* const counters_;
  int sock_ = -1;    // Our end of the stream; -1 while no helper runs.
  pid_t pid_ = -1;   // The helper; -1 once reaped.
  bool stopping_ = false;  // In the destructor: an ending helper is expected.
  bool broken_ = false;  // The stream failed (EPIPE): the helper is ending.
  std::string said_;
  std::deque<Out> out_;
  size_t queued_batches_ = 0;  // kPublish frames in out_.
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> kept_;
  Clock::time_point started_, restart_at_;
  std::chrono::milliseconds backoff_{kFirstBackoff};
  std::atomic<uint64_t> restarts_{0};

  static constexpr std::chrono::milliseconds kFirstBackoff{100};
  static constexpr std::chrono::milliseconds kMaxBackoff{5000};
  static constexpr std::chrono::seconds kLivedLongEnough{10};
};

}  // namespace kvtier::daemon
