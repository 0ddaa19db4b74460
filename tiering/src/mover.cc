// Mover: block copies between tiers, their batches and fences (mover.h).
#include "mover.h"

#include <algorithm>

namespace kvtier::tiering {
namespace {

constexpr int Stream(CopyDirection d) { return static_cast<int>(d); }
constexpr Tier Source(CopyDirection d) { return d == CopyDirection::kGpuToHost ? Tier::kGpu : Tier::kHost; }

}  // namespace

Mover::Mover(Backend& backend, const PerTier<std::unique_ptr<Pool>>& pools, BlockTable& blocks)
    : backend_(backend), pools_(pools), blocks_(blocks) {}

Mover::~Mover() {
  for (auto& q : inflight_) {
    if (!q.empty()) (void)backend_.Wait(q.back().fence, std::chrono::seconds(30));
  }
}

void Mover::Schedule(uint32_t r, CopyDirection dir) {
  Record& rec = blocks_[r];
  rec.dst_slot = blocks_.slots(OtherTier(rec.tier)).Allocate();
  rec.state = dir == CopyDirection::kGpuToHost ? BlockState::kDemoting : BlockState::kPromoting;
  rec.move_seq = 0;
  if (dir == CopyDirection::kGpuToHost) ++demoting_;
  rec.tenant->MoveStarted(rec.tier);
  blocks_.index().SetLocation(rec.key, rec.tier, true);
  pending_[Stream(dir)].push_back(r);
}

void Mover::Flush(CopyDirection dir, uint32_t max_batch) {
  std::vector<uint32_t>& q = pending_[Stream(dir)];
  const Pool& src = *pools_[Source(dir)];
  const Pool& dst = *pools_[OtherTier(Source(dir))];
  std::vector<CopyOp> ops;
  for (size_t begin = 0; begin < q.size(); begin += max_batch) {
    const size_t end = std::min(q.size(), begin + size_t{max_batch});
    ops.clear();
    for (size_t i = begin; i < end; ++i) ops.push_back(CopyOp{blocks_[q[i]].slot, blocks_[q[i]].dst_slot});
    Result<Fence> fence = backend_.SubmitCopies(dir, src, dst, ops);
    Batch batch;
    batch.records.assign(q.begin() + static_cast<std::ptrdiff_t>(begin), q.begin() + static_cast<std::ptrdiff_t>(end));
    if (!fence.ok()) {
      for (uint32_t r : batch.records) Cancel(r);
      continue;
    }
    for (uint32_t r : batch.records) blocks_[r].move_seq = fence->seq;
    batch.fence = *fence;
    inflight_[Stream(dir)].push_back(std::move(batch));
  }
  q.clear();
}

void Mover::FlushAll(uint32_t max_batch) {
  for (int d = 0; d < kCopyStreams; ++d) Flush(static_cast<CopyDirection>(d), max_batch);
}

void Mover::Cancel(uint32_t r) {
  Record& rec = blocks_[r];
  if (rec.state == BlockState::kDemoting) --demoting_;
  if (!rec.doomed) rec.tenant->MoveEnded(rec.tier, /*landed=*/false);
  blocks_.slots(OtherTier(rec.tier)).Free(rec.dst_slot);
  rec.state = BlockState::kReady;
  if (rec.doomed) {
    blocks_.slots(rec.tier).Free(rec.slot);
    blocks_.Retire(r);
    return;
  }
  blocks_.index().SetLocation(rec.key, rec.tier, false);
}

void Mover::Complete(uint32_t r) {
  Record& rec = blocks_[r];
  const bool demote = rec.state == BlockState::kDemoting;
  if (demote && (rec.readers > 0 || rec.doomed)) {
    Cancel(r);  // Leased in the GPU tier meanwhile (or freed): the GPU copy stays.
    return;
  }
  if (demote) --demoting_;
  if (!rec.doomed) rec.tenant->MoveEnded(rec.tier, /*landed=*/true);
  blocks_.slots(rec.tier).Free(rec.slot);
  rec.tier = OtherTier(rec.tier);
  rec.slot = rec.dst_slot;
  rec.state = BlockState::kReady;
  rec.checksummed = false;
  if (demote) ++demoted_; else ++promoted_;
  if (rec.doomed) {
    blocks_.slots(rec.tier).Free(rec.slot);
    blocks_.Retire(r);
    return;
  }
  blocks_.index().SetLocation(rec.key, rec.tier, false);
  blocks_.Moved(r, OtherTier(rec.tier));
  if (demote && landed_) landed_(r);
}

uint32_t Mover::Poll() {
  uint32_t settled = 0;
  for (auto& q : inflight_) {
    while (!q.empty() && backend_.IsComplete(q.front().fence)) {
      for (uint32_t r : q.front().records) Complete(r);
      settled += static_cast<uint32_t>(q.front().records.size());
      q.pop_front();
    }
  }
  return settled;
}

bool Mover::WaitOldestDemotion(std::chrono::milliseconds timeout) {
  auto& demotions = inflight_[Stream(CopyDirection::kGpuToHost)];
  if (demotions.empty() || !backend_.Wait(demotions.front().fence, timeout).ok()) return false;
  Poll();
  return true;
}

Status Mover::WaitIdle(std::chrono::milliseconds timeout) {
  for (auto& q : inflight_) {
    if (!q.empty()) KVTIER_RETURN_IF_ERROR(backend_.Wait(q.back().fence, timeout));
  }
  Poll();
  return Status::Ok();
}

bool Mover::in_flight() const {
  for (const auto& q : inflight_) {
    if (!q.empty()) return true;
  }
  return false;
}

uint32_t Mover::copies_in_flight() const {
  uint32_t n = 0;
  for (const auto& q : inflight_) {
    for (const Batch& b : q) n += static_cast<uint32_t>(b.records.size());
  }
  return n;
}

}  // namespace kvtier::tiering
