// libkvtier: what a model-worker process links to use a kvtierd cache.
//
//   auto client = kvtier::Client::Connect({.socket_path = "/run/kvtier/kvtierd.sock"});
//   auto lease = (*client)->Acquire("chat-42", prompt_tokens);   // cached prefix, pinned
//   lease->Wait(...);                 // promoted blocks have landed (CPU wait), or
//   lease->WaitOnStream(stream, ...); // the same as a GPU-side wait on the worker's stream
//   ... attend over lease->data(i) for i < lease->size(), prefill the rest ...
//   auto w = (*client)->Allocate(n);  // slots for the new blocks; write KV into w->data(i)
//   w->RecordWritten(stream);         // cuda backend: after the kernels that write them
//   (*client)->Commit(*w, "chat-42", parent, start_block, new_tokens);
//
// KV bytes never cross the socket: the client maps the daemon's pools and its
// block index (shared memory on the host backend; on the cuda backend the GPU
// pool is opened once at connect through CUDA IPC, with the driver loaded by
// dlopen, so the worker needs a driver but libkvtier links no CUDA library). A Client is safe to use from
// several threads; requests on one Client are serialized. If the daemon goes
// away, the next call reconnects (with backoff, within connect_timeout) and maps
// the new daemon's segments. A lease belongs to the connection it was made on,
// even while other threads reconnect: its slots point into that connection's
// pools, and its requests go to that connection only. Leases from before a
// reconnect fail with kUnavailable (they never reach the new daemon), and the
// memory they point into stays mapped until they are destroyed.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/client_options.h"
#include "kvtier/fence_layout.h"
#include "kvtier/model_profile.h"
#include "kvtier/session_summary.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"

namespace kvtier {

class Client;

namespace client_internal {
struct Attachment;
class Connection;
struct WriterEvent;

// What every lease holds: the connection it was made on and its id there.
// Move-only; ends the lease (if still held) when destroyed or assigned over.
class LeaseHandle {
 public:
  uint64_t id() const { return id_; }

 protected:
  LeaseHandle() = default;
  LeaseHandle(LeaseHandle&& other) noexcept { *this = std::move(other); }
  LeaseHandle& operator=(LeaseHandle&& other) noexcept;
  LeaseHandle(const LeaseHandle&) = delete;
  LeaseHandle& operator=(const LeaseHandle&) = delete;
  ~LeaseHandle() { (void)ReleaseHandle(); }
  // Idempotent. kUnavailable if the connection it was made on is gone.
  // With `after`, kvtierd holds what the lease held until that event is done;
  // without, a process that opened the GPU synchronizes its context first.
  Status ReleaseHandle(const WriterEvent* after = nullptr);
  // Records an event on `stream` and releases after it (ReleaseAfter).
  Status ReleaseAfterStream(void* stream);
  // kUnavailable if the client is gone or has reconnected since the lease was
  // made (its fence and blocks belong to the connection it was made on).
  Status CheckConnection() const;

  friend class kvtier::Client;
  std::weak_ptr<Connection> connection_;          // Leases may outlive their Client safely.
  std::shared_ptr<const Attachment> attachment_;  // Keeps the mapped memory valid.
  uint64_t generation_ = 0;
  uint64_t id_ = 0;
};

}  // namespace client_internal

// Where one leased block lies, and its bytes in this process.
struct BlockRef {
  Tier tier = Tier::kGpu;
  uint32_t slot = 0;
  // slot_bytes() bytes; a device address for a GPU pool on cuda; null for a
  // GPU-tier block of a client that did not open the GPU (ClientOptions::open_gpu).
  std::byte* data = nullptr;
};

// What Acquire does with host-tier hits.
enum class Promote : uint8_t {
  kNo,         // Leased where they lie, and left there.
  kNow,        // Copied to the GPU tier now: wait on the lease before reading them.
  kAfterRead,  // Leased where they lie, to be read there at once; copied to the
               // GPU tier when the lease is released, so the session's next
               // reader finds them there. For a worker that copies the prefix
               // out of the pool anyway (into a CPU model's buffer): it reads
               // at once instead of waiting for the promotion.
};

// A read lease on a cached prefix: the blocks cannot move or vanish while it
// lives. Released on destruction. Move-only.
class Lease : public client_internal::LeaseHandle {
 public:
  Lease() = default;
  Lease(Lease&&) noexcept = default;
  Lease& operator=(Lease&&) noexcept = default;

  uint32_t matched() const { return matched_; }   // Blocks of the prefix cached (>= size()).
  size_t size() const { return blocks_.size(); }  // Blocks leased.
  uint32_t promoted() const { return promoted_; }
  const BlockRef& block(size_t i) const { return blocks_[i]; }
  const std::vector<BlockRef>& blocks() const { return blocks_; }
  const Fence& fence() const { return fence_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // Waits until promoted blocks have landed in the GPU tier. kUnavailable once
  // the client has reconnected (the daemon restarted, or Reconnect): the lease
  // ended with its connection, and neither its fence nor its blocks are the
  // new daemon's.
  Status Wait(std::chrono::milliseconds timeout) const;
  // Makes work queued on `stream` (a cudaStream_t / CUstream of this process's
  // primary context; nullptr is the legacy default stream) wait until promoted
  // blocks have landed, without stalling the CPU: on a cuda-backend kvtierd it
  // enqueues cuStreamWaitEvent on the promotion fence's event. Where there is no
  // GPU-side fence (host backend, or promotion events that could not be opened
  // at connect, which libkvtier reports once on stderr) it waits on the CPU, as
  // Wait(host_timeout).
  // kUnavailable once the client has reconnected, as Wait.
  Status WaitOnStream(void* stream, std::chrono::milliseconds host_timeout) const;
  // Ends the lease (idempotent). kUnavailable if its connection is gone (the
  // daemon restarted or the client reconnected meanwhile): it ended with it.
  // kNotFound saying it expired if kvtierd revoked it for being held longer
  // than its limits.lease_timeout_ms: its blocks were unpinned then, so bytes
  // read through it after that may be another block's.
  // In a process that opened the GPU of a cuda-backend kvtierd (and so on
  // destruction too), it first waits for all of this process's GPU work
  // (cuCtxSynchronize): the blocks may be moved or freed once released, so no
  // kernel may still read them. A worker that reads them on a stream releases
  // with ReleaseAfter(stream) instead, which never stalls.
  Status Release() { return ReleaseHandle(); }
  // Ends the lease once the work queued on `stream` so far is done, without
  // waiting for it: it records an interprocess event on the stream, and kvtierd
  // keeps the blocks pinned until it sees that event complete. Same as
  // Release() where the blocks are not read on the GPU (host backend, or a
  // client that did not open the GPU).
  Status ReleaseAfter(void* stream) { return ReleaseAfterStream(stream); }

 private:
  friend class Client;
  uint32_t matched_ = 0;
  uint32_t promoted_ = 0;
  Fence fence_;
  size_t slot_bytes_ = 0;
  std::vector<BlockRef> blocks_;
};

// GPU-tier slots reserved for writing new blocks. Released on destruction;
// committed slots leave the lease. They count against the tenant's GPU quota
// until committed or released, and kvtierd revokes a lease held longer than its
// limits.lease_timeout_ms (a Commit of it then fails with kFailedPrecondition,
// "expired"): write and commit well within it, and never write into a lease's
// slots after its commit failed that way, as they may be another's by then.
// Move-only.
class WriteLease : public client_internal::LeaseHandle {
 public:
  WriteLease() = default;
  WriteLease(WriteLease&&) noexcept = default;
  WriteLease& operator=(WriteLease&&) noexcept = default;

  size_t size() const { return slots_.size(); }
  const std::vector<uint32_t>& slots() const { return slots_; }
  std::byte* data(size_t i) const { return data_[i]; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Whether the slots may still be written: true for a lease from Allocate;
  // one that Client::Save granted again is fresh for half of the lease
  // timeout kvtierd stated then (the rest is the margin for its
  // revocation, which would give the slots to another writer). Write a stale
  // lease's slots never: release it and allocate.
  bool fresh() const { return std::chrono::steady_clock::now() < fresh_until_; }
  // Records, on `stream` (as in Lease::WaitOnStream), an interprocess event after
  // the work that writes this lease's blocks; the next Commit sends it and
  // kvtierd orders every demotion of the committed blocks after it. Call it
  // after queueing the writes and before each Commit: a Commit uses up the
  // event, so one without a RecordWritten since carries none (kvtierd counts
  // such commits: gpu_commits_without_writer_event). Cuda backend only: on the host
  // backend the blocks are written by the CPU (kFailedPrecondition).
  // kvtierd serves, demotes (and reuses the slots of duplicates) only once it
  // sees the event complete; a writer that disconnects first loses the
  // blocks. A Commit without an event, in a process that opened the GPU,
  // first waits for all of its GPU work (cuCtxSynchronize).
  Status RecordWritten(void* stream);
  // Gives the uncommitted slots back (idempotent): after the event of a
  // RecordWritten since the last Commit if there is one, else as
  // Lease::Release (a GPU process synchronizes its context first).
  Status Release() {
    slots_.clear();
    data_.clear();
    auto after = std::move(writer_event_);
    return ReleaseHandle(after.get());
  }
  // Gives the uncommitted slots back once the work queued on `stream` so far
  // (what writes them) is done, as Lease::ReleaseAfter.
  Status ReleaseAfter(void* stream) {
    slots_.clear();
    data_.clear();
    writer_event_.reset();
    return ReleaseAfterStream(stream);
  }

 private:
  friend class Client;
  std::shared_ptr<const client_internal::WriterEvent> writer_event_;  // Set by RecordWritten.
  std::chrono::steady_clock::time_point fresh_until_ = std::chrono::steady_clock::time_point::max();
  size_t slot_bytes_ = 0;
  std::vector<uint32_t> slots_;
  std::vector<std::byte*> data_;
};

struct CommitResult {
  uint32_t stored = 0;
  uint32_t duplicates = 0;
};

// Client::Save's choices beyond a Commit's.
struct SaveOptions {
  // A session that does not hold `parent` as its block start_block - 1 first
  // takes the cached chain ending at `parent` as its first blocks.
  bool adopt = false;
  // The lease comes back holding up to this many slots for the next save.
  uint32_t refill = 0;
};
struct SaveResult {
  uint32_t stored = 0;
  uint32_t duplicates = 0;
  uint32_t adopted = 0;  // Blocks the session took as its chain (0: it held them).
  BlockKey last;         // The key of the session's last block: the next save's parent.
};

// One page of Client::ListSessionsPage.
struct SessionPage {
  std::vector<SessionSummary> sessions;
  bool more = false;  // Sessions remain after the last one: ask again with it as `after`.
};

// A session and its chain of blocks (Client::GetSession).
struct SessionInfo {
  SessionSummary summary;
  // The session's summary.blocks blocks, then the blocks after them that
  // pressure dropped into the stores below the host tier, where kvtierd has any.
  std::vector<BlockKey> chain;
  // Where each chain block is, same length as chain: a Tier value, or a kPlace
  // value (kvtier/tier.h: a store, nowhere, unknown), or a number this library
  // does not know (a newer kvtierd's), passed on as is. PlaceName names them.
  std::vector<uint8_t> tiers;
  // The names of kvtierd's stores below the host tier, in stores.tiers order
  // (a place kPlaceStoreBase + i is stores[i]): PlaceName(tiers[i], stores).
  std::vector<std::string> stores;
  friend bool operator==(const SessionInfo&, const SessionInfo&) = default;
};

// The names of kvtierd's stores below the host tier, recovered from its Stats.
[[deprecated("SessionInfo::stores names them")]] std::vector<std::string> StoreNames(
    const std::vector<std::pair<std::string, double>>& stats);

// The wire protocol version this library speaks (a Client and kvtierd agree on
// one at Hello).
uint16_t ProtocolVersion();

class Client {
 public:
  // Connects, says Hello, and maps the daemon's segments. Retries until
  // connect_timeout (the daemon may be starting). kUnavailable if none answers.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // What the daemon of the current connection announced at Hello. Returned by
  // value: a reconnect by another thread (which replaces them) cannot
  // invalidate what a caller holds, but two calls may describe two daemons.
  ModelProfile profile() const;
  Namespace ns() const;
  uint32_t block_tokens() const;
  std::string backend() const;
  uint64_t instance_id() const;
  uint32_t client_id() const;
  const ClientOptions& options() const { return options_; }

  // Keys of the full blocks of `tokens`, chained from `parent`.
  std::vector<BlockKey> Keys(std::span<const TokenId> tokens, const BlockKey& parent = {}) const;
  // Blocks of `tokens` cached now, read straight from the shared index (no
  // round trip, pins nothing). Fills `tiers` per cached block when non-empty.
  size_t Probe(std::span<const TokenId> tokens, std::span<Tier> tiers = {}) const;
  size_t ProbeKeys(std::span<const BlockKey> keys, std::span<const TokenId> tokens, std::span<Tier> tiers = {}) const;
  // True when kvtierd has stores below its host tier (disk, remote): they may
  // hold blocks a Probe misses, so a miss is no reason to skip Acquire.
  bool StoresBelow() const;

  // Leases the longest cached prefix of the full blocks of `tokens`; with a
  // session name, the session now holds that prefix. `promote`: what happens
  // to host-tier hits (Promote). A block left in the host tier (kNo,
  // kAfterRead, or no GPU room within kvtierd's wait) is read through this
  // process's mapping of the host pool, which is not registered with CUDA
  // here: a GPU worker acquires with kNow, or copies such blocks itself
  // (pageable-memory speed), or registers the mapping.
  Result<Lease> Acquire(std::string_view session, std::span<const TokenId> tokens, Promote promote = Promote::kNow);
  Result<Lease> AcquireKeys(std::string_view session, std::span<const BlockKey> keys, std::span<const TokenId> tokens,
                            Promote promote = Promote::kNow);
  // Before Promote: true was Promote::kNow, false Promote::kNo. Kept so that
  // workers written against the earlier header still compile.
  [[deprecated("pass a kvtier::Promote: kNow (was true), kNo (was false) or kAfterRead")]] Result<Lease> Acquire(
      std::string_view session, std::span<const TokenId> tokens, bool promote) {
    return Acquire(session, tokens, promote ? Promote::kNow : Promote::kNo);
  }
  [[deprecated("pass a kvtier::Promote: kNow (was true), kNo (was false) or kAfterRead")]] Result<Lease> AcquireKeys(
      std::string_view session, std::span<const BlockKey> keys, std::span<const TokenId> tokens, bool promote) {
    return AcquireKeys(session, keys, tokens, promote ? Promote::kNow : Promote::kNo);
  }

  // Blocks of the prefix of `tokens`' full blocks cached once kvtierd has
  // brought into its host tier what only its stores below hold (waiting up to
  // kvtierd's stores.locate_budget_ms); leases nothing, so a Probe
  // afterwards finds them (until pressure evicts them). One round trip. A
  // kvtierd that predates it refuses the request (kProtocolError or
  // kInvalidArgument, naming the flags).
  Result<uint32_t> Locate(std::span<const TokenId> tokens);

  Result<WriteLease> Allocate(uint32_t blocks);
  // Publishes blocks written into lease slots `slot_indices` (indices into
  // lease.slots(); default: the first tokens.size()/block_tokens slots).
  // Block i holds tokens[i*bt, (i+1)*bt) and is block start_block+i of the
  // session, chained from `parent` (null key for block 0).
  Result<CommitResult> Commit(WriteLease& lease, std::string_view session, const BlockKey& parent, uint32_t start_block,
                              std::span<const TokenId> tokens, std::span<const uint32_t> slot_indices = {});

  // A Commit in one round trip that costs what the new blocks cost, however
  // long the session's prefix (a writer saving as it decodes): with
  // options.adopt the session need not hold the prefix (kvtierd walks the
  // cached chain back from `parent`, same tenant and model only;
  // kFailedPrecondition when part of it is gone: then acquire the prefix
  // under the session and Commit). The lease comes back under a new id with
  // its uncommitted slots and free ones up to options.refill (fewer when the
  // GPU tier or the tenant's quota has no room now; none: the lease has
  // ended, as after Release), fresh() for half the lease timeout. A kvtierd
  // that predates it refuses the message (kProtocolError or kInvalidArgument):
  // Commit then.
  Result<SaveResult> Save(WriteLease& lease, std::string_view session, const BlockKey& parent, uint32_t start_block,
                          std::span<const TokenId> tokens, const SaveOptions& options = {},
                          std::span<const uint32_t> slot_indices = {});

  Result<uint32_t> Prefetch(std::string_view session);
  Result<uint32_t> Demote(std::string_view session);
  // With a tenant: that tenant's session (kPermissionDenied unless it is this
  // client's own tenant or the client is an admin).
  Result<uint32_t> Evict(std::string_view session, std::string_view tenant = {});
  Result<uint32_t> EvictTenant(std::string_view tenant);
  // This client is done with the session (a request that finished): its blocks
  // stay cached until pressure drops them, and the session no longer counts
  // against the tenant's session limit (the first given up for a new one).
  // Returns the blocks it keeps (0: another session holds all of them, so it
  // is gone). kNotFound when there is no such session; a kvtierd that predates
  // it refuses the request (kProtocolError).
  Result<uint32_t> EndSession(std::string_view session);
  Result<uint32_t> EvictAll();
  // Priority 0..7 (higher is kept longer). With a ttl > 0 the daemon sets it
  // back to 0 after `ttl`, whether or not this client is still there; a kvtierd
  // that predates priority TTLs refuses such a request (kProtocolError).
  Status SetPriority(std::string_view session, int priority, std::chrono::milliseconds ttl = {});
  // The sessions of tenant `tenant_filter` (empty: this client's own, or an
  // admin's every tenant's), fetched page by page, since kvtierd bounds every
  // reply. Not a snapshot: a session made or ended meanwhile may be listed or
  // not, but none twice. A kvtierd that predates paging refuses it (kProtocolError).
  Result<std::vector<SessionSummary>> ListSessions(std::string_view tenant_filter = {});
  // One page of them, in kvtierd's listing order: at most `limit` sessions (0:
  // kvtierd's page size) after `after`, the last session of the page before
  // (nullptr: from the first).
  Result<SessionPage> ListSessionsPage(std::string_view tenant_filter, const SessionSummary* after = nullptr,
                                       uint32_t limit = 0);
  Result<SessionInfo> GetSession(std::string_view session);
  Result<std::vector<std::pair<std::string, double>>> Stats();
  Result<std::string> Config();
  // Round trip time of one Ping.
  Result<std::chrono::nanoseconds> Ping();

  // Waits for a fence of the current connection (Lease::Wait waits for a
  // lease's own fence on the connection it was made on, whatever came since).
  Status WaitFence(const Fence& fence, std::chrono::milliseconds timeout) const;
  // Reconnects now (normally done lazily). Existing leases become invalid:
  // their requests fail with kUnavailable and are never sent to the new daemon.
  Status Reconnect();

 private:
  explicit Client(ClientOptions options);
  // A Commit's or Save's blocks checked against `lease`: their slots (slot
  // indices into lease.slots(), default the first ones), and the writer's
  // event, or the GPU context synchronized when there is none.
  Status CommitPlan(WriteLease& lease, const char* what, std::span<const TokenId> tokens,
                    std::span<const uint32_t> slot_indices, std::vector<uint32_t>* idx, std::vector<uint32_t>* slots,
                    std::optional<std::array<uint8_t, 64>>* event);

  ClientOptions options_;
  std::shared_ptr<client_internal::Connection> connection_;
};

}  // namespace kvtier
