// StoreChain: the stores below the host tier and their I/O thread
// (store_chain.h): the chain, the writes, the block events and the thread's
// loop. The reads are in store_fetch.cc.
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include "store_chain_impl.h"

namespace kvtier::stores {

using chain_detail::Clock;
using chain_detail::Counters;
using chain_detail::kIoNice;
using chain_detail::MicrosSince;

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
      if (stopping || !turns.empty()) return true;
      for (const auto& s : members) {
        if (!s->queue.empty()) return true;
      }
      return false;
    });
    if (stopping) break;
    if (!turns.empty()) {
      TakeTurn(lock);
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

}  // namespace kvtier::stores
