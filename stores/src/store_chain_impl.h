// StoreChain's insides, shared by its two halves: store_chain.cc (the chain,
// the writes, the events, the I/O thread) and store_fetch.cc (the fetches and
// their turns). Private to the library.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fetch_turns.h"
#include "kvtier/stores/store_chain.h"

namespace kvtier::stores {
namespace chain_detail {

using Clock = std::chrono::steady_clock;

// How much nicer than the daemon the store I/O thread runs (Run).
inline constexpr int kIoNice = 5;

inline uint64_t MicrosSince(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}

// The counters of one store, written by the I/O thread (and Offer), read by stats().
struct Counters {
  std::atomic<uint64_t> hit_blocks{0}, miss_blocks{0}, fetched_bytes{0}, fetches{0}, fetch_us{0};
  std::atomic<uint64_t> put_blocks{0}, put_bytes{0}, puts{0}, put_us{0}, put_dropped{0};
  std::atomic<uint64_t> errors{0}, corrupt{0}, foreign{0}, forged{0}, queued_bytes{0};
};

}  // namespace chain_detail

struct StoreChain::Impl {
  using Clock = chain_detail::Clock;
  using Counters = chain_detail::Counters;

  struct Queued {
    StoreItem item;
    bool reported = false;  // Offer's.
  };
  struct Member {
    ChainedStore chained;
    Counters counters;
    std::deque<Queued> queue;  // Guarded by mu.
  };
  // A fetch under way. The I/O thread works on it without holding mu, so its
  // progress fields are that thread's alone; what the engine thread reads
  // (ready, cancelled) is guarded by mu.
  struct Fetch {
    uint64_t id = 0;
    FetchRequest request;
    Clock::time_point started;
    // The I/O thread's alone.
    std::vector<std::string> names;  // Each key's name in the stores.
    size_t chunk_blocks = 1;         // Records asked per turn.
    size_t si = 0;                   // The store asked now.
    bool in_store = false;           // Store si was asked for this fetch already.
    size_t store_from = 0;           // `have` when store si was first asked.
    size_t store_served = 0;         // Of those, what store si served.
    size_t have = 0;                 // Blocks verified so far, from the first.
    // Guarded by mu.
    FetchResult ready;  // Verified records not taken yet (payloads unset), and the first error.
    bool cancelled = false;
  };
  // What one turn of a fetch brought.
  struct Turn {
    std::vector<StoreValue> records;
    std::vector<uint8_t> store;
    Status status;
    bool finished = false;
  };

  StoreChainOptions options;
  std::function<void()> notify;
  std::vector<std::unique_ptr<Member>> members;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::condition_variable room;  // Queued bytes went down (WaitForRoomUntil).
  std::optional<Clock::time_point> wait_for_room_until;
  bool stopping = false;
  std::chrono::milliseconds drain{2000};
  std::unordered_map<uint64_t, std::unique_ptr<Fetch>> running;  // Under way (queued or in a turn).
  FetchTurns turns;  // Whose turn is next among those running.
  std::unordered_map<uint64_t, FetchResult> done;  // Completed, not taken yet.
  uint64_t next_fetch = 1;
  std::atomic<uint64_t> queued_total{0};
  std::thread io;

  // Block events (options.max_events > 0).
  std::mutex events_mu;
  std::vector<StoreEvent> events;  // Guarded by events_mu.
  std::atomic<uint64_t> dropped_events{0};
  // Keys the store being called evicted during the call (the I/O thread's
  // alone): reported once the call returned, after what it wrote.
  std::vector<std::pair<uint8_t, BlockKey>> evicted;

  bool collecting() const { return options.max_events > 0; }
  void Report(StoreEvent e);
  // The I/O thread: store `si` answered for keys[at] on (it did not error)
  // and holds `held` of them intact: the first it lacks is gone.
  void ReportGone(size_t si, std::span<const BlockKey> keys, size_t held);
  void ReportEvicted();

  void Run();
  // Gives the next fetch in turn one turn (store_fetch.cc). REQUIRES: mu held, turns not empty.
  void TakeTurn(std::unique_lock<std::mutex>& lock);
  // One turn of fetch `f`: one chunk from one store (a whole locate).
  Turn FetchTurn(Fetch& f);
  Turn LocateTurn(Fetch& f);
  // Moves f's ready records into a result with payloads pointing into them. REQUIRES: mu held.
  FetchResult TakeReadyOf(Fetch& f);
  std::vector<std::string> StoreKeys(const FetchRequest& r) const;
  // Writes one batch of some store's queue; false if every queue was empty.
  bool PutOneBatch(std::unique_lock<std::mutex>& lock);
};

}  // namespace kvtier::stores
