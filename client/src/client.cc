// Client: libkvtier's API — each request built, sent through Connection, and its
// reply read against the connection it came on; probes straight from the
// shared index.
#include "kvtier/client.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "connection.h"

namespace kvtier {

using client_internal::Attachment;
using client_internal::Connection;
using client_internal::Resend;

namespace {

std::vector<BlockKey> KeysOn(const Attachment& att, std::span<const TokenId> tokens, const BlockKey& parent) {
  const uint32_t bt = att.welcome.profile.block_tokens;
  std::vector<BlockKey> keys(tokens.size() / bt);
  ComputeKeys(att.welcome.ns, parent, tokens, bt, keys);
  return keys;
}

}  // namespace

uint16_t ProtocolVersion() { return wire::kProtocolVersion; }

Client::Client(ClientOptions options)
    : options_(std::move(options)), connection_(std::make_shared<Connection>(options_)) {}

Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  KVTIER_RETURN_IF_ERROR(c->connection_->Reconnect());
  return c;
}

Status Client::Reconnect() { return connection_->Reconnect(); }

ModelProfile Client::profile() const { return connection_->attachment()->welcome.profile; }
Namespace Client::ns() const { return connection_->attachment()->welcome.ns; }
uint32_t Client::block_tokens() const { return connection_->attachment()->welcome.profile.block_tokens; }
std::string Client::backend() const { return wire::BackendKindName(connection_->attachment()->welcome.backend); }
uint64_t Client::instance_id() const { return connection_->attachment()->welcome.instance_id; }
uint32_t Client::client_id() const { return connection_->attachment()->welcome.client_id; }

std::vector<BlockKey> Client::Keys(std::span<const TokenId> tokens, const BlockKey& parent) const {
  return KeysOn(*connection_->attachment(), tokens, parent);
}

size_t Client::Probe(std::span<const TokenId> tokens, std::span<Tier> tiers) const {
  const auto att = connection_->attachment();
  const uint32_t bt = att->welcome.profile.block_tokens;
  const size_t n = tokens.size() / bt;
  constexpr size_t kStackKeys = 512;
  BlockKey stack_keys[kStackKeys];
  std::vector<BlockKey> heap_keys;
  std::span<BlockKey> keys(stack_keys, std::min(n, kStackKeys));
  if (n > kStackKeys) {
    heap_keys.resize(n);
    keys = heap_keys;
  }
  ComputeKeys(att->welcome.ns, BlockKey{}, tokens, bt, keys);
  return att->index.LongestPrefix(BlockKey{}, keys, NamespaceTag(att->welcome.ns), tokens, tiers);
}

size_t Client::ProbeKeys(std::span<const BlockKey> keys, std::span<const TokenId> tokens, std::span<Tier> tiers) const {
  const auto att = connection_->attachment();
  return att->index.LongestPrefix(BlockKey{}, keys, NamespaceTag(att->welcome.ns), tokens, tiers);
}

bool Client::StoresBelow() const {
  return (connection_->attachment()->index.header().flags & kIndexFlagStoresBelow) != 0;
}

Result<Lease> Client::Acquire(std::string_view session, std::span<const TokenId> tokens, Promote promote) {
  const auto att = connection_->attachment();
  const std::vector<BlockKey> keys = KeysOn(*att, tokens, BlockKey{});
  return AcquireKeys(session, keys, tokens.first(keys.size() * att->welcome.profile.block_tokens), promote);
}

Result<Lease> Client::AcquireKeys(std::string_view session, std::span<const BlockKey> keys,
                                  std::span<const TokenId> tokens, Promote promote) {
  wire::AcquireRequest req;
  req.session = std::string(session);
  req.flags = promote == Promote::kNow         ? wire::kAcquirePromote
              : promote == Promote::kAfterRead ? wire::kAcquirePromoteAfterRead
                                               : 0;
  req.keys.assign(keys.begin(), keys.end());
  req.tokens.assign(tokens.begin(), tokens.end());
  auto reply = connection_->Call<wire::AcquireResponse>(req, Resend::kYes);
  if (!reply.ok()) return reply.status();
  const wire::AcquireResponse& r = reply->message;
  Lease lease;
  lease.connection_ = connection_;
  lease.attachment_ = std::move(reply->attachment);
  lease.generation_ = reply->generation;
  lease.id_ = r.lease_id;
  lease.matched_ = r.matched;
  lease.promoted_ = r.promoted;
  lease.fence_ = r.fence;
  const Attachment& att = *lease.attachment_;
  lease.slot_bytes_ = att.welcome.profile.BlockBytes();
  lease.blocks_.reserve(r.blocks.size());
  for (const wire::BlockLoc& b : r.blocks) {
    if (b.slot >= att.pool(b.tier).slots) return ProtocolError("acquire reply names a slot outside its pool");
    lease.blocks_.push_back(BlockRef{b.tier, b.slot, att.SlotData(b.tier, b.slot)});
  }
  return lease;
}

Result<uint32_t> Client::Locate(std::span<const TokenId> tokens) {
  const auto att = connection_->attachment();
  wire::AcquireRequest req;
  req.flags = wire::kAcquireLocate;
  req.keys = KeysOn(*att, tokens, BlockKey{});
  req.tokens.assign(tokens.begin(),
                    tokens.begin() + static_cast<std::ptrdiff_t>(req.keys.size() * att->welcome.profile.block_tokens));
  auto reply = connection_->Call<wire::AcquireResponse>(req, Resend::kYes);
  if (!reply.ok()) return reply.status();
  if (reply->message.lease_id != 0) return ProtocolError("locate reply names a lease");
  return reply->message.matched;
}

Result<WriteLease> Client::Allocate(uint32_t blocks) {
  if (!options_.open_gpu) {
    return FailedPrecondition(
        "allocate: this client did not open the GPU tier (ClientOptions::open_gpu is false), "
        "so it cannot write blocks");
  }
  auto reply = connection_->Call<wire::AllocateResponse>(wire::AllocateRequest{blocks}, Resend::kYes);
  if (!reply.ok()) return reply.status();
  WriteLease lease;
  lease.connection_ = connection_;
  lease.attachment_ = std::move(reply->attachment);
  lease.generation_ = reply->generation;
  lease.id_ = reply->message.lease_id;
  const Attachment& att = *lease.attachment_;
  lease.slot_bytes_ = att.welcome.profile.BlockBytes();
  for (uint32_t s : reply->message.slots) {
    if (s >= att.pool(Tier::kGpu).slots) return ProtocolError("allocate reply names a slot outside the gpu pool");
    lease.slots_.push_back(s);
    lease.data_.push_back(att.SlotData(Tier::kGpu, s));
  }
  return lease;
}

Status Client::CommitPlan(WriteLease& lease, const char* what, std::span<const TokenId> tokens,
                          std::span<const uint32_t> slot_indices, std::vector<uint32_t>* idx,
                          std::vector<uint32_t>* slots, std::optional<std::array<uint8_t, 64>>* event) {
  const uint32_t bt = (lease.attachment_ ? lease.attachment_ : connection_->attachment())->welcome.profile.block_tokens;
  if (tokens.size() % bt != 0) {
    return InvalidArgument(std::string(what) + " of " + std::to_string(tokens.size()) + " tokens: not whole " +
                           std::to_string(bt) + "-token blocks");
  }
  const size_t n = tokens.size() / bt;
  idx->assign(slot_indices.begin(), slot_indices.end());
  if (idx->empty()) {
    for (uint32_t i = 0; i < n; ++i) idx->push_back(i);
  }
  if (idx->size() != n) return InvalidArgument(std::string(what) + ": one slot index per block");
  if (lease.id_ == 0) return FailedPrecondition(std::string(what) + " through a released write lease");
  for (uint32_t i : *idx) {
    if (i >= lease.slots_.size()) {
      return InvalidArgument(std::string(what) + ": slot index " + std::to_string(i) + " out of range");
    }
    slots->push_back(lease.slots_[i]);
  }
  if (lease.writer_event_) {
    *event = lease.writer_event_->handle;
  } else if (lease.attachment_ && lease.attachment_->gpu && connection_->Current(lease.attachment_)) {
    // No event says when this process's GPU has written the blocks: kvtierd
    // serves and moves them as soon as they are committed, so wait for it all.
    KVTIER_RETURN_IF_ERROR(lease.attachment_->gpu->SynchronizeContext());
  }
  return Status::Ok();
}

Result<CommitResult> Client::Commit(WriteLease& lease, std::string_view session, const BlockKey& parent,
                                    uint32_t start_block, std::span<const TokenId> tokens,
                                    std::span<const uint32_t> slot_indices) {
  wire::CommitRequest req;
  std::vector<uint32_t> idx;
  KVTIER_RETURN_IF_ERROR(CommitPlan(lease, "commit", tokens, slot_indices, &idx, &req.slots, &req.writer_event));
  req.lease_id = lease.id_;
  req.session = std::string(session);
  req.parent = parent;
  req.start_block = start_block;
  req.tokens.assign(tokens.begin(), tokens.end());
  // Sent on the lease's own connection or not at all.
  auto reply = connection_->CallOn<wire::CommitResponse>(lease.generation_, "write lease", req);
  if (!reply.ok()) return reply.status();
  // Committed slots now belong to the cache, not to the lease (O(n): one mark per slot).
  std::vector<bool> committed(lease.slots_.size(), false);
  for (uint32_t i : idx) committed[i] = true;
  std::vector<uint32_t> keep_slots;
  std::vector<std::byte*> keep_data;
  for (size_t i = 0; i < lease.slots_.size(); ++i) {
    if (!committed[i]) {
      keep_slots.push_back(lease.slots_[i]);
      keep_data.push_back(lease.data_[i]);
    }
  }
  lease.slots_ = std::move(keep_slots);
  lease.data_ = std::move(keep_data);
  // The event covered the writes before this commit; blocks written later
  // need a RecordWritten of their own, never a stale event resent.
  lease.writer_event_.reset();
  return CommitResult{reply->message.stored, reply->message.duplicates};
}

Result<SaveResult> Client::Save(WriteLease& lease, std::string_view session, const BlockKey& parent,
                                uint32_t start_block, std::span<const TokenId> tokens, const SaveOptions& options,
                                std::span<const uint32_t> slot_indices) {
  wire::SaveRequest req;
  std::vector<uint32_t> idx;
  KVTIER_RETURN_IF_ERROR(CommitPlan(lease, "save", tokens, slot_indices, &idx, &req.slots, &req.writer_event));
  if (!lease.fresh()) {
    return FailedPrecondition(
        "save through a write lease past half its timeout: its slots may be revoked soon; "
        "release it and allocate");
  }
  req.lease_id = lease.id_;
  req.session = std::string(session);
  req.parent = parent;
  req.start_block = start_block;
  req.flags = options.adopt ? wire::kSaveAdopt : 0;
  req.refill = options.refill;
  req.tokens.assign(tokens.begin(), tokens.end());
  const auto sent = std::chrono::steady_clock::now();
  auto reply = connection_->CallOn<wire::SaveResponse>(lease.generation_, "write lease", req);
  if (!reply.ok()) return reply.status();
  const wire::SaveResponse& m = reply->message;
  // The lease kvtierd granted again: its id, slots and how long they may be written.
  const Attachment& att = *lease.attachment_;
  std::vector<std::byte*> data;
  for (uint32_t s : m.slots) {
    if (s >= att.pool(Tier::kGpu).slots) return ProtocolError("save reply names a slot outside the gpu pool");
    data.push_back(att.SlotData(Tier::kGpu, s));
  }
  lease.id_ = m.lease_id;
  lease.slots_ = m.slots;
  lease.data_ = std::move(data);
  lease.writer_event_.reset();
  // Counted from the request's sending, so before kvtierd's grant.
  lease.fresh_until_ = m.lease_ttl_ms == 0 ? std::chrono::steady_clock::time_point::max()
                                           : sent + std::chrono::milliseconds(m.lease_ttl_ms / 2);
  return SaveResult{m.stored, m.duplicates, m.adopted, m.last};
}

Result<uint32_t> Client::Prefetch(std::string_view session) {
  auto r = connection_->Call<wire::CountResponse>(wire::PrefetchRequest{std::string(session)}, Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Result<uint32_t> Client::EndSession(std::string_view session) {
  auto r = connection_->Call<wire::CountResponse>(wire::EndSessionRequest{std::string(session)}, Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Result<uint32_t> Client::Demote(std::string_view session) {
  auto r = connection_->Call<wire::CountResponse>(wire::DemoteRequest{std::string(session)}, Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Result<uint32_t> Client::Evict(std::string_view session, std::string_view tenant) {
  auto r = connection_->Call<wire::CountResponse>(wire::EvictRequest{std::string(session), std::string(tenant), false},
                                                  Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Result<uint32_t> Client::EvictTenant(std::string_view tenant) {
  auto r = connection_->Call<wire::CountResponse>(wire::EvictRequest{"", std::string(tenant), false}, Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Result<uint32_t> Client::EvictAll() {
  auto r = connection_->Call<wire::CountResponse>(wire::EvictRequest{"", "", true}, Resend::kYes);
  if (!r.ok()) return r.status();
  return r->message.count;
}

Status Client::SetPriority(std::string_view session, int priority, std::chrono::milliseconds ttl) {
  if (ttl.count() < 0) return InvalidArgument("priority ttl must not be negative");
  const wire::SetPriorityRequest request{std::string(session), priority, static_cast<uint64_t>(ttl.count())};
  auto r = connection_->Call<wire::OkResponse>(request, Resend::kYes);
  return r.ok() ? Status::Ok() : r.status();
}

Result<SessionPage> Client::ListSessionsPage(std::string_view tenant_filter, const SessionSummary* after,
                                             uint32_t limit) {
  wire::ListSessionsRequest req;
  req.tenant_filter = std::string(tenant_filter);
  req.page.emplace();
  req.page->limit = limit;
  if (after != nullptr && !after->id.empty()) {
    req.page->after_tenant = after->tenant;
    req.page->after_id = after->id;
  }
  auto r = connection_->Call<wire::ListSessionsResponse>(req, Resend::kYes);
  if (!r.ok()) return r.status();
  if (r->message.more && r->message.sessions.empty()) return ProtocolError("kvtierd sent an empty page, and more");
  return SessionPage{std::move(r->message.sessions), r->message.more};
}

Result<std::vector<SessionSummary>> Client::ListSessions(std::string_view tenant_filter) {
  std::vector<SessionSummary> all;
  for (;;) {
    auto page = ListSessionsPage(tenant_filter, all.empty() ? nullptr : &all.back());
    if (!page.ok()) return page.status();
    if (all.size() + page->sessions.size() > wire::kMaxArray) {
      return ResourceExhausted("kvtierd lists more than " + std::to_string(wire::kMaxArray) + " sessions");
    }
    all.insert(all.end(), std::make_move_iterator(page->sessions.begin()),
               std::make_move_iterator(page->sessions.end()));
    if (!page->more) return all;
  }
}

Result<SessionInfo> Client::GetSession(std::string_view session) {
  auto r = connection_->Call<wire::SessionInfoResponse>(wire::SessionInfoRequest{std::string(session)}, Resend::kYes);
  if (!r.ok()) return r.status();
  wire::SessionInfoResponse& info = r->message;
  return SessionInfo{std::move(info.summary), std::move(info.chain), std::move(info.tiers), std::move(info.stores)};
}

Result<std::vector<std::pair<std::string, double>>> Client::Stats() {
  auto r = connection_->Call<wire::StatsResponse>(wire::StatsRequest{}, Resend::kYes);
  if (!r.ok()) return r.status();
  return std::move(r->message.values);
}

std::vector<std::string> StoreNames(const std::vector<std::pair<std::string, double>>& stats) {
  std::vector<std::string> names;
  const std::string_view prefix = "store.", suffix = ".hit_blocks";  // One row per store (kvtierd's stats).
  for (const auto& [name, value] : stats) {
    if (name.size() > prefix.size() + suffix.size() && name.starts_with(prefix) && name.ends_with(suffix)) {
      names.push_back(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    }
  }
  return names;
}

Result<std::string> Client::Config() {
  auto r = connection_->Call<wire::ConfigResponse>(wire::ConfigRequest{}, Resend::kYes);
  if (!r.ok()) return r.status();
  return std::move(r->message.yaml);
}

Result<std::chrono::nanoseconds> Client::Ping() {
  const auto start = std::chrono::steady_clock::now();
  auto r = connection_->Call<wire::Pong>(wire::Ping{42}, Resend::kYes);
  if (!r.ok()) return r.status();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
}

Status Client::WaitFence(const Fence& fence, std::chrono::milliseconds timeout) const {
  return connection_->attachment()->WaitCompleted(fence, timeout);
}

}  // namespace kvtier
