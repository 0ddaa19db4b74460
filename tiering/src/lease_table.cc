// LeaseTable: live leases in grant order, and the revoked ones (lease_table.h).
#include "lease_table.h"

namespace kvtier::tiering {

size_t Lease::size() const {
  if (const auto* write = std::get_if<WriteSlots>(&held)) return write->slots.size();
  return std::get<ReadRecords>(held).records.size();
}

std::string DescribeExpired(LeaseId id, const RevokedLease& r) {
  return std::string(r.write ? "write" : "read") + " lease " + std::to_string(id) + " expired after " +
         std::to_string(r.held.count()) + " ms (limits.lease_timeout_ms: " + std::to_string(r.timeout.count()) + ")";
}

LeaseId LeaseTable::Grant(std::variant<WriteSlots, ReadRecords> held) {
  const LeaseId id = next_id_++;
  Lease lease{std::move(held), Clock::now()};
  writes_ += lease.write() ? 1 : 0;
  live_.emplace_hint(live_.end(), id, std::move(lease));  // Ids only grow: the newest goes last.
  return id;
}

WriteSlots* LeaseTable::FindWrite(LeaseId id) {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : std::get_if<WriteSlots>(&it->second.held);
}

ReadRecords* LeaseTable::FindRead(LeaseId id) {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : std::get_if<ReadRecords>(&it->second.held);
}

std::optional<Lease> LeaseTable::Take(LeaseId id) {
  auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  auto node = live_.extract(it);
  Forget(node.mapped());
  return std::move(node.mapped());
}

const RevokedLease* LeaseTable::FindRevoked(LeaseId id) const {
  auto it = revoked_.find(id);
  return it == revoked_.end() ? nullptr : &it->second;
}

std::optional<RevokedLease> LeaseTable::ForgetRevoked(LeaseId id) {
  auto it = revoked_.find(id);
  if (it == revoked_.end()) return std::nullopt;
  const RevokedLease gone = it->second;
  revoked_.erase(it);
  return gone;
}

std::optional<LeaseTable::Clock::time_point> LeaseTable::OldestGrant() const {
  if (live_.empty()) return std::nullopt;
  return live_.begin()->second.granted;
}

Lease LeaseTable::RevokeOldest(Clock::time_point now, std::chrono::milliseconds timeout) {
  auto node = live_.extract(live_.begin());
  const LeaseId id = node.key();
  Lease lease = std::move(node.mapped());
  Forget(lease);
  const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - lease.granted);
  revoked_.emplace(id, RevokedLease{lease.write(), age, timeout});
  return lease;
}

}  // namespace kvtier::tiering
