// LeaseTable: the engine's live leases by id, and what is kept of the leases
// the timeout revoked until their holders release them.
//
// A write lease reserves GPU slots for its tenant to write into (counted in
// the tenant's `leased`); a read lease pins blocks (each counted in its
// record's `readers`). The table keeps leases; taking and giving back what
// they hold is the engine's (Engine::Impl::EndLease).
//
// Invariants: ids only grow, so id order is grant order and the leases past
// the timeout are always the oldest ones; an id is live or revoked, never
// both; the counts of live write and read leases are the table's.
// Not thread-safe: the engine's thread owns it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kvtier/tiering/engine_leases.h"

namespace kvtier::tiering {

struct TenantAccount;

struct WriteSlots {
  std::vector<uint32_t> slots;
  TenantAccount* tenant = nullptr;  // Never null.
};
struct ReadRecords {
  std::vector<uint32_t> records;
  bool promote_after = false;  // Its host-tier blocks go to the GPU tier when it is released.
};
struct Lease {
  std::variant<WriteSlots, ReadRecords> held;
  std::chrono::steady_clock::time_point granted;
  bool write() const { return std::holds_alternative<WriteSlots>(held); }
  // Slots or blocks it holds: the work of ending it.
  size_t size() const;
};
// What is kept of a lease the timeout revoked, until its holder releases it.
struct RevokedLease {
  bool write = false;
  std::chrono::milliseconds held{0};     // Its age when it was revoked.
  std::chrono::milliseconds timeout{0};  // The lease timeout then.
};
// "write lease 7 expired after 30012 ms (limits.lease_timeout_ms: 30000)".
std::string DescribeExpired(LeaseId id, const RevokedLease& r);

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Grants a lease holding `held`, now. Returns its id.
  LeaseId Grant(std::variant<WriteSlots, ReadRecords> held);
  // The live write (read) lease `id`; nullptr if there is none.
  WriteSlots* FindWrite(LeaseId id);
  ReadRecords* FindRead(LeaseId id);
  // Takes live lease `id` out of the table (its holder released it); nullopt if there is none.
  std::optional<Lease> Take(LeaseId id);

  // Whether the timeout revoked lease `id` and its holder has not released it yet.
  bool IsRevoked(LeaseId id) const { return revoked_.count(id) != 0; }
  // What was kept of revoked lease `id`; nullptr if it was not revoked, or was released since.
  const RevokedLease* FindRevoked(LeaseId id) const;
  // Forgets revoked lease `id`, which its holder released: what was kept, or nullopt.
  std::optional<RevokedLease> ForgetRevoked(LeaseId id);

  // Revokes the leases granted `timeout` or longer before `now`, oldest first,
  // handing each to `end(Lease&)` to give back what it holds, and keeps what
  // FindRevoked reports of it. Stops before the next one once the leases
  // revoked held `work_limit` slots and blocks (each lease counts one more, so
  // empty ones are bounded too). Returns true if expired leases are left.
  template <typename End>
  bool RevokeExpired(Clock::time_point now, std::chrono::milliseconds timeout, size_t work_limit, End&& end);

  bool empty() const { return live_.empty(); }
  size_t size() const { return live_.size(); }
  uint32_t write_count() const { return writes_; }
  uint32_t read_count() const { return static_cast<uint32_t>(live_.size()) - writes_; }
  // When the oldest live lease was granted; nullopt if there is none.
  std::optional<Clock::time_point> OldestGrant() const;
  // The id the next grant gets: every id granted is below it.
  LeaseId next_id() const { return next_id_; }
  // Calls f(id, lease) for every live lease, in grant order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const auto& [id, lease] : live_) f(id, lease);
  }

 private:
  // Takes the oldest lease out and keeps it as revoked at `now`. REQUIRES: !empty().
  Lease RevokeOldest(Clock::time_point now, std::chrono::milliseconds timeout);
  void Forget(const Lease& lease) { writes_ -= lease.write() ? 1 : 0; }

  std::map<LeaseId, Lease> live_;  // By id, which is grant order: the oldest first.
  std::unordered_map<LeaseId, RevokedLease> revoked_;
  LeaseId next_id_ = 1;
  uint32_t writes_ = 0;  // Live write leases.
};

template <typename End>
bool LeaseTable::RevokeExpired(Clock::time_point now, std::chrono::milliseconds timeout, size_t work_limit, End&& end) {
  size_t work = 0;
  while (!live_.empty() && now - live_.begin()->second.granted >= timeout) {
    if (work >= work_limit) return true;
    Lease lease = RevokeOldest(now, timeout);
    work += lease.size() + 1;
    end(lease);
  }
  return false;
}

}  // namespace kvtier::tiering
