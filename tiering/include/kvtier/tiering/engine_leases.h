// What an Engine's lease calls give and take (engine.h): write leases of GPU
// slots and their commits, read leases of a cached prefix and their promotion
// fence, a client's GPU work to wait for, blocks a store returned, and what the
// lease timeout revoked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/backend.h"

namespace kvtier::tiering {

using LeaseId = uint64_t;

struct BlockLocation {
  Tier tier = Tier::kGpu;
  uint32_t slot = 0;
};

struct WriteLease {
  LeaseId id = 0;
  std::vector<uint32_t> slots;  // GPU-tier slots reserved for the caller to write.
};

struct ReadLease {
  LeaseId id = 0;                     // 0 when nothing was leased.
  uint32_t matched = 0;               // Blocks of the prefix found in the cache.
  std::vector<BlockLocation> blocks;  // The leased prefix (<= matched), in order.
  Fence fence;                        // Completes when every promoted block has landed.
  uint32_t promoted = 0;              // Blocks whose host->gpu copy this lease waits for.
  uint32_t imported = 0;              // Of `matched`: placed from FetchedBlocks.
};

// What one ExpireLeases call revoked.
struct LeaseExpiry {
  uint32_t write = 0;    // Write leases revoked.
  uint32_t read = 0;     // Read leases revoked.
  uint32_t slots = 0;    // GPU slots the write leases gave back.
  uint32_t records = 0;  // Blocks the read leases unpinned.
  bool more = false;     // Expired leases are left for the next call (the work bound).
  uint32_t leases() const { return write + read; }
};

// A client's GPU work on GPU-tier blocks or slots: a watch on the
// interprocess event it recorded after that work (Backend::WatchClientEvent).
// An engine handed one owns the watch from then on, whatever the call returns:
// it ends it (Backend::EndWatch) once the work is done, or at destruction.
struct GpuWork {
  uint64_t watch = 0;   // 0: no GPU work to wait for (host backend, or done).
  uint64_t client = 0;  // Whose event it is (ClientGone).
  bool none() const { return watch == 0; }
};

// Blocks a store below the host tier returned for an Acquire (their records
// verified by the caller): payloads[i] holds the bytes of block start + i of
// the acquired keys (each the host pool's slot size).
struct FetchedBlocks {
  uint32_t start = 0;  // The cached prefix the fetch continued (what Match said).
  std::vector<std::span<const std::byte>> payloads;
};

// One request's prefix match (Engine::Match), kept for its later calls, so a
// request walks its prefix once. The fields are the engine's: callers read
// `matched` and otherwise only pass it back, with the same arguments.
struct PrefixMatch {
  uint32_t matched = 0;           // Blocks of the longest cached prefix.
  std::vector<uint32_t> records;  // Theirs, in order.
  uint64_t generation = 0;        // The blocks' generation when matched; 0: not matched yet.
  size_t keys = 0;                // How many keys it was matched against.
  Namespace ns;
  ModelId model;
};

struct CommitResult {
  uint32_t stored = 0;      // New blocks published (duplicates not counted).
  uint32_t duplicates = 0;  // Blocks that were already cached; their slots were freed.
};

// Engine::Save's choices beyond a Commit's.
struct SaveOptions {
  // The session takes the cached chain ending at `parent` as its first
  // start_block blocks when it does not hold it already.
  bool adopt = false;
  // The lease is granted again holding up to this many slots (its uncommitted
  // ones first, then free ones, never waiting); 0: only what it holds.
  uint32_t refill = 0;
};
struct SaveResult {
  CommitResult committed;
  uint32_t adopted = 0;  // Blocks the session took as its chain (0: it held them).
  BlockKey last;         // The key of the session's last block now.
  WriteLease lease;      // The lease granted again: id 0 when it holds nothing (ended).
};

// The work bound of one ExpireLeases call, in slots and blocks given back.
inline constexpr uint32_t kLeaseExpiryWork = 16384;

}  // namespace kvtier::tiering
