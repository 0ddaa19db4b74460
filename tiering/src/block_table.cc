// BlockTable: the engine's block records, slots and index entries (block_table.h).
#include "block_table.h"

namespace kvtier::tiering {

BlockTable::BlockTable(BlockIndex index, uint32_t gpu_slots, uint32_t host_slots)
    : index_(std::move(index)), slots_{{SlotAllocator(gpu_slots), SlotAllocator(host_slots)}} {
  const uint32_t n = gpu_slots + host_slots;
  records_.resize(n);
  free_.reserve(n);
  for (uint32_t r = n; r > 0; --r) free_.push_back(r - 1);
}

uint32_t BlockTable::Publish(const BlockKey& key, const BlockKey& parent, std::span<const TokenId> tokens,
                             TenantAccount& tenant, const ModelId& model, Tier tier, uint32_t slot) {
  const uint32_t r = free_.back();
  free_.pop_back();
  Record& rec = records_[r];
  rec = Record{};
  rec.key = key;
  rec.slot = slot;
  rec.tier = tier;
  rec.state = BlockState::kReady;
  rec.tenant = &tenant;
  rec.model = model;
  index_.WriteRow(r, parent, tokens);
  index_.Insert(key, r, NamespaceTag(rec.key_ns()), tier);
  ++generation_;
  tenant.Published(tier);
  if (observer_) observer_(BlockEvent{BlockEventKind::kStored, key, parent, tier, tier, tokens});
  return r;
}

void BlockTable::Moved(uint32_t r, Tier from) {
  if (!observer_) return;
  const Record& rec = records_[r];
  // Its row (parent and tokens) stays while it is indexed: a format that
  // reports a move as a new store (the vLLM one) needs them.
  observer_(BlockEvent{
      BlockEventKind::kMoved, rec.key, index_.parent(r), rec.tier, from, {index_.tokens(r), index_.block_tokens()}});
}

void BlockTable::Unpublish(uint32_t r) {
  Record& rec = records_[r];
  index_.Erase(rec.key);
  ++generation_;
  rec.tenant->Unpublished(rec.tier, rec.moving());
  Removed(rec);
  if (rec.moving()) {
    rec.doomed = true;  // The copy completes later; then both slots come free.
    return;
  }
  slots_[rec.tier].Free(rec.slot);
  Retire(r);
}

void BlockTable::Doom(uint32_t r) {
  Record& rec = records_[r];
  index_.Erase(rec.key);
  ++generation_;
  rec.tenant->Unpublished(rec.tier, rec.moving());
  Removed(rec);
  rec.doomed = true;
}

bool BlockTable::FreeDoomed(uint32_t r) {
  Record& rec = records_[r];
  if (!rec.doomed || rec.moving() || rec.readers != 0) return false;
  slots_[rec.tier].Free(rec.slot);
  Retire(r);
  return true;
}

void BlockTable::Retire(uint32_t r) {
  records_[r].state = BlockState::kFree;
  free_.push_back(r);
}

}  // namespace kvtier::tiering
