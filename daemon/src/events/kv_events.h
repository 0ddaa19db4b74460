// KV events: what kvtierd caches, published for cache-aware routers.
//
// The engines report every block stored, moved or removed and every session
// evicted (EngineOptions::on_block_event, on_session_evicted); the event loop
// adds each to the open batch (Add*) and closes it (Flush) at every tick, or
// when it holds events.max_batch_events. A closed batch gets the next sequence
// number and is encoded (msgpack, the format in docs/events.md) on
// the loop's thread, then handed to the events helper, a child process that
// owns the sockets (events_helper.h; kvtierd's side is events_link.h): it
// sends each batch on the PUB socket and keeps the last events.replay_batches
// for replays (ROUTER). What a peer does to those sockets (opening
// connections until the descriptors run out, which makes libzmq abort) ends
// the helper at worst; kvtierd starts another and goes on serving.
//
// Nothing here ever waits on a subscriber or on the helper: the PUB socket
// drops a slow subscriber's messages at its high-water mark (the subscriber
// sees the gap in sequence numbers and asks for a replay), and a batch the
// helper has no room for (events.queue_batches waiting), or that comes while
// no helper runs, is dropped and counted; its sequence number is then missing
// for every subscriber and in the replay.
//
// Messages on PUB: three frames [topic, seq (8 bytes, big-endian), batch].
// Replay (ROUTER): a DEALER sends [empty, start seq (8 bytes, big-endian)];
// kvtierd answers [empty, seq, batch] for each batch it keeps from `start`
// on, then [empty, 0xFFFFFFFFFFFFFFFF, empty] (the end).
//
// events.format picks the batch's encoding: kvtierd's own (the default), or
// vLLM's KVEventBatch (docs/design.md, "KV events"): a move is then a
// BlockStored where the block landed and a BlockRemoved where it was, a
// session eviction is not published, and replay answers carry the topic as
// vLLM's do: [empty, topic, seq, batch], the end [empty, empty, 0xFF..FF, empty].
// In that format only, what the stores below the host tier say of their
// blocks (AddStorage) is published in medium STORAGE: a BlockStored when a
// store wrote a block none was known to hold, a BlockRemoved when the last
// store believed to hold it was found without it (or evicted it).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "config/config.h"
#include "kvtier/status.h"
#include "kvtier/stores/store_chain.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::daemon {

struct EventCounters {
  std::atomic<uint64_t> events{0};           // Added to batches.
  std::atomic<uint64_t> batches{0};          // Closed (each took a sequence number).
  std::atomic<uint64_t> dropped_batches{0};  // Closed but not published: the helper had no room, or none ran.
  std::atomic<uint64_t> replays{0};          // Replay requests answered.
  std::atomic<uint64_t> replays_refused{0};  // Past the replay rate: answered with the end marker alone.
  std::atomic<uint64_t> last_seq{0};         // The last sequence number taken (0: none yet).
  std::atomic<uint64_t> storage_forgotten{0};  // STORAGE blocks removed past kMaxStorageBlocks.
  std::atomic<uint64_t> helper_restarts{0};    // Events helpers started after the first (each after one ended).
};

class EventPublisher {
 public:
  // Starts the events helper, which binds `publish` (PUB) and `replay`
  // (ROUTER); returns once both are bound (or with the helper's error). An ipc:// endpoint's socket file gets the daemon socket's group
  // and mode (`access`): events name every tenant's blocks. The first batch
  // (seq 1, sent at the first Flush) opens with a "cleared" event: whatever a
  // subscriber knew of `instance` is gone.
  static Result<std::unique_ptr<EventPublisher>> Start(const EventsConfig& config, const std::string& publish,
                                                       const std::string& replay, const AccessConfig& access,
                                                       uint64_t instance);
  // Stops and reaps the helper; batches not handed to it yet are lost.
  ~EventPublisher();
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // The loop's thread only, from here on. `counters().events` counts the
  // events encoded: two for a move in the vllm format.
  void AddBlock(std::string_view profile, uint32_t block_tokens, const tiering::BlockEvent& e);
  void AddSessionEvicted(std::string_view profile, std::string_view tenant, std::string_view session);
  // What the stores learnt of a block (StoreChain::TakeEvents). The vllm
  // format only (none is collected otherwise): the publisher keeps, per block
  // it announced in STORAGE, which stores hold it, for at most
  // kMaxStorageBlocks blocks; past that the oldest announced is forgotten and
  // published as removed (a router's view stays a subset of the stores').
  void AddStorage(const stores::StoreEvent& e);
  static constexpr size_t kMaxStorageBlocks = size_t{1} << 18;
  // Closes the open batch, if it holds any event, and hands it to the helper.
  // Called at every tick: also looks after the helper (reaps and restarts it).
  void Flush();

  // The replay counters are the helper's (read fresh from memory it shares).
  const EventCounters& counters() const;
  pid_t helper_pid() const;  // -1 while none runs.
  const std::string& publish_endpoint() const;
  const std::string& replay_endpoint() const;

 private:
  struct Impl;
  explicit EventPublisher(std::unique_ptr<Impl> impl);
  // One more event is in the open batch: closed once it holds max_batch_events.
  void Added();
  std::unique_ptr<Impl> impl_;
  mutable EventCounters counters_;  // counters() refreshes the helper's.
};

}  // namespace kvtier::daemon
