// Each message's encoding: its fields, in order, through one codec that serves
// both directions (wire_codec.h's Writer and Reader). Internal to wire.cc, which
// encodes and decodes every wire::Message with these. A new message's struct
// (kvtier/wire_messages.h) gets its Fields here; one that has none does not compile.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvtier/wire.h"

namespace kvtier::wire::fields {

// One codec per type serves both directions: IO is a Writer (M is const) or a
// Reader (M is mutable), so the encoder and the decoder cannot drift apart.
template <typename M, typename T>
concept Is = std::same_as<std::remove_const_t<M>, T>;

// Value ranges of the enums on the wire: [first, end).
constexpr uint64_t kDTypeEnd = static_cast<uint64_t>(DType::kF32) + 1;
constexpr uint64_t kTierEnd = kTierCount;
constexpr uint64_t kStreamEnd = kCopyStreams;
constexpr uint64_t kFirstErrorCode = static_cast<uint64_t>(StatusCode::kInvalidArgument);

// One past the last StatusCode: the first value StatusCodeName has no name for.
// Its switch names every enumerator (the compiler checks it), so a code appended
// to StatusCode is valid on the wire without another edit here.
inline uint64_t StatusCodeEnd() {
  static const uint64_t end = [] {
    uint64_t code = kFirstErrorCode;
    while (StatusCodeName(static_cast<StatusCode>(code)) != "unknown") ++code;
    return code;
  }();
  return end;
}

// Smallest encodings of the array elements, for Reader::Count.
constexpr size_t kBlockKeyBytes = 16;
constexpr size_t kBlockLocMinBytes = 1 + 4;
constexpr size_t kPoolDescMinBytes = 1 + 8 + 4 + 4 + 4;
constexpr size_t kSessionSummaryMinBytes = 4 + 4 + 4 + 8 + 4 * 4 + 8 + 16;
constexpr size_t kStatMinBytes = 4 + 8;

template <typename IO, Is<BlockKey> M>
void Fields(IO& io, M& k) {
  io.U64("lo", k.lo);
  io.U64("hi", k.hi);
}

template <typename IO, Is<ModelProfile> M>
void Fields(IO& io, M& p) {
  io.String("profile.name", p.name);
  io.U32("profile.layers", p.layers);
  io.U32("profile.kv_heads", p.kv_heads);
  io.U32("profile.head_dim", p.head_dim);
  io.Enum("profile.dtype", p.dtype, kDTypeEnd);
  io.U32("profile.block_tokens", p.block_tokens);
}

template <typename IO, Is<PoolDesc> M>
void Fields(IO& io, M& p) {
  io.Enum("tier", p.tier, kTierEnd);
  io.U64("slot_bytes", p.slot_bytes);
  io.U32("slots", p.slots);
  io.String("shm_name", p.shm_name);
  io.Bytes("ipc_handle", p.ipc_handle, kMaxIpcHandle);
}

template <typename IO, Is<BlockLoc> M>
void Fields(IO& io, M& b) {
  io.Enum("tier", b.tier, kTierEnd);
  io.U32("slot", b.slot);
}

template <typename IO, Is<SessionSummary> M>
void Fields(IO& io, M& s) {
  io.String("id", s.id);
  io.String("tenant", s.tenant);
  io.I32("priority", s.priority);
  io.U64("last_use_ms_ago", s.last_use_ms_ago);
  io.U32("blocks", s.blocks);
  io.U32("gpu_blocks", s.gpu_blocks);
  io.U32("host_blocks", s.host_blocks);
  io.U32("moving", s.moving);
  io.U64("tokens", s.tokens);
  io.U64("model.lo", s.model.id.lo);
  io.U64("model.hi", s.model.id.hi);
}

// Welcome.backend: the kind's name as a string.
inline void Backend(Writer& w, BackendKind kind) {
  const std::string_view name = BackendKindName(kind);
  w.Require(name != "unknown", "backend", "is not a BackendKind");
  w.String("backend", name);
}
inline void Backend(Reader& r, BackendKind& kind) {
  std::string name;
  if (!r.String("backend", name)) return;
  const std::optional<BackendKind> parsed = ParseBackendKind(name);
  if (!r.Require(parsed.has_value(), "backend", "names no backend kind (host, cuda)")) return;
  kind = *parsed;
}

// Welcome.fence_events: an extension byte string of whole event handles.
inline void FenceEvents(Writer& w, const std::vector<IpcEventHandle>& events) {
  w.Require(events.size() <= kMaxFenceEvents, "fence_events", "has more than kMaxFenceEvents entries");
  std::vector<uint8_t> flat;
  flat.reserve(events.size() * kIpcEventHandleBytes);
  for (const IpcEventHandle& e : events) flat.insert(flat.end(), e.begin(), e.end());
  w.ExtensionBytes("fence_events", flat, kMaxFenceEvents * kIpcEventHandleBytes);
}
inline void FenceEvents(Reader& r, std::vector<IpcEventHandle>& events) {
  std::vector<uint8_t> flat;
  events.clear();
  if (!r.ExtensionBytes("fence_events", flat, kMaxFenceEvents * kIpcEventHandleBytes)) return;
  if (!r.Require(flat.size() % kIpcEventHandleBytes == 0, "fence_events", "is not a whole number of 64-byte handles")) {
    return;
  }
  events.resize(flat.size() / kIpcEventHandleBytes);
  for (size_t i = 0; i < events.size(); ++i) {
    std::memcpy(events[i].data(), flat.data() + i * kIpcEventHandleBytes, kIpcEventHandleBytes);
  }
}

// CommitRequest.writer_event, ReleaseRequest.after_event: an extension byte
// string of one event handle.
inline void OneEvent(Writer& w, const char* name, const std::optional<IpcEventHandle>& event) {
  if (event) w.ExtensionBytes(name, *event, kIpcEventHandleBytes);
}
inline void OneEvent(Reader& r, const char* name, std::optional<IpcEventHandle>& event) {
  std::vector<uint8_t> bytes;
  event.reset();
  if (!r.ExtensionBytes(name, bytes, kIpcEventHandleBytes) || bytes.empty()) return;
  if (!r.Require(bytes.size() == kIpcEventHandleBytes, name, "is not one 64-byte event handle")) return;
  event.emplace();
  std::memcpy(event->data(), bytes.data(), kIpcEventHandleBytes);
}

// Hello.model: an extension byte string of 16 bytes (lo, hi little-endian).
inline void ModelIdentity(Writer& w, const ModelId& model) {
  if (model.IsNull()) return;
  std::vector<uint8_t> bytes(16);
  std::memcpy(bytes.data(), &model.id.lo, 8);
  std::memcpy(bytes.data() + 8, &model.id.hi, 8);
  w.ExtensionBytes("model", bytes, 16);
}
inline void ModelIdentity(Reader& r, ModelId& model) {
  std::vector<uint8_t> bytes;
  model = ModelId{};
  if (!r.ExtensionBytes("model", bytes, 16) || bytes.empty()) return;
  if (!r.Require(bytes.size() == 16, "model", "is not a 16-byte model identity")) return;
  std::memcpy(&model.id.lo, bytes.data(), 8);
  std::memcpy(&model.id.hi, bytes.data() + 8, 8);
  r.Require(!model.IsNull(), "model", "is the null identity (leave the field out instead)");
}

template <typename IO, Is<Hello> M>
void Fields(IO& io, M& m) {
  io.U16("min_version", m.min_version);
  io.U16("max_version", m.max_version);
  io.Require(m.min_version >= 1 && m.min_version <= m.max_version, "min_version",
             "must satisfy 1 <= min_version <= max_version");
  io.String("client_name", m.client_name);
  io.U32("pid", m.pid);
  io.String("tenant", m.tenant);
  io.String("profile", m.profile);
  ModelIdentity(io, m.model);
}

template <typename IO, Is<Welcome> M>
void Fields(IO& io, M& m) {
  io.U16("version", m.version);
  io.U64("instance_id", m.instance_id);
  io.U32("client_id", m.client_id);
  Fields(io, m.profile);
  io.U64("ns.lo", m.ns.id.lo);
  io.U64("ns.hi", m.ns.id.hi);
  Backend(io, m.backend);
  io.Array("pools", m.pools, kPoolDescMinBytes, [](auto& sub, auto& p) { Fields(sub, p); });
  io.String("index_segment", m.index_segment);
  io.String("fence_segment", m.fence_segment);
  io.U32("max_blocks_per_request", m.max_blocks_per_request);
  io.U32("max_payload", m.max_payload);
  FenceEvents(io, m.fence_events);
}

template <typename IO, Is<AllocateRequest> M>
void Fields(IO& io, M& m) {
  io.U32("count", m.count);
}

template <typename IO, Is<AllocateResponse> M>
void Fields(IO& io, M& m) {
  io.U64("lease_id", m.lease_id);
  io.U32s("slots", m.slots);
}

template <typename IO, Is<CommitRequest> M>
void Fields(IO& io, M& m) {
  io.U64("lease_id", m.lease_id);
  io.String("session", m.session);
  io.U64("parent.lo", m.parent.lo);
  io.U64("parent.hi", m.parent.hi);
  io.U32("start_block", m.start_block);
  io.U32s("tokens", m.tokens);
  io.U32s("slots", m.slots);
  OneEvent(io, "writer_event", m.writer_event);
}

template <typename IO, Is<CommitResponse> M>
void Fields(IO& io, M& m) {
  io.U32("stored", m.stored);
  io.U32("duplicates", m.duplicates);
}

template <typename IO, Is<SaveRequest> M>
void Fields(IO& io, M& m) {
  io.U64("lease_id", m.lease_id);
  io.String("session", m.session);
  io.U64("parent.lo", m.parent.lo);
  io.U64("parent.hi", m.parent.hi);
  io.U32("start_block", m.start_block);
  io.U8("flags", m.flags);
  io.Require((m.flags & ~kSaveKnownFlags) == 0, "flags", "has unknown bits set");
  io.U32("refill", m.refill);
  io.U32s("tokens", m.tokens);
  io.U32s("slots", m.slots);
  OneEvent(io, "writer_event", m.writer_event);
}

template <typename IO, Is<SaveResponse> M>
void Fields(IO& io, M& m) {
  io.U32("stored", m.stored);
  io.U32("duplicates", m.duplicates);
  io.U32("adopted", m.adopted);
  io.U64("last.lo", m.last.lo);
  io.U64("last.hi", m.last.hi);
  io.U64("lease_id", m.lease_id);
  io.U32("lease_ttl_ms", m.lease_ttl_ms);
  io.U32s("slots", m.slots);
}

template <typename IO, Is<AcquireRequest> M>
void Fields(IO& io, M& m) {
  io.String("session", m.session);
  io.U8("flags", m.flags);
  io.Require((m.flags & ~kAcquireKnownFlags) == 0, "flags", "has unknown bits set");
  io.Require((m.flags & kAcquirePromote) == 0 || (m.flags & kAcquirePromoteAfterRead) == 0, "flags",
             "asks to promote both before and after reading");
  io.Require((m.flags & kAcquireLocate) == 0 || (m.flags & (kAcquirePromote | kAcquirePromoteAfterRead)) == 0, "flags",
             "asks to promote what it leases nothing of (locate)");
  io.Array("keys", m.keys, kBlockKeyBytes, [](auto& sub, auto& k) { Fields(sub, k); });
  io.U32s("tokens", m.tokens);
}

template <typename IO, Is<AcquireResponse> M>
void Fields(IO& io, M& m) {
  io.U64("lease_id", m.lease_id);
  io.U32("matched", m.matched);
  io.U32("promoted", m.promoted);
  io.U64("fence.seq", m.fence.seq);
  io.Enum("fence.stream", m.fence.stream, kStreamEnd);
  io.Array("blocks", m.blocks, kBlockLocMinBytes, [](auto& sub, auto& b) { Fields(sub, b); });
}

template <typename IO, Is<ReleaseRequest> M>
void Fields(IO& io, M& m) {
  io.U64("lease_id", m.lease_id);
  OneEvent(io, "after_event", m.after_event);
}

template <typename IO, typename M>
requires Is<M, PrefetchRequest> || Is<M, DemoteRequest> || Is<M, SessionInfoRequest> || Is<M, EndSessionRequest>
void Fields(IO& io, M& m) { io.String("session", m.session); }

template <typename IO, Is<EvictRequest> M>
void Fields(IO& io, M& m) {
  io.String("session", m.session);
  io.String("tenant", m.tenant);
  io.Bool("all", m.all);
}

template <typename IO, Is<SetPriorityRequest> M>
void Fields(IO& io, M& m) {
  io.String("session", m.session);
  io.I32("priority", m.priority);
  io.ExtensionU64("ttl_ms", m.ttl_ms);
}

template <typename IO, Is<CountResponse> M>
void Fields(IO& io, M& m) {
  io.U32("count", m.count);
}

template <typename IO, Is<ListSessionsPage> M>
void Fields(IO& io, M& p) {
  io.U32("limit", p.limit);
  io.String("after_tenant", p.after_tenant);
  io.String("after_id", p.after_id);
  io.Require(!p.after_id.empty() || p.after_tenant.empty(), "after_tenant", "is set without an after_id");
}

// ListSessionsRequest.page: an extension byte string holding the page's fields.
constexpr size_t kMaxPageBytes = 4 + (4 + kMaxString) * 2;

inline void Page(Writer& w, const std::optional<ListSessionsPage>& page) {
  if (!page || !w.ok()) return;
  std::vector<uint8_t> bytes;
  Writer inner(&bytes, "page");
  Fields(inner, *page);
  if (!inner.ok()) return w.Require(false, "page", inner.status().message().c_str());
  w.ExtensionBytes("page", bytes, kMaxPageBytes);
}
inline void Page(Reader& r, std::optional<ListSessionsPage>& page) {
  std::vector<uint8_t> bytes;
  page.reset();
  if (!r.ExtensionBytes("page", bytes, kMaxPageBytes) || bytes.empty()) return;
  Reader inner(bytes, "page");
  ListSessionsPage p;
  Fields(inner, p);
  const Status st = inner.Finish();
  if (!r.Require(st.ok(), "page", st.message().c_str())) return;
  page = std::move(p);
}

// ListSessionsResponse.more: an extension u64, 1 when set.
inline void More(Writer& w, bool more) { w.ExtensionU64("more", more ? 1 : 0); }
inline void More(Reader& r, bool& more) {
  uint64_t v = 0;
  more = false;
  if (!r.ExtensionU64("more", v) || v == 0) return;
  more = r.Require(v == 1, "more", "must be 1 when present");
}

template <typename IO, Is<ListSessionsRequest> M>
void Fields(IO& io, M& m) {
  io.String("tenant_filter", m.tenant_filter);
  Page(io, m.page);
}

template <typename IO, Is<ListSessionsResponse> M>
void Fields(IO& io, M& m) {
  io.Array("sessions", m.sessions, kSessionSummaryMinBytes, [](auto& sub, auto& s) { Fields(sub, s); });
  More(io, m.more);
}

// SessionInfoResponse.stores as one extension byte string: "disk,redis".
inline constexpr size_t kMaxStoreNames = 16, kMaxStoreName = 64;
inline bool IsStoreName(std::string_view n) {
  return !n.empty() && n.size() <= kMaxStoreName && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}
inline void StoreNamesExtension(Writer& w, const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& n : names) {
    if (!IsStoreName(n)) return w.Require(false, "stores", "each name must be 1-64 of [A-Za-z0-9_-]");
    joined += (joined.empty() ? "" : ",") + n;
  }
  w.Require(names.size() <= kMaxStoreNames, "stores", "at most 16 names");
  w.ExtensionBytes("stores", std::span(reinterpret_cast<const uint8_t*>(joined.data()), joined.size()),
                   kMaxStoreNames * (kMaxStoreName + 1));
}
inline void StoreNamesExtension(Reader& r, std::vector<std::string>& names) {
  std::vector<uint8_t> bytes;
  if (!r.ExtensionBytes("stores", bytes, kMaxStoreNames * (kMaxStoreName + 1))) return;
  names.clear();
  const std::string joined(bytes.begin(), bytes.end());
  for (size_t at = 0; at <= joined.size() && !bytes.empty();) {
    const size_t end = std::min(joined.find(',', at), joined.size());
    names.push_back(joined.substr(at, end - at));
    if (!IsStoreName(names.back())) {
      r.Require(false, "stores", "each name must be 1-64 of [A-Za-z0-9_-]");
      return;
    }
    at = end + 1;
  }
  r.Require(names.size() <= kMaxStoreNames, "stores", "at most 16 names");
}

template <typename IO, Is<SessionInfoResponse> M>
void Fields(IO& io, M& m) {
  Fields(io, m.summary);
  io.Array("chain", m.chain, kBlockKeyBytes, [](auto& sub, auto& k) { Fields(sub, k); });
  io.Bytes("tiers", m.tiers, kMaxArray);
  io.Require(m.tiers.size() == m.chain.size(), "tiers", "must have one entry per chain block");
  StoreNamesExtension(io, m.stores);
}

template <typename IO, typename M>
requires Is<M, StatsRequest> || Is<M, ConfigRequest> || Is<M, OkResponse>
void Fields(IO&, M&) {}

template <typename IO, Is<StatsResponse> M>
void Fields(IO& io, M& m) {
  io.Array("values", m.values, kStatMinBytes, [](auto& sub, auto& kv) {
    sub.String("name", kv.first);
    sub.F64("value", kv.second);
  });
}

template <typename IO, Is<ConfigResponse> M>
void Fields(IO& io, M& m) {
  io.String("yaml", m.yaml, kMaxConfigBytes);
}

template <typename IO, typename M>
requires Is<M, Ping> || Is<M, Pong>
void Fields(IO& io, M& m) { io.U64("nonce", m.nonce); }

template <typename IO, Is<ErrorResponse> M>
void Fields(IO& io, M& m) {
  io.Enum("code", m.code, StatusCodeEnd(), kFirstErrorCode);
  io.String("message", m.message);
}

}  // namespace kvtier::wire::fields
