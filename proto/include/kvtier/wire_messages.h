// The control-plane protocol's messages: their types (MessageType), their
// fields, and the variant that holds any of them (Message). wire.h frames and
// encodes them; proto/src/wire_fields.h gives each its encoding. Adding a message:
// its type at the end of MessageType, its struct here and its place in Message,
// its fields in wire_fields.h, and kvtierd's handler for a request.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kvtier/backend_kind.h"
#include "kvtier/block_key.h"
#include "kvtier/fence_layout.h"
#include "kvtier/index_layout.h"
#include "kvtier/model_profile.h"
#include "kvtier/session_summary.h"
#include "kvtier/status.h"
#include "kvtier/wire_codec.h"

namespace kvtier::wire {

// The one version this side speaks (a frame header carries it; wire.h).
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr uint32_t kMaxPayload = uint32_t{16} << 20;  // 16 MiB: a frame's payload, at most.
inline constexpr size_t kMaxIpcHandle = 256;                 // PoolDesc.ipc_handle bytes.
inline constexpr size_t kIpcEventHandleBytes = 64;           // sizeof(cudaIpcEventHandle_t / CUipcEventHandle).
inline constexpr size_t kMaxFenceEvents = 1024;              // Welcome.fence_events entries.
// A CUDA interprocess event handle, opaque to everything but the CUDA driver.
using IpcEventHandle = std::array<uint8_t, kIpcEventHandleBytes>;

enum class MessageType : uint16_t {
  // Handshake and generic replies.
  kHello = 1,
  kWelcome = 2,
  kPing = 3,
  kPong = 4,
  kOkResponse = 5,
  kErrorResponse = 6,
  kCountResponse = 7,
  // Data path.
  kAllocateRequest = 16,
  kAllocateResponse = 17,
  kCommitRequest = 18,
  kCommitResponse = 19,
  kAcquireRequest = 20,
  kAcquireResponse = 21,
  kReleaseRequest = 22,
  kSaveRequest = 23,
  kSaveResponse = 24,
  // Management.
  kPrefetchRequest = 32,
  kDemoteRequest = 33,
  kEvictRequest = 34,
  kSetPriorityRequest = 35,
  kListSessionsRequest = 36,
  kListSessionsResponse = 37,
  kSessionInfoRequest = 38,
  kSessionInfoResponse = 39,
  kStatsRequest = 40,
  kStatsResponse = 41,
  kConfigRequest = 42,
  kConfigResponse = 43,
  kEndSessionRequest = 44,
};

// "Hello", "AcquireResponse", ... (the message's kName); "Unknown" for a value
// that names no alternative of Message.
const char* MessageTypeName(MessageType type);
// True if `type` is the kType of an alternative of Message.
bool IsKnownMessageType(uint16_t type);

// ---- Shared parts ----

// The backend a kvtierd runs (Welcome.backend). On the wire it is its name, a
// string ("host", "cuda"), as in every protocol version-1 peer; a string that
// names no BackendKind is a protocol error. (kvtier/backend_kind.h.)
using kvtier::BackendKind;
using kvtier::BackendKindName;
using kvtier::ParseBackendKind;

struct PoolDesc {
  Tier tier = Tier::kGpu;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::string shm_name;  // The pool's segment label (its descriptor comes with the Welcome); empty for device memory.
  std::vector<uint8_t> ipc_handle;  // Cuda: cudaIpcMemHandle_t bytes (<= kMaxIpcHandle). Empty on host.
  friend bool operator==(const PoolDesc&, const PoolDesc&) = default;
};

struct BlockLoc {
  Tier tier = Tier::kGpu;
  uint32_t slot = 0;
  friend bool operator==(const BlockLoc&, const BlockLoc&) = default;
};

using kvtier::SessionSummary;  // kvtier/session_summary.h: shared with libkvtier's API.

// ---- Messages ----
// Every string is at most kMaxString bytes and every array at most kMaxArray
// elements unless its comment says otherwise.

// Client -> daemon, first frame of a connection.
struct Hello {
  static constexpr MessageType kType = MessageType::kHello;
  static constexpr const char* kName = "Hello";
  uint16_t min_version = kProtocolVersion;  // 1 <= min_version <= max_version.
  uint16_t max_version = kProtocolVersion;
  std::string client_name;
  uint32_t pid = 0;
  std::string tenant;
  std::string profile;  // Model profile name; empty = the daemon's default.
  // Extension: the model's identity (ModelId, 16 bytes); absent = none. The
  // Welcome's `ns` is then the namespace keys are chained in for this model.
  ModelId model;
  friend bool operator==(const Hello&, const Hello&) = default;
};

// Daemon -> client, the reply to Hello.
struct Welcome {
  static constexpr MessageType kType = MessageType::kWelcome;
  static constexpr const char* kName = "Welcome";
  uint16_t version = kProtocolVersion;  // The version this connection speaks.
  uint64_t instance_id = 0;             // Random per daemon start.
  uint32_t client_id = 0;
  ModelProfile profile;  // dtype is checked to be a known DType; the geometry is not validated.
  Namespace ns;
  BackendKind backend = BackendKind::kHost;
  std::vector<PoolDesc> pools;
  std::string index_segment;
  std::string fence_segment;
  uint32_t max_blocks_per_request = 0;
  uint32_t max_payload = kMaxPayload;
  // Extension (cuda backend): a ring of interprocess events on the promotion
  // stream. The batch of promotion fence `seq` recorded fence_events[seq % size()]
  // before its fence was handed out, so a client that waits on that event on its
  // own stream (cuStreamWaitEvent) waits for that batch or, if the slot was
  // recorded again meanwhile, for a later one: never for less. Empty (absent) on
  // the host backend; at most kMaxFenceEvents. Encoded as ExtensionBytes of
  // size() * kIpcEventHandleBytes bytes.
  std::vector<IpcEventHandle> fence_events;
  friend bool operator==(const Welcome&, const Welcome&) = default;
};

struct AllocateRequest {
  static constexpr MessageType kType = MessageType::kAllocateRequest;
  static constexpr const char* kName = "AllocateRequest";
  uint32_t count = 0;
  friend bool operator==(const AllocateRequest&, const AllocateRequest&) = default;
};

struct AllocateResponse {
  static constexpr MessageType kType = MessageType::kAllocateResponse;
  static constexpr const char* kName = "AllocateResponse";
  uint64_t lease_id = 0;
  std::vector<uint32_t> slots;  // GPU-tier slots, leased for writing.
  friend bool operator==(const AllocateResponse&, const AllocateResponse&) = default;
};

// Publishes written blocks. Block i of the request holds tokens
// [i * block_tokens, (i + 1) * block_tokens) and lies in slots[i]; it is block
// start_block + i of the session, chained from `parent`.
struct CommitRequest {
  static constexpr MessageType kType = MessageType::kCommitRequest;
  static constexpr const char* kName = "CommitRequest";
  uint64_t lease_id = 0;
  std::string session;
  BlockKey parent;
  uint32_t start_block = 0;
  std::vector<TokenId> tokens;
  std::vector<uint32_t> slots;
  // Extension (cuda backend): an interprocess event the writer recorded on its
  // stream after writing these blocks; kvtierd polls it, and serves, demotes
  // (or reuses the slots of duplicates) only once it reports done. Encoded as
  // ExtensionBytes of exactly kIpcEventHandleBytes bytes.
  std::optional<IpcEventHandle> writer_event;
  friend bool operator==(const CommitRequest&, const CommitRequest&) = default;
};

struct CommitResponse {
  static constexpr MessageType kType = MessageType::kCommitResponse;
  static constexpr const char* kName = "CommitResponse";
  uint32_t stored = 0;
  uint32_t duplicates = 0;  // Keys already present; their slots were freed.
  friend bool operator==(const CommitResponse&, const CommitResponse&) = default;
};

// A commit and the write lease's next slots in one round trip: what a writer
// that saves as it decodes sends once per save. As CommitRequest (the same
// checks; blocks start_block + i of the session, chained from `parent`), and:
//  - kSaveAdopt: a session that does not hold `parent` as its block
//    start_block - 1 first takes the cached chain ending at `parent` as its
//    first start_block blocks. kvtierd walks the chain back from `parent`
//    through its index (each block the same tenant's and model's, the walk
//    ending at block 0 after exactly start_block steps), so the writer names
//    the prefix by its last key instead of sending and hashing its tokens
//    again; kFailedPrecondition when any of it is no longer cached.
//  - refill: the lease is granted again, holding its uncommitted slots plus
//    new ones up to `refill` slots in all, taken only from the GPU tier's free
//    slots and the tenant's room now (never waiting, dropping or demoting: so
//    it may hold fewer). The old lease id is gone; SaveResponse names the new
//    one (0: the lease ended, holding nothing).
inline constexpr uint8_t kSaveAdopt = 1 << 0;
inline constexpr uint8_t kSaveKnownFlags = kSaveAdopt;
struct SaveRequest {
  static constexpr MessageType kType = MessageType::kSaveRequest;
  static constexpr const char* kName = "SaveRequest";
  uint64_t lease_id = 0;
  std::string session;
  BlockKey parent;
  uint32_t start_block = 0;
  uint8_t flags = 0;  // kSave* bits; unknown bits are a protocol error.
  uint32_t refill = 0;
  std::vector<TokenId> tokens;
  std::vector<uint32_t> slots;
  std::optional<IpcEventHandle> writer_event;  // Extension: as CommitRequest.writer_event.
  friend bool operator==(const SaveRequest&, const SaveRequest&) = default;
};

struct SaveResponse {
  static constexpr MessageType kType = MessageType::kSaveResponse;
  static constexpr const char* kName = "SaveResponse";
  uint32_t stored = 0;
  uint32_t duplicates = 0;
  uint32_t adopted = 0;   // Blocks the session took as its chain (kSaveAdopt), 0 if it held them.
  BlockKey last;          // The key of the session's last block now.
  uint64_t lease_id = 0;  // The lease now holding `slots`; 0: none (the old one ended).
  // Milliseconds until that lease is revoked (limits.lease_timeout_ms, as it
  // stands now), 0: never. A writer stops writing into it well before.
  uint32_t lease_ttl_ms = 0;
  std::vector<uint32_t> slots;
  friend bool operator==(const SaveResponse&, const SaveResponse&) = default;
};

inline constexpr uint8_t kAcquirePromote = 1 << 0;  // Start host->gpu copies for host-tier hits.
// Lease host-tier hits where they lie (the client reads them there now) and
// copy them to the GPU tier once the lease is released. Not with kAcquirePromote.
inline constexpr uint8_t kAcquirePromoteAfterRead = 1 << 1;
// Lease nothing: bring into the host tier what only the stores below hold of
// the prefix (waiting as an Acquire does, up to stores.fetch_budget_ms), and
// answer how many blocks are cached now (lease_id 0, no blocks). Not with the
// promote bits. A kvtierd that predates it refuses the request (unknown bit).
inline constexpr uint8_t kAcquireLocate = 1 << 2;
inline constexpr uint8_t kAcquireKnownFlags = kAcquirePromote | kAcquirePromoteAfterRead | kAcquireLocate;

// Pins the longest present prefix of `keys` (tokens as in CommitRequest).
struct AcquireRequest {
  static constexpr MessageType kType = MessageType::kAcquireRequest;
  static constexpr const char* kName = "AcquireRequest";
  std::string session;
  uint8_t flags = 0;  // kAcquire* bits; unknown bits are a protocol error.
  std::vector<BlockKey> keys;
  std::vector<TokenId> tokens;
  friend bool operator==(const AcquireRequest&, const AcquireRequest&) = default;
};

struct AcquireResponse {
  static constexpr MessageType kType = MessageType::kAcquireResponse;
  static constexpr const char* kName = "AcquireResponse";
  uint64_t lease_id = 0;
  uint32_t matched = 0;
  uint32_t promoted = 0;
  Fence fence;                   // Wait on it before reading promoted blocks.
  std::vector<BlockLoc> blocks;  // One per matched block.
  friend bool operator==(const AcquireResponse&, const AcquireResponse&) = default;
};

struct ReleaseRequest {
  static constexpr MessageType kType = MessageType::kReleaseRequest;
  static constexpr const char* kName = "ReleaseRequest";
  uint64_t lease_id = 0;
  // Extension (cuda backend): an interprocess event the client recorded after
  // its GPU work on the lease's blocks or slots. kvtierd keeps them held
  // (blocks pinned, slots reserved) until it sees the event done. Encoded as
  // CommitRequest.writer_event.
  std::optional<IpcEventHandle> after_event;
  friend bool operator==(const ReleaseRequest&, const ReleaseRequest&) = default;
};

struct PrefetchRequest {
  static constexpr MessageType kType = MessageType::kPrefetchRequest;
  static constexpr const char* kName = "PrefetchRequest";
  std::string session;
  friend bool operator==(const PrefetchRequest&, const PrefetchRequest&) = default;
};

struct DemoteRequest {
  static constexpr MessageType kType = MessageType::kDemoteRequest;
  static constexpr const char* kName = "DemoteRequest";
  std::string session;
  friend bool operator==(const DemoteRequest&, const DemoteRequest&) = default;
};

// Evicts one session, every session of a tenant, or (all) everything.
struct EvictRequest {
  static constexpr MessageType kType = MessageType::kEvictRequest;
  static constexpr const char* kName = "EvictRequest";
  std::string session;
  std::string tenant;
  bool all = false;  // One byte, 0 or 1.
  friend bool operator==(const EvictRequest&, const EvictRequest&) = default;
};

struct SetPriorityRequest {
  static constexpr MessageType kType = MessageType::kSetPriorityRequest;
  static constexpr const char* kName = "SetPriorityRequest";
  std::string session;
  int32_t priority = 0;
  // Extension: after this many milliseconds the daemon sets the priority back
  // to 0. 0 (absent) keeps it until changed.
  uint64_t ttl_ms = 0;
  friend bool operator==(const SetPriorityRequest&, const SetPriorityRequest&) = default;
};

// The client is done with a session (a request that finished): its blocks stay
// cached, and it is the first its tenant gives up for a new session
// (tiering::Engine::EndSession). Answered with a CountResponse: the blocks the
// ended session keeps (0: it held nothing another session does not, and is gone).
struct EndSessionRequest {
  static constexpr MessageType kType = MessageType::kEndSessionRequest;
  static constexpr const char* kName = "EndSessionRequest";
  std::string session;
  friend bool operator==(const EndSessionRequest&, const EndSessionRequest&) = default;
};

// The reply to Prefetch, Demote, Evict and EndSession: how many blocks the call affected.
struct CountResponse {
  static constexpr MessageType kType = MessageType::kCountResponse;
  static constexpr const char* kName = "CountResponse";
  uint32_t count = 0;
  friend bool operator==(const CountResponse&, const CountResponse&) = default;
};

// Which page of the sessions a ListSessionsRequest asks for. Pages come in
// the daemon's listing order (by tenant, then id; the order of tenants is the
// daemon's own), each ending where its sessions, its bytes or the work of
// describing them reach the daemon's bounds, so a reply always fits one frame.
// Paging is not a snapshot: a session made or ended meanwhile may be listed or
// not, but none is listed twice, since each page starts after its cursor.
struct ListSessionsPage {
  uint32_t limit = 0;        // Sessions at most; 0: as many as the daemon puts in a page.
  std::string after_tenant;  // The cursor: the last session seen, (tenant, id);
  std::string after_id;      // empty: from the first. An empty after_id needs an empty after_tenant.
  friend bool operator==(const ListSessionsPage&, const ListSessionsPage&) = default;
};

struct ListSessionsRequest {
  static constexpr MessageType kType = MessageType::kListSessionsRequest;
  static constexpr const char* kName = "ListSessionsRequest";
  std::string tenant_filter;  // Empty: every tenant.
  // Extension: page through the sessions. Absent (the older request): every
  // session in one reply, or, when they do not fit one frame, an ErrorResponse
  // (resource_exhausted) saying so. Encoded as ExtensionBytes holding
  // limit (u32), after_tenant and after_id (strings).
  std::optional<ListSessionsPage> page;
  friend bool operator==(const ListSessionsRequest&, const ListSessionsRequest&) = default;
};

struct ListSessionsResponse {
  static constexpr MessageType kType = MessageType::kListSessionsResponse;
  static constexpr const char* kName = "ListSessionsResponse";
  std::vector<SessionSummary> sessions;
  // Extension: sessions remain after the last one listed; ask again with it as
  // the cursor. Only ever set in reply to a paged request (an older client
  // never sees it). Encoded as ExtensionU64 1.
  bool more = false;
  friend bool operator==(const ListSessionsResponse&, const ListSessionsResponse&) = default;
};

struct SessionInfoRequest {
  static constexpr MessageType kType = MessageType::kSessionInfoRequest;
  static constexpr const char* kName = "SessionInfoRequest";
  std::string session;
  friend bool operator==(const SessionInfoRequest&, const SessionInfoRequest&) = default;
};

struct SessionInfoResponse {
  static constexpr MessageType kType = MessageType::kSessionInfoResponse;
  static constexpr const char* kName = "SessionInfoResponse";
  SessionSummary summary;
  std::vector<BlockKey> chain;
  // The chain: the session's blocks (summary.blocks of them), then those after
  // them that pressure dropped into the stores below the host tier.
  // Where each is (a Tier value, or a kPlace value of tier.h: a store, nowhere,
  // unknown; not validated, so that a newer daemon's places still display).
  // Same length as chain.
  std::vector<uint8_t> tiers;
  // Extension: the stores below the host tier, named as in stats ("disk",
  // "redis", "disk0"), in stores.tiers order: a place kPlaceStoreBase + i is
  // stores[i]; absent = none configured. Encoded as ExtensionBytes of the
  // names joined by ',' (each 1-64 of [A-Za-z0-9_-]; at most 16).
  std::vector<std::string> stores;
  friend bool operator==(const SessionInfoResponse&, const SessionInfoResponse&) = default;
};

struct StatsRequest {
  static constexpr MessageType kType = MessageType::kStatsRequest;
  static constexpr const char* kName = "StatsRequest";
  friend bool operator==(const StatsRequest&, const StatsRequest&) = default;
};

// Named counters and gauges; the set of names may grow without a version change.
struct StatsResponse {
  static constexpr MessageType kType = MessageType::kStatsResponse;
  static constexpr const char* kName = "StatsResponse";
  std::vector<std::pair<std::string, double>> values;
  friend bool operator==(const StatsResponse&, const StatsResponse&) = default;
};

struct ConfigRequest {
  static constexpr MessageType kType = MessageType::kConfigRequest;
  static constexpr const char* kName = "ConfigRequest";
  friend bool operator==(const ConfigRequest&, const ConfigRequest&) = default;
};

struct ConfigResponse {
  static constexpr MessageType kType = MessageType::kConfigResponse;
  static constexpr const char* kName = "ConfigResponse";
  std::string yaml;  // The effective configuration; at most kMaxConfigBytes.
  friend bool operator==(const ConfigResponse&, const ConfigResponse&) = default;
};

struct Ping {
  static constexpr MessageType kType = MessageType::kPing;
  static constexpr const char* kName = "Ping";
  uint64_t nonce = 0;
  friend bool operator==(const Ping&, const Ping&) = default;
};

struct Pong {
  static constexpr MessageType kType = MessageType::kPong;
  static constexpr const char* kName = "Pong";
  uint64_t nonce = 0;
  friend bool operator==(const Pong&, const Pong&) = default;
};

// The reply to Release and SetPriority, and to any request with nothing to report.
struct OkResponse {
  static constexpr MessageType kType = MessageType::kOkResponse;
  static constexpr const char* kName = "OkResponse";
  friend bool operator==(const OkResponse&, const OkResponse&) = default;
};

// The reply to any request that failed.
struct ErrorResponse {
  static constexpr MessageType kType = MessageType::kErrorResponse;
  static constexpr const char* kName = "ErrorResponse";
  StatusCode code = StatusCode::kInternal;  // Never kOk; an unknown code is a protocol error.
  std::string message;
  friend bool operator==(const ErrorResponse&, const ErrorResponse&) = default;
};

// Every message, in MessageType order. This list is the one place a message is
// registered: the type names, the decoder and kvtierd's dispatch are derived
// from its alternatives (each struct's kType and kName). Adding a message is an
// enumerator above, a struct with kType and kName, its codec (wire.cc) and an
// alternative here. The static_assert below checks that the alternatives follow
// the enum's order, with distinct values and names; a value with no alternative
// is no known type (DecodeHeader refuses it, and wire_test counts them).
using Message =
    std::variant<Hello, Welcome, Ping, Pong, OkResponse, ErrorResponse, CountResponse, AllocateRequest,
                 AllocateResponse, CommitRequest, CommitResponse, AcquireRequest, AcquireResponse, ReleaseRequest,
                 SaveRequest, SaveResponse, PrefetchRequest, DemoteRequest, EvictRequest, SetPriorityRequest,
                 ListSessionsRequest, ListSessionsResponse, SessionInfoRequest, SessionInfoResponse, StatsRequest,
                 StatsResponse, ConfigRequest, ConfigResponse, EndSessionRequest>;

namespace internal {
// The kTypes of the alternatives strictly increase (so no two share a value and
// the variant lists them in the enum's order), and no two kNames are equal.
template <typename... M>
constexpr bool AlternativesFollowTheEnum(const std::variant<M...>*) {
  constexpr MessageType types[] = {M::kType...};
  constexpr std::string_view names[] = {M::kName...};
  for (size_t i = 1; i < sizeof...(M); ++i) {
    if (!(types[i - 1] < types[i])) return false;
    for (size_t j = 0; j < i; ++j) {
      if (names[j] == names[i]) return false;
    }
  }
  return true;
}
}  // namespace internal
static_assert(internal::AlternativesFollowTheEnum(static_cast<const Message*>(nullptr)),
              "wire::Message must list its alternatives in MessageType order, each with its own kType and kName");

MessageType TypeOf(const Message& m);

// What a client sends, each answered with one reply: Hello, Ping and every
// *Request. kvtierd has a handler for each (a request without one does not compile).
template <typename M>
inline constexpr bool kIsRequest = std::is_same_v<M, Hello> || std::is_same_v<M, Ping> ||
                                   std::string_view(M::kName).ends_with("Request");

// An ErrorResponse's Status (never ok: a kOk code reads as kInternal), and back.
// FromStatus truncates the message to kMaxString bytes; REQUIRES: !status.ok()
// (an ok status becomes kInternal).
Status ToStatus(const ErrorResponse& e);
ErrorResponse FromStatus(const Status& status);

}  // namespace kvtier::wire
