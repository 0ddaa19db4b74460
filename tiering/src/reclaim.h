// Reclaimer: how the engine makes room in a tier. The policy (which sessions
// are coldest) comes from the session table; this decides what to do with
// them: demote the coldest GPU blocks to the host tier, drop the tails of the
// coldest sessions, enforce the watermarks, make room under a tenant's quota.
//
// Only idle blocks (ready in the tier, leased by no reader) are demoted or
// dropped; a dropped block is reported as lost to pressure. Not thread-safe:
// the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/tiering/engine.h"

namespace kvtier::tiering {

struct Record;
struct Session;
struct TenantAccount;

class Reclaimer {
 public:
  explicit Reclaimer(Engine::Impl& engine) : engine_(engine) {}

  // Cuts the tails of the coldest sessions while their last block is idle in
  // `tier`, until `need` slots of `tier` came free. With `only`, just that
  // tenant's sessions, except `keep`. Returns the slots freed.
  uint32_t DropFromTier(Tier tier, uint32_t need, const TenantAccount* only = nullptr,
                        const Session* keep = nullptr);
  // How many slots DropFromTier(tier, need, only, keep) would free (up to
  // `need`); changes nothing.
  uint32_t Droppable(Tier tier, uint32_t need, const TenantAccount* only = nullptr,
                     const Session* keep = nullptr) const;

  // Schedules demotion of up to `need` GPU blocks, coldest sessions first, and
  // submits it. A block used by a warmer session since this session's last use
  // is left for that session's turn unless a first walk found too few. With
  // `only`, just that tenant's blocks, and host room is made from that
  // tenant's blocks too; without, a block whose tenant is at its host quota is
  // skipped. Returns how many were scheduled.
  uint32_t DemoteColdest(uint32_t need, const TenantAccount* only = nullptr);
  // Starts freeing GPU slots by demotion (never loss) until `count` are free
  // once the demotions in flight land. Never waits.
  void MakeGpuRoom(uint32_t count);
  // Waits (at most `timeout` per copy batch) until `count` GPU slots are free
  // or no demotion is in flight. For the blocking Allocate and Acquire only.
  void WaitForGpuRoom(uint32_t count, std::chrono::milliseconds timeout);
  // Demotes above the GPU high watermark, drops above the host high watermark,
  // each down to its low watermark.
  void EnforceWatermarks();
  // Makes room under the tenant's GPU quota for `n` more blocks or leased
  // slots, `credit` of what it holds now being the request's own (the slots of
  // the write lease a commit publishes): its coldest GPU blocks are demoted,
  // then dropped if that makes enough room (never those of session `keep`).
  // kResourceExhausted naming the tenant and quota when that cannot make room,
  // its message led by `what` ("commit of 3 new blocks").
  Status MakeQuotaRoom(TenantAccount& tenant, uint32_t n, const Session* keep, const std::string& what,
                       uint32_t credit = 0);
  // The same under the tenant's fair share of the GPU tier (gpu_share.h), for
  // an Allocate of `n` while another tenant waits: its error names the share.
  // OK when the share does not apply to the tenant.
  Status MakeShareRoom(TenantAccount& tenant, uint32_t n, const std::string& what);
  // While a tenant waits for GPU room: every tenant over its fair share has
  // its idle GPU blocks past the share demoted, and as many of its pinned
  // ones as it holds past the share after that marked (Record::share_epoch;
  // tails of its coldest sessions first, then the deepest blocks of its read
  // leases that no session holds), so that its new read leases stop
  // before them and they are demoted once its older leases end (or freed,
  // when no session holds them).
  void ReclaimShares();
  // Makes host room under `s`'s tenant's quota and in the host tier for
  // demoting `want` of its blocks, dropping colder host blocks. For Demote.
  void MakeHostRoomFor(const Session* s, uint32_t want);

 private:
  // MakeQuotaRoom's and MakeShareRoom's work under `limit`; `limit_text`
  // says what the limit is in the error.
  Status MakeRoomUnder(TenantAccount& tenant, uint32_t limit, uint32_t n, const Session* keep, const std::string& what,
                       uint32_t credit, const std::string& limit_text);
  // ReclaimShares for one tenant holding `excess` GPU blocks or slots past its share.
  void ReclaimShare(TenantAccount& tenant, uint32_t excess);
  // Marks up to `want` more of the tenant's GPU blocks pinned by its read
  // leases, the deepest in their prefixes first: those no session chain
  // reaches (a reader whose sessions are gone, or that never named one).
  void MarkLeased(TenantAccount& tenant, uint32_t want);
  // `rec` is marked in `epoch` and still holds a GPU slot of its tenant's.
  static bool Marked(const Record& rec, uint32_t epoch);

  Engine::Impl& engine_;
};

}  // namespace kvtier::tiering
