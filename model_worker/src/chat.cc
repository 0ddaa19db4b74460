#include "chat.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

namespace kvtier::model {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of every thread of this process, in milliseconds.
double ProcessCpuMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// Copies `rows` token rows between a block plane and rows [row0, row0+rows) of a
// KV tensor. Both are [tokens][kv_heads][head_dim] row-major, so it is one
// contiguous copy. `to_block` picks the direction. `plane_on_device`: the plane
// is GPU memory (a cuda pool's GPU tier); otherwise it is host memory (the host
// backend's pools, or a cuda backend's pinned host tier), whatever device the
// model runs on.
void CopyRows(std::byte* plane, bool plane_on_device, const at::Tensor& kv, int64_t row0, int64_t rows,
              bool to_block) {
  const size_t row_bytes = static_cast<size_t>(kv.stride(0)) * kv.element_size();
  auto* rowp = static_cast<std::byte*>(kv.data_ptr()) + static_cast<size_t>(row0) * row_bytes;
  if (kv.is_cpu() && !plane_on_device) {
    if (to_block) {
      std::memcpy(plane, rowp, static_cast<size_t>(rows) * row_bytes);
    } else {
      std::memcpy(rowp, plane, static_cast<size_t>(rows) * row_bytes);
    }
    return;
  }
  // A CUDA model or pool: ATen issues the copy (device to device for a GPU-tier
  // block, host to device for a host-tier one).
  const at::TensorOptions where = plane_on_device ? kv.options() : kv.options().device(at::kCPU);
  at::Tensor block = at::from_blob(plane, {rows, kv.size(1), kv.size(2)}, where);
  if (to_block) {
    block.copy_(kv.narrow(0, row0, rows));
  } else {
    kv.narrow(0, row0, rows).copy_(block);
  }
}

TokenId Argmax(const at::Tensor& logits) { return static_cast<TokenId>(logits.argmax().item<int64_t>()); }

}  // namespace

const char* CacheModeName(CacheMode mode) {
  switch (mode) {
    case CacheMode::kNone: return "none";
    case CacheMode::kLocal: return "local";
    case CacheMode::kKvtier: return "kvtier";
  }
  return "?";
}

Result<CacheMode> ParseCacheMode(std::string_view name) {
  if (name == "none") return CacheMode::kNone;
  if (name == "local") return CacheMode::kLocal;
  if (name == "kvtier") return CacheMode::kKvtier;
  return InvalidArgument("unknown cache mode '" + std::string(name) + "' (kvtier, local or none)");
}

ChatRunner::ChatRunner(const Transformer& model, const ChatOptions& options, uint32_t block_tokens)
    : model_(model), options_(options), block_tokens_(block_tokens),
      profile_(model.config().Profile(block_tokens)) {}

Result<std::unique_ptr<ChatRunner>> ChatRunner::Create(const Transformer& model, const ChatOptions& options) {
  uint32_t bt = options.block_tokens;
  if (options.mode == CacheMode::kKvtier) {
    if (options.client == nullptr) return InvalidArgument("the kvtier cache mode needs a connected client");
    const ModelProfile daemon = options.client->profile();
    const ModelProfile mine = model.config().Profile(daemon.block_tokens);
    if (daemon.Fingerprint() != mine.Fingerprint()) {
      return InvalidArgument("the daemon's profile (" + daemon.Describe() + ") does not fit this model's KV (" +
                             mine.Describe() + "); configure a matching profile in kvtierd");
    }
    bt = daemon.block_tokens;
    // Blocks are read in place: a GPU pool needs the model on the GPU too.
    if (options.client->backend() == "cuda" && !model.options().device().is_cuda()) {
      return FailedPrecondition("kvtierd keeps blocks in GPU memory (backend cuda), but this worker's model runs "
                                "on the CPU; build the worker against a CUDA libtorch");
    }
  }
  if (bt == 0) return InvalidArgument("block_tokens must be positive");
  return std::unique_ptr<ChatRunner>(new ChatRunner(model, options, bt));
}

Result<Lease> ChatRunner::LoadKvtier(const std::string& session, std::span<const TokenId> prompt, KvBuffer& kv,
                                     std::vector<BlockKey>& keys, uint32_t& matched_blocks, TurnResult& r) {
  Client& c = *options_.client;
  keys = c.Keys(prompt);
  const std::span<const TokenId> full = prompt.first(keys.size() * block_tokens_);
  // Nothing cached (the shared index says so without a round trip): skip the
  // Acquire. The commit after decoding starts the session's chain at block 0.
  // A probe racing a writer can miss a block Acquire would find; that costs a
  // recomputation, never a wrong byte. With stores below the host tier the
  // index does not know all kvtierd can find: the Acquire is made.
  if (keys.empty() ||
      (!c.StoresBelow() && c.ProbeKeys(std::span<const BlockKey>(keys).first(1), full.first(block_tokens_)) == 0)) {
    matched_blocks = 0;
    kv.length = 0;
    return Lease{};
  }
  r.acquired = true;
  auto t = Clock::now();
  const bool cuda_pool = c.backend() == "cuda";
  const Promote promote =
      options_.promote.value_or(cuda_pool && model_.options().device().is_cuda() ? Promote::kNow : Promote::kAfterRead);
  auto lease = c.AcquireKeys(session, keys, full, promote);
  r.acquire_ms = MsSince(t);
  if (!lease.ok()) return lease.status();
  if (promote == Promote::kAfterRead) {
    for (const BlockRef& b : lease->blocks()) r.promoted_blocks += b.tier == Tier::kHost ? 1 : 0;
  }
  if (lease->promoted() > 0) {
    t = Clock::now();
    if (Status s = lease->Wait(std::chrono::seconds(10)); !s.ok()) return s;
    r.wait_ms = MsSince(t);
  }
  t = Clock::now();
  matched_blocks = static_cast<uint32_t>(lease->size());
  r.promoted_blocks += lease->promoted();
  // At least one prompt token is computed: its logits start the reply. The
  // prefix's rows are copied out of the mapped pool into the turn's contiguous
  // K/V buffer (attention reads one buffer, not 128 scattered blocks): one
  // memcpy per plane and block, about 2 ms for 2k tokens of the default model
  // on a CPU; on a cuda pool a device-to-device copy.
  const int64_t reuse = std::min<int64_t>(int64_t{matched_blocks} * block_tokens_, int64_t(prompt.size()) - 1);
  for (int64_t b = 0; b * block_tokens_ < reuse; ++b) {
    const int64_t row0 = b * block_tokens_;
    const int64_t rows = std::min<int64_t>(block_tokens_, reuse - row0);
    const BlockRef& ref = lease->block(static_cast<size_t>(b));
    const bool on_device = cuda_pool && ref.tier == Tier::kGpu;
    for (uint32_t l = 0; l < profile_.layers; ++l) {
      CopyRows(ref.data + profile_.PlaneOffset(l, 0), on_device, kv.k[l], row0, rows, /*to_block=*/false);
      CopyRows(ref.data + profile_.PlaneOffset(l, 1), on_device, kv.v[l], row0, rows, /*to_block=*/false);
    }
  }
  kv.length = reuse;
  r.gather_ms = MsSince(t);
  return std::move(*lease);
}

void ChatRunner::CommitKvtier(const std::string& session, std::span<const TokenId> tokens, const KvBuffer& kv,
                              const std::vector<BlockKey>& keys, uint32_t matched_blocks, TurnResult& r) {
  Client& c = *options_.client;
  const auto t0 = Clock::now();
  const uint32_t full = static_cast<uint32_t>(kv.length / block_tokens_);
  if (full <= matched_blocks) return;
  const uint32_t fresh = full - matched_blocks;
  const bool cuda_pool = c.backend() == "cuda";
  auto w = c.Allocate(fresh);
  if (!w.ok()) {
    r.cache_error = "allocate: " + w.status().ToString();
    return;
  }
  for (uint32_t i = 0; i < fresh; ++i) {
    const int64_t row0 = int64_t{matched_blocks + i} * block_tokens_;
    for (uint32_t l = 0; l < profile_.layers; ++l) {
      // Write slots are always in the GPU tier.
      CopyRows(w->data(i) + profile_.PlaneOffset(l, 0), cuda_pool, kv.k[l], row0, block_tokens_, /*to_block=*/true);
      CopyRows(w->data(i) + profile_.PlaneOffset(l, 1), cuda_pool, kv.v[l], row0, block_tokens_, /*to_block=*/true);
    }
  }
  const BlockKey parent = matched_blocks > 0 ? keys[matched_blocks - 1] : BlockKey{};
  auto committed = c.Commit(*w, session, parent, matched_blocks,
                            tokens.subspan(size_t{matched_blocks} * block_tokens_, size_t{fresh} * block_tokens_));
  if (committed.ok()) {
    r.committed_blocks = committed->stored;
    r.duplicate_blocks = committed->duplicates;
  } else {
    r.cache_error = "commit: " + committed.status().ToString();
  }
  r.commit_ms = MsSince(t0);
}

Result<TurnResult> ChatRunner::Turn(const std::string& session, std::span<const TokenId> prompt,
                                    uint32_t max_new_tokens) {
  if (prompt.empty()) return InvalidArgument("empty prompt");
  if (max_new_tokens == 0) return InvalidArgument("max_new_tokens must be at least 1");
  const auto t0 = Clock::now();
  const double cpu0 = ProcessCpuMs();
  TurnResult r;
  r.prompt_tokens = static_cast<uint32_t>(prompt.size());
  const int64_t rows = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  const ModelConfig& mc = model_.config();

  KvBuffer* kv = &scratch_;
  scratch_.length = 0;
  std::vector<BlockKey> keys;
  uint32_t matched_blocks = 0;
  Lease lease;
  switch (options_.mode) {
    case CacheMode::kNone:
      scratch_.Reserve(mc, rows, model_.options());
      break;
    case CacheMode::kLocal: {
      LocalEntry& e = local_[session];
      size_t common = 0;
      while (common < e.tokens.size() && common < prompt.size() && e.tokens[common] == prompt[common]) ++common;
      if (!options_.local_token_granular) common -= common % block_tokens_;
      common = std::min(common, prompt.size() - 1);
      e.kv.length = static_cast<int64_t>(common);
      e.kv.Reserve(mc, rows, model_.options());
      kv = &e.kv;
      break;
    }
    case CacheMode::kKvtier: {
      scratch_.Reserve(mc, rows, model_.options());
      auto held = LoadKvtier(session, prompt, scratch_, keys, matched_blocks, r);
      if (held.ok()) {
        lease = std::move(*held);
      } else {
        // The cache is an optimization: a failed lookup costs a full prefill, not the turn.
        r.cache_error = "acquire: " + held.status().ToString();
        scratch_.length = 0;
        keys = options_.client->Keys(prompt);
        matched_blocks = 0;
      }
      break;
    }
  }
  r.lookup_ms = MsSince(t0);
  r.cached_tokens = static_cast<uint32_t>(kv->length);
  r.computed_tokens = r.prompt_tokens - r.cached_tokens;

  std::vector<TokenId> tokens(prompt.begin(), prompt.end());
  at::Tensor logits = model_.Forward(std::span<const TokenId>(tokens).subspan(static_cast<size_t>(kv->length)), *kv);
  TokenId next = Argmax(logits);
  r.ttft_ms = MsSince(t0);
  r.ttft_cpu_ms = ProcessCpuMs() - cpu0;
  // The prefix's K/V were copied out: let the daemon move those blocks again.
  (void)lease.Release();
  for (uint32_t step = 0;; ++step) {
    if (options_.keep_logits) r.logits.push_back(logits);
    r.output.push_back(next);
    tokens.push_back(next);
    if (step + 1 == max_new_tokens) break;
    logits = model_.Forward(std::span<const TokenId>(&next, 1), *kv);
    next = Argmax(logits);
  }
  tokens.pop_back();  // The last output token has no K/V yet.

  if (options_.mode == CacheMode::kLocal) {
    local_[session].tokens = std::move(tokens);
  } else if (options_.mode == CacheMode::kKvtier) {
    CommitKvtier(session, tokens, *kv, keys, matched_blocks, r);
  }
  r.turn_ms = MsSince(t0);
  r.turn_cpu_ms = ProcessCpuMs() - cpu0;
  return r;
}

}  // namespace kvtier::model
