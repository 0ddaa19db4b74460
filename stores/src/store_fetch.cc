// StoreChain's reads (store_chain.h, "Reads"): fetches queued, taken and
// cancelled on the engine thread; on the I/O thread, each fetch's turns
// (FetchTurns says whose), one chunk from one store each, every record
// verified before it is kept.
#include <algorithm>
#include <string>

#include "store_chain_impl.h"

namespace kvtier::stores {

using chain_detail::Clock;
using chain_detail::Counters;
using chain_detail::MicrosSince;

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
    m.turns.Add(ns, id);
  }
  m.wake.notify_one();
  return id;
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

void StoreChain::Impl::TakeTurn(std::unique_lock<std::mutex>& lock) {
  const FetchTurns::Turn next = turns.Take();
  Fetch& f = *running.at(next.id);
  if (f.cancelled) {
    running.erase(next.id);
    return;
  }
  lock.unlock();
  Turn turn = f.request.locate ? LocateTurn(f) : FetchTurn(f);
  lock.lock();
  if (f.cancelled) {
    running.erase(next.id);
    return;
  }
  for (StoreValue& v : turn.records) f.ready.records.push_back(std::move(v));
  f.ready.store.insert(f.ready.store.end(), turn.store.begin(), turn.store.end());
  if (f.ready.status.ok()) f.ready.status = turn.status;
  if (!turn.finished) {
    turns.Add(next.ns, next.id);
    return;
  }
  FetchResult result = TakeReadyOf(f);
  running.erase(next.id);
  done.emplace(next.id, std::move(result));
  lock.unlock();
  if (notify) notify();
  lock.lock();
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
