// BlockTable: the engine's blocks — one Record each, its state, its slot in a
// tier and its holders — the slots of both tiers, and the shared index that
// publishes the blocks to clients.
//
// Invariants (verified by engine_inspector.h):
//  - a live record (state != kFree) owns its slot in `tier`, and while moving
//    also `dst_slot` in the other tier; every other used slot is a write lease's;
//  - a live record is indexed under its key unless it is doomed (freed while
//    moving or pinned: its slots come free when its copy lands or its last
//    reader goes);
//  - `refs` counts the session chains holding it, `readers` the read leases;
//  - a block's stored parent (its index row) is the null key or the key of a
//    block of the same tenant: lookups check the tenant of block 0 only.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "block_index.h"
#include "kvtier/block_key.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/engine.h"
#include "slot_allocator.h"
#include "tenant_ledger.h"

namespace kvtier::tiering {

enum class BlockState : uint8_t { kFree, kReady, kDemoting, kPromoting };

constexpr Tier OtherTier(Tier t) { return t == Tier::kGpu ? Tier::kHost : Tier::kGpu; }

struct Record {
  BlockKey key;
  uint64_t last_use = 0;  // Clock of the last use through a session; orders demotion.
  uint64_t move_seq = 0;  // Fence sequence of the copy in flight; 0 until submitted.
  uint32_t slot = 0;      // Slot in `tier` (the source while moving).
  uint32_t dst_slot = 0;  // Slot in the other tier while moving.
  uint32_t refs = 0;      // Session chains holding it.
  uint32_t readers = 0;   // Read leases holding it.
  Tier tier = Tier::kGpu;
  BlockState state = BlockState::kFree;
  bool doomed = false;       // Out of the index; freed when its copy completes or its last reader goes.
  bool writing = false;      // A client's GPU is still writing it: not served, not moved (pinned).
  bool spilled = false;      // Offered to the stores as landed (or imported from one): not offered again.
  bool checksummed = false;  // `checksum` holds the host-tier payload's XXH3 (warm restart).
  uint64_t checksum = 0;
  // The GpuShare epoch in which it was marked as over its tenant's fair share
  // of the GPU tier: new read leases stop before it, so it can be demoted once
  // the older ones end (gpu_share.h). Stale epochs mean nothing.
  uint32_t share_epoch = 0;
  TenantAccount* tenant = nullptr;  // Its namespace and `model` recompute the key (warm restart).
  ModelId model;                    // The identity it was keyed with.

  bool moving() const { return state == BlockState::kDemoting || state == BlockState::kPromoting; }
  // Readable in `tier` and not moving.
  bool ReadyIn(Tier t) const { return state == BlockState::kReady && tier == t; }
  // Ready in `tier` and leased by no reader: it may be moved or dropped.
  bool IdleIn(Tier t) const { return ReadyIn(t) && readers == 0; }
  bool held() const { return refs != 0 || readers != 0; }
  const Namespace& ns() const { return tenant->tenant.ns; }
  Namespace key_ns() const { return KeyNamespace(tenant->tenant.ns, model); }
};

class BlockTable {
 public:
  BlockTable(BlockIndex index, uint32_t gpu_slots, uint32_t host_slots);

  Record& operator[](uint32_t r) { return records_[r]; }
  const Record& operator[](uint32_t r) const { return records_[r]; }
  uint32_t capacity() const { return static_cast<uint32_t>(records_.size()); }
  uint32_t free_records() const { return static_cast<uint32_t>(free_.size()); }
  // Live records (indexed, plus doomed ones whose copy is in flight).
  uint32_t live() const { return capacity() - free_records(); }

  SlotAllocator& slots(Tier tier) { return slots_[tier]; }
  const SlotAllocator& slots(Tier tier) const { return slots_[tier]; }
  BlockIndex& index() { return index_; }
  const BlockIndex& index() const { return index_; }

  // Publishes a new block of `tenant` whose bytes are in `slot` of `tier`: a
  // record, its row (parent and tokens) and its index entry. Returns its id.
  // REQUIRES: `key` not indexed, a free record, `slot` allocated to the caller.
  uint32_t Publish(const BlockKey& key, const BlockKey& parent, std::span<const TokenId> tokens, TenantAccount& tenant,
                   const ModelId& model, Tier tier, uint32_t slot);
  // Takes a block out of the index and the tenant's counts. Its slot comes free
  // now, or, if it is moving, both slots when the copy lands (it is doomed).
  // REQUIRES: held by no one, not doomed.
  void Unpublish(uint32_t r);
  // Takes a block out of the index and the tenant's counts, keeping its slots
  // until Unpublish's rules free them (FreeDoomed). REQUIRES: not doomed.
  void Doom(uint32_t r);
  // Frees the slot and record of a doomed block once it is neither moving nor
  // read. Returns whether it did.
  bool FreeDoomed(uint32_t r);
  // Returns the record of a block whose slots were freed to the free list.
  void Retire(uint32_t r);
  // A copy of block `r` from `from` landed: it is in rec.tier now.
  void Moved(uint32_t r, Tier from);
  // Bumped by every change to what a prefix match reads: a block published,
  // unpublished or doomed, or marked written or not (Changed). A PrefixMatch
  // made at one generation holds while it lasts. Starts at 1.
  uint64_t generation() const { return generation_; }
  void Changed() { ++generation_; }
  // Told of every block published, moved, unpublished or doomed (KV events).
  void set_observer(std::function<void(const BlockEvent&)> observer) { observer_ = std::move(observer); }

 private:
  BlockIndex index_;
  PerTier<SlotAllocator> slots_;
  std::vector<Record> records_;
  std::vector<uint32_t> free_;
  std::function<void(const BlockEvent&)> observer_;
  uint64_t generation_ = 1;

  void Removed(const Record& rec) {
    if (observer_) observer_(BlockEvent{BlockEventKind::kRemoved, rec.key, {}, rec.tier, rec.tier, {}});
  }
};

}  // namespace kvtier::tiering
