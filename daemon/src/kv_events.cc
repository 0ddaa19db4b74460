// KV events: batches encoded on the loop's thread, published by a thread of their own (kv_events.h).
#include "kv_events.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvtier/event_stream.h"

namespace kvtier::daemon {
namespace {

constexpr const char* kPipe = "inproc://kvtier-events";
// What a peer may send: a replay request is [empty, 8 bytes], a subscription a
// topic. A larger message closes its connection before it is buffered (two
// peers sending 700 MiB of a declared 1 GiB frame grew kvtierd by 1.4 GiB).
constexpr int64_t kMaxReplayMessage = 64;
constexpr int64_t kMaxSubscription = 4096;
// Replays answered, all peers together: a burst of kReplayBurst, then
// kReplaysPerSecond. A request past it gets the end marker alone (nothing
// replayed; the subscriber reports the batches lost), so a flood of requests
// costs the publisher thread little and the event loop nothing.
constexpr double kReplaysPerSecond = 20;
constexpr double kReplayBurst = 20;

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

// Binds `s` to `endpoint`; an ipc:// socket file is born 0600 (whatever the
// umask), then gets the daemon socket's group and mode.
Status Bind(zmq::socket_t& s, const std::string& endpoint, const AccessConfig& access, const char* what) {
  const bool ipc = endpoint.starts_with("ipc://");
  const std::string path = ipc ? endpoint.substr(6) : std::string();
  const mode_t old = ::umask(0177);
  try {
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    ::umask(old);
    return Unavailable(std::string("events: cannot bind ") + what + " '" + endpoint + "': " + e.what());
  }
  ::umask(old);
  if (!ipc) return Status::Ok();
  if (access.group_gid != AccessConfig::kNoGroup &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), access.group_gid) != 0) {
    return Status(StatusCode::kPermissionDenied,
                  "events: cannot give " + path + " to group " + access.group + ": " + std::strerror(errno));
  }
  if (::chmod(path.c_str(), access.mode) != 0) {
    return Unavailable("events: cannot chmod " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

struct EventPublisher::Impl {
  EventsConfig config;
  bool vllm = false;  // config.format == "vllm".
  std::string publish, replay;
  std::string instance_hex;
  zmq::context_t context{1};
  zmq::socket_t pipe_in;                  // The loop's end of the pipe (PUSH).
  std::vector<std::string> socket_files;  // Of ipc:// endpoints: removed at the end.
  std::thread thread;

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

  void Run(zmq::socket_t pipe_out, zmq::socket_t pub, zmq::socket_t router, EventCounters* counters) const;
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
  zmq::socket_t pipe_out, pub, router;
  pub = zmq::socket_t(impl->context, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.set(zmq::sockopt::sndhwm, static_cast<int>(config.queue_batches));
  pub.set(zmq::sockopt::maxmsgsize, kMaxSubscription);
  for (const std::string* ep : {&publish, &replay}) {
    if (ep->starts_with("ipc://")) impl->socket_files.push_back(ep->substr(6));
  }
  KVTIER_RETURN_IF_ERROR(Bind(pub, publish, access, "events.publish"));
  router = zmq::socket_t(impl->context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  // A replay is at most replay_batches messages: queued whole, never dropped midway.
  router.set(zmq::sockopt::sndhwm, static_cast<int>(config.replay_batches + 16));
  router.set(zmq::sockopt::maxmsgsize, kMaxReplayMessage);
  KVTIER_RETURN_IF_ERROR(Bind(router, replay, access, "events.replay"));
  pipe_out = zmq::socket_t(impl->context, zmq::socket_type::pull);
  pipe_out.set(zmq::sockopt::rcvhwm, static_cast<int>(config.queue_batches));
  pipe_out.bind(kPipe);
  impl->pipe_in = zmq::socket_t(impl->context, zmq::socket_type::push);
  impl->pipe_in.set(zmq::sockopt::sndhwm, static_cast<int>(config.queue_batches));
  impl->pipe_in.set(zmq::sockopt::linger, 0);
  impl->pipe_in.connect(kPipe);
  std::unique_ptr<EventPublisher> p(new EventPublisher(std::move(impl)));
  Impl* raw = p->impl_.get();
  raw->thread = std::thread([raw, counters = &p->counters_, out = std::move(pipe_out), pub = std::move(pub),
                             router = std::move(router)]() mutable {
    raw->Run(std::move(out), std::move(pub), std::move(router), counters);
  });
  return p;
}

EventPublisher::~EventPublisher() {
  // An empty message stops the thread; it waits for room if the pipe is full.
  impl_->pipe_in.set(zmq::sockopt::sndtimeo, 2000);
  (void)impl_->pipe_in.send(zmq::message_t(), zmq::send_flags::none);
  impl_->thread.join();
  impl_->pipe_in.close();
  for (const std::string& path : impl_->socket_files) ::unlink(path.c_str());
}

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
  const std::string seq8 = events::EncodeSeq(seq);
  // The encoded batch is handed over, not copied: the message frees it once every subscriber has it.
  const size_t size = batch.size();
  std::array<zmq::message_t, 2> parts = {zmq::message_t(seq8.data(), seq8.size()),
                                         zmq::message_t(batch.release(), size, [](void* d, void*) { std::free(d); })};
  // Never waits: a full pipe means the publisher thread is behind, and the batch is dropped.
  const auto sent = zmq::send_multipart(m.pipe_in, parts, zmq::send_flags::dontwait);
  if (!sent) counters_.dropped_batches.fetch_add(1, std::memory_order_relaxed);
}

void EventPublisher::Impl::Run(zmq::socket_t pipe_out, zmq::socket_t pub, zmq::socket_t router,
                               EventCounters* counters) const {
  // The last replay_batches batches, by seq. Sending one shares its bytes (zmq_msg_copy), never copies them.
  std::deque<std::pair<uint64_t, zmq::message_t>> kept;
  auto shared = [](zmq::message_t& m) {
    zmq::message_t out;
    out.copy(m);
    return out;
  };
  double tokens = kReplayBurst;  // Replays that may be answered now (the token bucket above).
  auto refilled = std::chrono::steady_clock::now();
  std::array<zmq::pollitem_t, 2> items = {zmq::pollitem_t{pipe_out.handle(), 0, ZMQ_POLLIN, 0},
                                          zmq::pollitem_t{router.handle(), 0, ZMQ_POLLIN, 0}};
  for (;;) {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
    if (items[0].revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(pipe_out, std::back_inserter(parts));
      if (parts.size() != 2) break;  // The stop message.
      const uint64_t seq = events::DecodeSeq(parts[0].data(), parts[0].size());
      zmq::message_t batch = std::move(parts[1]);
      if (config.replay_batches > 0) {
        kept.emplace_back(seq, shared(batch));
        if (kept.size() > config.replay_batches) kept.pop_front();
      }
      // PUB never blocks: past a subscriber's high-water mark its messages are dropped.
      std::array<zmq::message_t, 3> out = {zmq::message_t(config.topic.data(), config.topic.size()),
                                           std::move(parts[0]), std::move(batch)};
      (void)zmq::send_multipart(pub, out, zmq::send_flags::dontwait);
    }
    if (items[1].revents & ZMQ_POLLIN) {
      std::vector<zmq::message_t> req;
      (void)zmq::recv_multipart(router, std::back_inserter(req));
      if (req.empty()) continue;
      // [identity, empty, start]; anything else gets the end marker alone.
      uint64_t start = events::kReplayEnd;
      if (req.size() == 3 && req[1].size() == 0 && req[2].size() == events::kSeqBytes)
        start = events::DecodeSeq(req[2].data(), req[2].size());
      auto reply = [&](uint64_t seq, zmq::message_t batch) {
        const std::string seq8 = events::EncodeSeq(seq);
        zmq::message_t id = shared(req[0]), seq_frame(seq8.data(), seq8.size());
        if (vllm) {
          // vLLM's: [empty, topic, seq, batch]; the end marker's topic and batch are empty.
          zmq::message_t topic =
              seq == events::kReplayEnd ? zmq::message_t() : zmq::message_t(config.topic.data(), config.topic.size());
          std::array<zmq::message_t, 5> out = {std::move(id), zmq::message_t(), std::move(topic), std::move(seq_frame),
                                               std::move(batch)};
          (void)zmq::send_multipart(router, out, zmq::send_flags::dontwait);
          return;
        }
        std::array<zmq::message_t, 4> out = {std::move(id), zmq::message_t(), std::move(seq_frame), std::move(batch)};
        (void)zmq::send_multipart(router, out, zmq::send_flags::dontwait);
      };
      const auto now = std::chrono::steady_clock::now();
      tokens = std::min(kReplayBurst, tokens + std::chrono::duration<double>(now - refilled).count() * kReplaysPerSecond);
      refilled = now;
      if (tokens >= 1) {
        tokens -= 1;
        for (auto& [seq, batch] : kept) {
          if (seq >= start) reply(seq, shared(batch));
        }
        counters->replays.fetch_add(1, std::memory_order_relaxed);
      } else {
        counters->replays_refused.fetch_add(1, std::memory_order_relaxed);
      }
      reply(events::kReplayEnd, zmq::message_t());
    }
  }
}

}  // namespace kvtier::daemon
