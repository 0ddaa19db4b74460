// KV events: batches encoded on the loop's thread, published by the events helper process (kv_events.h).
#include "events/kv_events.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include "events/events_link.h"
#include "kvtier/event_stream.h"

namespace kvtier::daemon {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void Str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// 16 bytes, the high word first, big-endian: the bytes BlockKey::ToHex spells.
void Key(Packer& p, const BlockKey& k) {
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>((k.hi >> (56 - 8 * i)) & 0xff);
    b[8 + i] = static_cast<char>((k.lo >> (56 - 8 * i)) & 0xff);
  }
  p.pack_bin(16);
  p.pack_bin_body(b, 16);
}

// vLLM's block hash for a key: its low word, an unsigned 64-bit int. That is
// the last 8 bytes of Key's 16 (and of vLLM's own int hashes), so a reader
// that keeps only the last 8 bytes of a hash keeps all of it.
void VllmHash(Packer& p, const BlockKey& k) { p.pack_uint64(k.lo); }

const char* VllmMedium(Tier tier) { return tier == Tier::kGpu ? "GPU" : "CPU"; }
// The stores below the host tier, all of them one medium.
constexpr const char* kVllmStorage = "STORAGE";

// vLLM's BlockStored (vllm/distributed/kv_events.py): a tagged map, the tag in
// `type`, the fields it requires, the ones it defaults (omit_defaults) left out.
void VllmStored(Packer& p, const BlockKey& key, const BlockKey& parent, std::span<const TokenId> tokens,
                uint32_t block_tokens, const char* medium) {
  p.pack_map(8);
  Str(p, "type");
  Str(p, "BlockStored");
  Str(p, "block_hashes");
  p.pack_array(1);
  VllmHash(p, key);
  Str(p, "parent_block_hash");
  if (parent.IsNull()) {
    p.pack_nil();
  } else {
    VllmHash(p, parent);
  }
  Str(p, "token_ids");
  p.pack_array(static_cast<uint32_t>(tokens.size()));
  for (TokenId t : tokens) p.pack_uint32(t);
  Str(p, "block_size");
  p.pack_uint32(block_tokens);
  Str(p, "lora_id");
  p.pack_nil();
  Str(p, "medium");
  Str(p, medium);
  Str(p, "lora_name");
  p.pack_nil();
}

void VllmRemoved(Packer& p, const BlockKey& key, const char* medium) {
  p.pack_map(3);
  Str(p, "type");
  Str(p, "BlockRemoved");
  Str(p, "block_hashes");
  p.pack_array(1);
  VllmHash(p, key);
  Str(p, "medium");
  Str(p, medium);
}

}  // namespace

struct EventPublisher::Impl {
  EventsConfig config;
  bool vllm = false;  // config.format == "vllm".
  std::string publish, replay;
  std::string instance_hex;
  std::unique_ptr<EventsLink> link;       // To the helper process that owns the sockets.
  std::vector<std::string> socket_files;  // Of ipc:// endpoints: removed at the end.

  // The open batch: its events, encoded, and how many.
  msgpack::sbuffer pending;
  Packer packer{pending};
  uint32_t open = 0;
  uint64_t next_seq = 1;
  bool cleared_sent = false;

  // The blocks announced in STORAGE (vllm format): which stores (a bit per
  // chain index) are believed to hold each, and the order they were announced
  // in, oldest first (forgotten first past kMaxStorageBlocks).
  struct Stored {
    uint8_t stores = 0;
    std::list<BlockKey>::iterator at;
  };
  std::unordered_map<BlockKey, Stored, BlockKeyHash> storage;
  std::list<BlockKey> storage_order;
};

EventPublisher::EventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<EventPublisher>> EventPublisher::Start(const EventsConfig& config, const std::string& publish,
                                                              const std::string& replay, const AccessConfig& access,
                                                              uint64_t instance) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->vllm = config.format == "vllm";
  impl->publish = publish;
  impl->replay = replay;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(instance));
  impl->instance_hex = hex;
  for (const std::string* ep : {&publish, &replay}) {
    if (ep->starts_with("ipc://")) impl->socket_files.push_back(ep->substr(6));
  }
  HelperConfig helper;
  helper.publish = publish;
  helper.replay = replay;
  helper.topic = config.topic;
  helper.vllm = impl->vllm;
  helper.group = access.group;
  helper.group_gid = access.group_gid;
  helper.mode = access.mode;
  helper.replay_batches = config.replay_batches;
  helper.queue_batches = config.queue_batches;
  auto link = EventsLink::Start(std::move(helper));
  if (!link.ok()) return link.status();
  impl->link = std::move(link).value();
  return std::unique_ptr<EventPublisher>(new EventPublisher(std::move(impl)));
}

EventPublisher::~EventPublisher() {
  impl_->link.reset();  // The helper has exited (and removed its socket files) or was killed.
  for (const std::string& path : impl_->socket_files) ::unlink(path.c_str());
}

const EventCounters& EventPublisher::counters() const {
  const EventsLink& l = *impl_->link;
  counters_.replays.store(l.replays(), std::memory_order_relaxed);
  counters_.replays_refused.store(l.replays_refused(), std::memory_order_relaxed);
  counters_.helper_restarts.store(l.restarts(), std::memory_order_relaxed);
  return counters_;
}

pid_t EventPublisher::helper_pid() const { return impl_->link->helper_pid(); }

const std::string& EventPublisher::publish_endpoint() const { return impl_->publish; }
const std::string& EventPublisher::replay_endpoint() const { return impl_->replay; }

void EventPublisher::AddBlock(std::string_view profile, uint32_t block_tokens, const tiering::BlockEvent& e) {
  Impl& m = *impl_;
  Packer& p = m.packer;
  using K = tiering::BlockEventKind;
  if (m.vllm) {
    // A move is a store where the block is now, then a removal where it was:
    // a reader finds it in one medium at least, never in none.
    if (e.kind != K::kRemoved) {
      VllmStored(p, e.key, e.parent, e.tokens, block_tokens, VllmMedium(e.tier));
      Added();
    }
    if (e.kind != K::kStored) {
      VllmRemoved(p, e.key, VllmMedium(e.kind == K::kMoved ? e.from : e.tier));
      Added();
    }
    return;
  }
  const bool tokens = e.kind == K::kStored && m.config.token_ids;
  p.pack_map(e.kind == K::kStored ? 6 + (tokens ? 1 : 0) : e.kind == K::kMoved ? 5 : 4);
  Str(p, "type");
  Str(p, e.kind == K::kStored ? "stored" : e.kind == K::kMoved ? "moved" : "removed");
  Str(p, "profile");
  Str(p, profile);
  Str(p, "key");
  Key(p, e.key);
  switch (e.kind) {
    case K::kStored:
      Str(p, "parent");
      if (e.parent.IsNull()) {
        p.pack_nil();
      } else {
        Key(p, e.parent);
      }
      Str(p, "tier");
      Str(p, TierName(e.tier));
      Str(p, "block_tokens");
      p.pack_uint32(block_tokens);
      if (tokens) {
        Str(p, "tokens");
        p.pack_array(static_cast<uint32_t>(e.tokens.size()));
        for (TokenId t : e.tokens) p.pack_uint32(t);
      }
      break;
    case K::kMoved:
      Str(p, "from");
      Str(p, TierName(e.from));
      Str(p, "to");
      Str(p, TierName(e.tier));
      break;
    case K::kRemoved:
      Str(p, "tier");
      Str(p, TierName(e.tier));
      break;
  }
  Added();
}

void EventPublisher::AddSessionEvicted(std::string_view profile, std::string_view tenant, std::string_view session) {
  Impl& m = *impl_;
  if (m.vllm) return;  // vLLM has no sessions; the session's blocks have their own removals.
  Packer& p = m.packer;
  p.pack_map(4);
  Str(p, "type");
  Str(p, "session_evicted");
  Str(p, "profile");
  Str(p, profile);
  Str(p, "tenant");
  Str(p, tenant);
  Str(p, "session");
  Str(p, session);
  Added();
}

void EventPublisher::AddStorage(const stores::StoreEvent& e) {
  Impl& m = *impl_;
  if (!m.vllm) return;
  const auto bit = static_cast<uint8_t>(1u << (e.store & 7));  // At most 8 stores (stores.tiers).
  auto it = m.storage.find(e.key);
  if (e.kind == stores::StoreEvent::Kind::kGone) {
    if (it == m.storage.end()) return;  // Never announced (or forgotten): nothing to take back.
    it->second.stores &= static_cast<uint8_t>(~bit);
    if (it->second.stores != 0) return;  // Another store holds it still.
    m.storage_order.erase(it->second.at);
    m.storage.erase(it);
    VllmRemoved(m.packer, e.key, kVllmStorage);
    Added();
    return;
  }
  if (it != m.storage.end()) {  // Announced already: one STORAGE entry per block, whichever stores hold it.
    it->second.stores |= bit;
    return;
  }
  if (m.storage.size() >= kMaxStorageBlocks) {
    const BlockKey oldest = m.storage_order.front();
    m.storage_order.pop_front();
    m.storage.erase(oldest);
    counters_.storage_forgotten.fetch_add(1, std::memory_order_relaxed);
    VllmRemoved(m.packer, oldest, kVllmStorage);
    Added();
  }
  m.storage_order.push_back(e.key);
  m.storage.emplace(e.key, Impl::Stored{bit, std::prev(m.storage_order.end())});
  VllmStored(m.packer, e.key, e.parent, e.tokens, static_cast<uint32_t>(e.tokens.size()), kVllmStorage);
  Added();
}

void EventPublisher::Added() {
  counters_.events.fetch_add(1, std::memory_order_relaxed);
  if (++impl_->open >= impl_->config.max_batch_events) Flush();
}

void EventPublisher::Flush() {
  Impl& m = *impl_;
  m.link->Tick();
  if (m.open == 0 && m.cleared_sent) return;
  const uint64_t seq = m.next_seq++;
  msgpack::sbuffer batch(m.pending.size() + 96);
  Packer p(batch);
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const uint32_t count = m.open + (m.cleared_sent ? 0 : 1);
  if (m.vllm) {
    // vLLM's KVEventBatch: an array [ts, events, data_parallel_rank].
    p.pack_array(3);
    p.pack_double(ts);
    p.pack_array(count);
    if (!m.cleared_sent) {
      p.pack_map(1);
      Str(p, "type");
      Str(p, "AllBlocksCleared");
      m.cleared_sent = true;
    }
    batch.write(m.pending.data(), m.pending.size());
    p.pack_uint32(0);
  } else {
    p.pack_map(5);
    Str(p, "v");
    p.pack_uint32(events::kFormatVersion);
    Str(p, "seq");
    p.pack_uint64(seq);
    Str(p, "ts");
    p.pack_double(ts);
    Str(p, "instance");
    Str(p, m.instance_hex);
    Str(p, "events");
    p.pack_array(count);
    if (!m.cleared_sent) {
      // The stream's first event: a subscriber forgets what it knew of this instance.
      p.pack_map(1);
      Str(p, "type");
      Str(p, "cleared");
      m.cleared_sent = true;
    }
    batch.write(m.pending.data(), m.pending.size());
  }
  m.pending.clear();
  m.open = 0;
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  counters_.last_seq.store(seq, std::memory_order_relaxed);
  // Never waits: no room for it (the helper is behind, or none runs) means the batch is dropped.
  if (!m.link->Send(seq, std::make_shared<const std::string>(batch.data(), batch.size())))
    counters_.dropped_batches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvtier::daemon
