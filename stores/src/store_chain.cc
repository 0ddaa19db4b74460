// StoreChain: the stores below the host tier and their I/O thread (store_chain.h).
#include "kvtier/stores/store_chain.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace kvtier::stores {
namespace {

using Clock = std::chrono::steady_clock;

// How much nicer than the daemon the store I/O thread runs (Run).
constexpr int kIoNice = 5;

uint64_t MicrosSince(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}

// The counters of one store, written by the I/O thread (and Offer), read by stats().
struct Counters {
  std::atomic<uint64_t> hit_blocks{0}, miss_blocks{0}, fetched_bytes{0}, fetches{0}, fetch_us{0};
  std::atomic<uint64_t> put_blocks{0}, put_bytes{0}, puts{0}, put_us{0}, put_dropped{0};
  std::atomic<uint64_t> errors{0}, corrupt{0}, foreign{0}, forged{0}, queued_bytes{0};
};

}  // namespace

struct StoreChain::Impl {
  struct Queued {
    StoreItem item;
    bool reported = false;  // Offer's.
  };
  struct Member {
    ChainedStore chained;
    Counters counters;
    std::deque<Queued> queue;  // Guarded by mu.
  };
  // A fetch under way. The I/O thread works on it without holding mu, so its
  // progress fields are that thread's alone; what the engine thread reads
  // (ready, cancelled) is guarded by mu.
  struct Fetch {
    uint64_t id = 0;
    FetchRequest request;
    Clock::time_point started;
    // The I/O thread's alone.
    std::vector<std::string> names;  // Each key's name in the stores.
    size_t chunk_blocks = 1;         // Records asked per turn.
    size_t si = 0;                   // The store asked now.
    bool in_store = false;           // Store si was asked for this fetch already.
    size_t store_from = 0;           // `have` when store si was first asked.
    size_t store_served = 0;         // Of those, what store si served.
    size_t have = 0;                 // Blocks verified so far, from the first.
    // Guarded by mu.
    FetchResult ready;  // Verified records not taken yet (payloads unset), and the first error.
    bool cancelled = false;
  };
  // What one turn of a fetch brought.
  struct Turn {
    std::vector<StoreValue> records;
    std::vector<uint8_t> store;
    Status status;
    bool finished = false;
  };
  // The fetches of one key namespace (tenant), in turn order.
  struct Lane {
    Namespace ns;
    std::deque<uint64_t> ids;
  };

  StoreChainOptions options;
  std::function<void()> notify;
  std::vector<std::unique_ptr<Member>> members;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::condition_variable room;  // Queued bytes went down (WaitForRoomUntil).
  std::optional<Clock::time_point> wait_for_room_until;
  bool stopping = false;
  std::chrono::milliseconds drain{2000};
  std::unordered_map<uint64_t, std::unique_ptr<Fetch>> running;  // Under way (queued or in a turn).
  // Whose turn is next: the front lane's front fetch. A lane with fetches
  // left goes to the back after its turn, and so does the fetch in its lane.
  std::deque<Lane> lanes;
  std::unordered_map<uint64_t, FetchResult> done;  // Completed, not taken yet.
  uint64_t next_fetch = 1;
  std::atomic<uint64_t> queued_total{0};
  std::thread io;

  // Block events (options.max_events > 0).
  std::mutex events_mu;
  std::vector<StoreEvent> events;  // Guarded by events_mu.
  std::atomic<uint64_t> dropped_events{0};
  // Keys the store being called evicted during the call (the I/O thread's
  // alone): reported once the call returned, after what it wrote.
  std::vector<std::pair<uint8_t, BlockKey>> evicted;

  bool collecting() const { return options.max_events > 0; }
  void Report(StoreEvent e);
  // The I/O thread: store `si` answered for keys[at] on (it did not error)
  // and holds `held` of them intact: the first it lacks is gone.
  void ReportGone(size_t si, std::span<const BlockKey> keys, size_t held);
  void ReportEvicted();

  void Run();
  // Queues fetch `id` for a turn in its namespace's lane. REQUIRES: mu held.
  void Enqueue(const Namespace& ns, uint64_t id);
  // One turn of fetch `f`: one chunk from one store (a whole locate).
  Turn FetchTurn(Fetch& f);
  Turn LocateTurn(Fetch& f);
  // Moves f's ready records into a result with payloads pointing into them. REQUIRES: mu held.
  FetchResult TakeReadyOf(Fetch& f);
  std::vector<std::string> StoreKeys(const FetchRequest& r) const;
  // Writes one batch of some store's queue; false if every queue was empty.
  bool PutOneBatch(std::unique_lock<std::mutex>& lock);
};

StoreChain::StoreChain(std::vector<ChainedStore> stores, StoreChainOptions options, std::function<void()> notify)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->notify = std::move(notify);
  Impl* impl = impl_.get();
  for (ChainedStore& s : stores) {
    auto m = std::make_unique<Impl::Member>();
    m->chained = std::move(s);
    if (impl->collecting()) {
      const auto si = static_cast<uint8_t>(impl->members.size());
      m->chained.store->OnEvicted([impl, si](std::string_view name) {
        if (auto key = BlockKeyOfStoreKey(impl->options.key_prefix, name)) impl->evicted.emplace_back(si, *key);
      });
    }
    impl_->members.push_back(std::move(m));
  }
  impl_->io = std::thread([this] { impl_->Run(); });
}

StoreChain::~StoreChain() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->io.join();
}

void StoreChain::WaitForRoomUntil(std::chrono::steady_clock::time_point until) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->wait_for_room_until = until;
}

void StoreChain::set_drain(std::chrono::milliseconds drain) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->drain = drain;
}

size_t StoreChain::size() const { return impl_->members.size(); }

const RecordKey* StoreChain::record_key() const { return impl_->options.record_key.get(); }

std::vector<StoreEvent> StoreChain::TakeEvents() {
  if (!impl_->collecting()) return {};
  std::vector<StoreEvent> out;
  std::lock_guard<std::mutex> lock(impl_->events_mu);
  out.swap(impl_->events);
  return out;
}

uint64_t StoreChain::dropped_events() const { return impl_->dropped_events.load(std::memory_order_relaxed); }

void StoreChain::Impl::Report(StoreEvent e) {
  std::lock_guard<std::mutex> lock(events_mu);
  if (events.size() >= options.max_events) {
    dropped_events.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  events.push_back(std::move(e));
}

void StoreChain::Impl::ReportGone(size_t si, std::span<const BlockKey> keys, size_t held) {
  if (!collecting() || held >= keys.size()) return;
  StoreEvent e;
  e.kind = StoreEvent::Kind::kGone;
  e.store = static_cast<uint8_t>(si);
  e.key = keys[held];
  Report(std::move(e));
}

void StoreChain::Impl::ReportEvicted() {
  for (const auto& [si, key] : evicted) {
    StoreEvent e;
    e.kind = StoreEvent::Kind::kGone;
    e.store = si;
    e.key = key;
    Report(std::move(e));
  }
  evicted.clear();
}

void StoreChain::Offer(const BlockRecordHeader& header, std::span<const TokenId> tokens,
                       std::span<const std::byte> payload, bool dropped, bool reported) {
  Impl& m = *impl_;
  std::vector<Impl::Member*> takers;
  for (auto& s : m.members) {
    if (s->chained.write_through != dropped) takers.push_back(s.get());
  }
  if (takers.empty()) return;
  const RecordKey* signer = m.options.record_key.get();
  const uint64_t bytes = BlockRecordBytes(tokens.size(), payload.size(), signer != nullptr);
  auto full = [&] {
    return m.queued_total.load(std::memory_order_relaxed) + bytes * takers.size() > m.options.max_queued_bytes;
  };
  if (full()) {
    std::unique_lock<std::mutex> lock(m.mu);
    if (m.wait_for_room_until) m.room.wait_until(lock, *m.wait_for_room_until, [&] { return !full(); });
  }
  if (full()) {
    for (Impl::Member* s : takers) s->counters.put_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Signed on the I/O thread (PutOneBatch): the MAC costs far more than this copy.
  std::string record = signer != nullptr ? EncodeBlockRecord(header, tokens, payload, *signer, /*sign_now=*/false)
                                         : EncodeBlockRecord(header, tokens, payload);
  const std::string key = StoreKey(m.options.key_prefix, header.profile_fingerprint, header.key);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (size_t i = 0; i < takers.size(); ++i) {
      // The last taker gets the record itself, the others a copy.
      takers[i]->queue.push_back(
          Impl::Queued{StoreItem{key, i + 1 == takers.size() ? std::move(record) : record}, reported});
      takers[i]->counters.queued_bytes.fetch_add(bytes, std::memory_order_relaxed);
      m.queued_total.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  m.wake.notify_one();
}

uint64_t StoreChain::StartFetch(FetchRequest request) {
  Impl& m = *impl_;
  auto f = std::make_unique<Impl::Fetch>();
  f->started = Clock::now();
  const Namespace ns = request.key_ns;
  f->request = std::move(request);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    id = m.next_fetch++;
    f->id = id;
    m.running.emplace(id, std::move(f));
    m.Enqueue(ns, id);
  }
  m.wake.notify_one();
  return id;
}

void StoreChain::Impl::Enqueue(const Namespace& ns, uint64_t id) {
  for (Lane& l : lanes) {
    if (l.ns == ns) {
      l.ids.push_back(id);
      return;
    }
  }
  lanes.push_back(Lane{ns, {id}});
}

std::optional<FetchResult> StoreChain::TakeFetch(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->done.find(id);
  if (it == impl_->done.end()) return std::nullopt;
  FetchResult r = std::move(it->second);
  impl_->done.erase(it);
  return r;
}

FetchResult StoreChain::TakeReady(uint64_t id, bool* finished) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (auto it = m.done.find(id); it != m.done.end()) {
    FetchResult r = std::move(it->second);
    m.done.erase(it);
    *finished = true;
    return r;
  }
  auto it = m.running.find(id);
  *finished = it == m.running.end() || it->second->cancelled;
  if (*finished) return FetchResult{};
  FetchResult r = m.TakeReadyOf(*it->second);
  r.status = Status::Ok();  // Said when it is finished.
  return r;
}

FetchResult StoreChain::Impl::TakeReadyOf(Fetch& f) {
  FetchResult r = std::move(f.ready);
  f.ready = FetchResult{};
  f.ready.status = r.status;
  // Payloads point into the records, whose buffers no longer move.
  const size_t at = kRecordHeaderBytes + f.request.block_tokens * sizeof(TokenId);
  for (const StoreValue& rec : r.records) {
    // The payload's own size, not the rest of the record: a signed record ends with its key id and MAC.
    r.payloads.emplace_back(reinterpret_cast<const std::byte*>(rec.data()) + at, f.request.payload_bytes);
  }
  r.took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - f.started);
  return r;
}

void StoreChain::CancelFetch(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->done.erase(id) != 0) return;
  // Forgotten at its next turn (or as its turn ends).
  if (auto it = impl_->running.find(id); it != impl_->running.end()) it->second->cancelled = true;
}

std::vector<StoreStats> StoreChain::stats() const {
  std::vector<StoreStats> out;
  for (const auto& s : impl_->members) {
    const Counters& c = s->counters;
    StoreStats st;
    st.kind = std::string(s->chained.store->kind());
    st.description = s->chained.store->Describe();
    st.write_through = s->chained.write_through;
    st.hit_blocks = c.hit_blocks.load();
    st.miss_blocks = c.miss_blocks.load();
    st.fetched_bytes = c.fetched_bytes.load();
    st.fetches = c.fetches.load();
    st.fetch_us = c.fetch_us.load();
    st.put_blocks = c.put_blocks.load();
    st.put_bytes = c.put_bytes.load();
    st.puts = c.puts.load();
    st.put_us = c.put_us.load();
    st.put_dropped = c.put_dropped.load();
    st.errors = c.errors.load();
    st.corrupt = c.corrupt.load();
    st.foreign = c.foreign.load();
    st.forged = c.forged.load();
    st.queued_bytes = c.queued_bytes.load();
    st.counters = s->chained.store->Counters();
    out.push_back(std::move(st));
  }
  return out;
}

void StoreChain::Impl::Run() {
  // The store thread yields the CPU to the event loop: its work (reading,
  // checking and copying megabytes of records) is throughput, while every
  // request the loop answers meanwhile is latency. A tenant refetching a long
  // prefix in a loop kept this thread busy on a 2-core host and took the loop's
  // core from other tenants' requests (flood_bench's store_hog).
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), ::getpriority(PRIO_PROCESS, 0) + kIoNice);
  (void)::pthread_setname_np(::pthread_self(), "kvtier-stores");
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    wake.wait(lock, [&] {
      if (stopping || !lanes.empty()) return true;
      for (const auto& s : members) {
        if (!s->queue.empty()) return true;
      }
      return false;
    });
    if (stopping) break;
    if (!lanes.empty()) {
      Lane lane = std::move(lanes.front());
      lanes.pop_front();
      const uint64_t id = lane.ids.front();
      lane.ids.pop_front();
      const Namespace ns = lane.ns;
      if (!lane.ids.empty()) lanes.push_back(std::move(lane));
      Fetch& f = *running.at(id);
      if (f.cancelled) {
        running.erase(id);
        continue;
      }
      lock.unlock();
      Turn turn = f.request.locate ? LocateTurn(f) : FetchTurn(f);
      lock.lock();
      if (f.cancelled) {
        running.erase(id);
        continue;
      }
      for (StoreValue& v : turn.records) f.ready.records.push_back(std::move(v));
      f.ready.store.insert(f.ready.store.end(), turn.store.begin(), turn.store.end());
      if (f.ready.status.ok()) f.ready.status = turn.status;
      if (!turn.finished) {
        Enqueue(ns, id);
        continue;
      }
      FetchResult result = TakeReadyOf(f);
      running.erase(id);
      done.emplace(id, std::move(result));
      lock.unlock();
      if (notify) notify();
      lock.lock();
      continue;
    }
    PutOneBatch(lock);
  }
  // Stopping: what is queued is written while the drain time lasts.
  const auto until = Clock::now() + drain;
  while (Clock::now() < until && PutOneBatch(lock)) {
  }
}

bool StoreChain::Impl::PutOneBatch(std::unique_lock<std::mutex>& lock) {
  for (size_t si = 0; si < members.size(); ++si) {
    Member* s = members[si].get();
    if (s->queue.empty()) continue;
    std::vector<StoreItem> batch;
    std::vector<bool> reported;
    uint64_t bytes = 0;
    while (!s->queue.empty() && batch.size() < options.max_put_batch) {
      bytes += s->queue.front().item.value.size();
      batch.push_back(std::move(s->queue.front().item));
      reported.push_back(s->queue.front().reported);
      s->queue.pop_front();
    }
    lock.unlock();
    if (options.record_key != nullptr) {
      for (StoreItem& item : batch) SignBlockRecord(*options.record_key, &item.value);
    }
    const auto t = Clock::now();
    const Status st = s->chained.store->Put(batch);
    Counters& c = s->counters;
    c.put_us.fetch_add(MicrosSince(t), std::memory_order_relaxed);
    c.puts.fetch_add(1, std::memory_order_relaxed);
    if (st.ok()) {
      c.put_blocks.fetch_add(batch.size(), std::memory_order_relaxed);
      c.put_bytes.fetch_add(bytes, std::memory_order_relaxed);
    } else {
      c.errors.fetch_add(1, std::memory_order_relaxed);
    }
    if (collecting()) {
      // What it wrote, then what it evicted meanwhile (a record of this batch among them, possibly).
      for (size_t i = 0; st.ok() && i < batch.size(); ++i) {
        if (!reported[i]) continue;
        StoreEvent e;
        e.store = static_cast<uint8_t>(si);
        BlockRecordHeader h;
        if (!ReadOwnBlockRecord(batch[i].value, &h, &e.tokens)) continue;
        e.key = h.key;
        e.parent = h.parent;
        Report(std::move(e));
      }
      ReportEvicted();
    }
    c.queued_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    queued_total.fetch_sub(bytes, std::memory_order_relaxed);
    lock.lock();
    room.notify_all();
    return true;
  }
  return false;
}

StoreChain::Impl::Turn StoreChain::Impl::FetchTurn(Fetch& f) {
  Turn out;
  const FetchRequest& r = f.request;
  const size_t n = r.keys.size();
  if (f.names.empty()) {  // Its first turn.
    if (r.tokens.size() != n * r.block_tokens) {
      out.status =
          InvalidArgument("fetch: " + std::to_string(n) + " keys and " + std::to_string(r.tokens.size()) + " tokens");
      out.finished = true;
      return out;
    }
    f.names = StoreKeys(r);
    f.chunk_blocks =
        std::max<uint64_t>(1, options.fetch_chunk_bytes / BlockRecordBytes(r.block_tokens, r.payload_bytes));
  }
  if (f.have >= n || f.si >= members.size()) {
    out.finished = true;
    return out;
  }
  Member& s = *members[f.si];
  Counters& c = s.counters;
  if (!f.in_store) {
    f.in_store = true;
    f.store_from = f.have;
    f.store_served = 0;
    c.fetches.fetch_add(1, std::memory_order_relaxed);
  }
  const auto t = Clock::now();
  const size_t asked = std::min(f.chunk_blocks, n - f.have);
  const std::span<const std::string> want = std::span<const std::string>(f.names).subspan(f.have, asked);
  auto present = s.chained.store->Present(want);
  size_t served = 0;
  bool answered = present.ok();  // Present and Get both answered: what it did not serve, it lacks.
  if (!present.ok()) {
    c.errors.fetch_add(1, std::memory_order_relaxed);
    out.status = present.status();
  } else if (*present > 0) {
    // The bound is a signed record's size: an unsigned one is shorter, and VerifyBlockRecord checks the size.
    auto values = s.chained.store->Get(want.first(std::min(*present, asked)),
                                       BlockRecordBytes(r.block_tokens, r.payload_bytes, /*signed_record=*/true));
    if (!values.ok()) {
      answered = false;
      c.errors.fetch_add(1, std::memory_order_relaxed);
      out.status = values.status();
    } else {
      for (auto& v : *values) {
        if (!v) break;
        const size_t i = f.have + served;
        RecordExpectation e;
        e.profile_fingerprint = r.profile_fingerprint;
        e.key_ns = r.key_ns;
        e.key = r.keys[i];
        e.parent = i == 0 ? r.parent : r.keys[i - 1];
        e.tokens = std::span<const TokenId>(r.tokens).subspan(i * r.block_tokens, r.block_tokens);
        e.payload_bytes = r.payload_bytes;
        e.record_key = options.record_key.get();
        const RecordCheck check = VerifyBlockRecord(v->view(), e);
        if (!check.ok()) {
          (check.fault == RecordFault::kCorrupt  ? c.corrupt
           : check.fault == RecordFault::kForged ? c.forged
                                                 : c.foreign)
              .fetch_add(1, std::memory_order_relaxed);
          break;
        }
        c.fetched_bytes.fetch_add(v->size(), std::memory_order_relaxed);
        out.records.push_back(std::move(*v));
        out.store.push_back(static_cast<uint8_t>(f.si));
        ++served;
      }
    }
  }
  c.hit_blocks.fetch_add(served, std::memory_order_relaxed);
  c.fetch_us.fetch_add(MicrosSince(t), std::memory_order_relaxed);
  f.have += served;
  f.store_served += served;
  if (collecting()) ReportEvicted();
  if (served == asked && f.have < n) return out;  // This store goes on at the fetch's next turn.
  // Done with this store: it lacks block `have` (or served them all); the next store continues from there.
  c.miss_blocks.fetch_add(n - f.store_from - f.store_served, std::memory_order_relaxed);
  if (collecting() && answered) ReportGone(f.si, std::span<const BlockKey>(r.keys).subspan(f.store_from), f.store_served);
  ++f.si;
  f.in_store = false;
  out.finished = f.have >= n || f.si >= members.size();
  return out;
}

std::vector<std::string> StoreChain::Impl::StoreKeys(const FetchRequest& r) const {
  std::vector<std::string> names;
  names.reserve(r.keys.size());
  for (const BlockKey& k : r.keys) names.push_back(StoreKey(options.key_prefix, r.profile_fingerprint, k));
  return names;
}

StoreChain::Impl::Turn StoreChain::Impl::LocateTurn(Fetch& f) {
  Turn out;
  const FetchRequest& r = f.request;
  const std::vector<std::string> names = StoreKeys(r);
  size_t have = 0;  // Blocks placed so far, from the first: each store continues where the last stopped, as a fetch.
  for (size_t si = 0; si < members.size() && have < names.size(); ++si) {
    auto present = members[si]->chained.store->Present(std::span<const std::string>(names).subspan(have));
    if (!present.ok()) {
      members[si]->counters.errors.fetch_add(1, std::memory_order_relaxed);
      if (out.status.ok()) out.status = present.status();
      continue;
    }
    const size_t held = std::min(*present, names.size() - have);
    ReportGone(si, std::span<const BlockKey>(r.keys).subspan(have), held);
    out.store.insert(out.store.end(), held, static_cast<uint8_t>(si));
    have += held;
  }
  out.finished = true;
  return out;
}

}  // namespace kvtier::stores
