// StoreChain: the ordered stores below the host tier (disk, then remote, as
// configured) and the one I/O thread that drives them, so that no store call
// ever runs on the daemon's engine thread.
//
// Writes: the engine thread offers each block that lands in the host tier and
// each block pressure drops from it (Offer); the record is encoded there (one
// copy of the payload) and queued for every store that takes it: a
// write-through store the blocks that land, a write-back store the blocks
// dropped. Queued bytes are bounded (max_queued_bytes): past it an offer is
// dropped and counted, never waited for.
//
// Reads: StartFetch queues a fetch of the blocks after a cached prefix; the I/O
// thread asks the stores in order for the longest continuation, verifies every
// record (VerifyBlockRecord) and stops at the first block no store holds
// intact. A record that fails is a miss, counted as corrupt, foreign or
// forged, never returned. A fetch proceeds in chunks (a Present and a Get of
// at most fetch_chunk_bytes of records), and the I/O thread takes the fetches
// under way in turns, one chunk each: round-robin over the key namespaces
// asking (tenants), then over each namespace's fetches. So a short fetch waits
// about one chunk per other tenant fetching, never for another tenant's whole
// fetch, and the verified prefix grows chunk by chunk: TakeReady moves it out
// while the fetch goes on. With options.record_key the I/O thread signs each
// record just before its Put, so the engine thread never pays for the MAC.
// Fetches go before queued writes. When one completes, `notify` is called (on
// the I/O thread); the engine thread then collects it with TakeFetch.
//
// Block events (StoreChainOptions::max_events > 0): the I/O thread notes each
// record a store wrote (of the blocks offered with `reported`), each block a
// fetch or locate asked a store for and found missing, corrupt or foreign
// there, and each block a store says it evicted (BlockStore::OnEvicted), in
// the order it learnt them, into a list of at most max_events (past it an
// event is dropped and counted, never waited for). TakeEvents empties it.
//
// Thread-safety: Offer, StartFetch, TakeFetch, TakeReady, CancelFetch and TakeEvents are
// called from one thread (the engine's); stats() and dropped_events() from any.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/stores/block_record.h"
#include "kvtier/stores/block_store.h"

namespace kvtier::stores {

struct ChainedStore {
  std::unique_ptr<BlockStore> store;
  // Blocks are written as they are committed or land in the host tier
  // (through: Offer's `dropped` false), or as pressure drops them from it (back).
  bool write_through = false;
};

struct StoreChainOptions {
  std::string key_prefix = "kvtier:";               // StoreKey's prefix: several deployments may share a store.
  uint64_t max_queued_bytes = uint64_t{256} << 20;  // Records waiting to be written, at most.
  uint32_t max_put_batch = 16;                      // Records per Put call.
  size_t max_events = 0;                            // StoreEvents kept until taken; 0: none are collected.
  // Records one fetch asks a store for per turn (at least one record): what
  // another tenant's fetch waits for at most per fetching tenant, and how
  // finely a fetch's ready prefix grows. 4 MiB is a few milliseconds of a
  // local Redis or disk, while one round trip per chunk stays a few percent.
  uint64_t fetch_chunk_bytes = uint64_t{4} << 20;
  // Records are signed with it (on the I/O thread, before each Put) and a
  // fetched record must verify under it; nullptr: unsigned records (block_record.h).
  std::shared_ptr<const RecordKey> record_key;
};

// What the I/O thread learnt about one block in one store.
struct StoreEvent {
  enum class Kind : uint8_t {
    kWritten,  // A Put of its record succeeded (a Put that failed, even in part, reports none of its records).
    kGone,     // Asked for by a fetch or locate and not there intact, or evicted by the store.
  };
  Kind kind = Kind::kWritten;
  uint8_t store = 0;  // Its index in the chain.
  BlockKey key;
  BlockKey parent;              // kWritten: the record's.
  std::vector<TokenId> tokens;  // kWritten: the record's.
};

struct FetchRequest {
  uint64_t profile_fingerprint = 0;
  size_t payload_bytes = 0;  // The profile's block bytes (the host pool's slot size).
  uint32_t block_tokens = 0;
  Namespace key_ns;  // The asking tenant's key namespace.
  BlockKey parent;   // The key of the block before the first (null for block 0).
  std::vector<BlockKey> keys;
  std::vector<TokenId> tokens;  // keys.size() * block_tokens; none when locating.
  // Only say where the blocks are: the store a fetch would read each of the
  // first blocks from (FetchResult::store), asked with Present alone, so no
  // record is read or verified and no store's fetch figures move.
  bool locate = false;
};

struct FetchResult {
  // The verified records of the first blocks asked for, in order; payloads[i]
  // points into records[i].
  std::vector<StoreValue> records;
  std::vector<std::span<const std::byte>> payloads;
  std::vector<uint8_t> store;  // Which store (index in the chain) served, or holds (locate), each.
  Status status;               // The first store error met (the fetch went on without that store).
  std::chrono::microseconds took{0};
  uint32_t blocks() const { return static_cast<uint32_t>(records.size()); }
};

// One store's figures since start.
struct StoreStats {
  std::string kind;
  std::string description;
  bool write_through = false;
  uint64_t hit_blocks = 0;   // Fetched and verified.
  uint64_t miss_blocks = 0;  // Asked of it and not served by it.
  uint64_t fetched_bytes = 0;
  uint64_t fetches = 0;   // Fetches that asked it.
  uint64_t fetch_us = 0;  // Their time in it, in all.
  uint64_t put_blocks = 0;
  uint64_t put_bytes = 0;
  uint64_t puts = 0;  // Put calls.
  uint64_t put_us = 0;
  uint64_t put_dropped = 0;            // Offers not queued: past max_queued_bytes.
  uint64_t errors = 0;                 // Calls that failed (unreachable, timed out, refused).
  uint64_t corrupt = 0;                // Records that failed their checksums or format.
  uint64_t foreign = 0;                // Records of another block, tenant, model or profile (or record key).
  uint64_t forged = 0;                 // Records unsigned or failing their MAC while a record key is set.
  uint64_t queued_bytes = 0;           // Waiting to be written now.
  std::vector<StoreCounter> counters;  // The store's own.
};

class StoreChain {
 public:
  // Starts the I/O thread. `notify` is called from it after each fetch
  // completes. With options.max_events, watches each store's evictions
  // (BlockStore::OnEvicted). REQUIRES: at least one store.
  StoreChain(std::vector<ChainedStore> stores, StoreChainOptions options, std::function<void()> notify);
  // Writes what is queued for at most `drain` (the rest is lost, counted
  // nowhere: the stores are caches), then stops the thread.
  ~StoreChain();
  StoreChain(const StoreChain&) = delete;
  StoreChain& operator=(const StoreChain&) = delete;

  // Queues the record of a block for the stores that take it: the
  // write-through ones when `dropped` is false, the write-back ones when true.
  // `reported`: its writes become StoreEvents (when they are collected).
  void Offer(const BlockRecordHeader& header, std::span<const TokenId> tokens, std::span<const std::byte> payload,
             bool dropped, bool reported = false);
  // Queues a fetch; returns its id.
  uint64_t StartFetch(FetchRequest request);
  // The result of fetch `id` once it completed (then forgotten), else nullopt.
  // After a TakeReady, only the blocks after those it returned.
  std::optional<FetchResult> TakeFetch(uint64_t id);
  // The verified records of fetch `id` ready now (the first blocks not taken
  // yet, in order), moved out while the fetch goes on for the rest: its later
  // TakeReady or TakeFetch returns the blocks after these. `*finished` says
  // whether the fetch is over (it completed, and this is the rest of it; or
  // the id is unknown): then it is forgotten, as by TakeFetch. Its status is
  // set only when finished.
  FetchResult TakeReady(uint64_t id, bool* finished);
  // The caller no longer wants fetch `id`: its result is discarded.
  void CancelFetch(uint64_t id);

  // The block events collected since the last call, oldest first (none
  // unless options.max_events > 0).
  std::vector<StoreEvent> TakeEvents();
  // Events not collected: the list held max_events. Thread-safe.
  uint64_t dropped_events() const;

  size_t size() const;
  // The key records are signed with (options.record_key), or nullptr.
  const RecordKey* record_key() const;
  // Every store's figures, in chain order. Thread-safe.
  std::vector<StoreStats> stats() const;
  // How long the destructor writes queued records for.
  void set_drain(std::chrono::milliseconds drain);
  // Until `until`, an Offer past max_queued_bytes waits for room instead of
  // being dropped (a shutdown, when nothing else waits on the caller).
  void WaitForRoomUntil(std::chrono::steady_clock::time_point until);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::stores
