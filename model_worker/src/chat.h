// ChatRunner: serves one conversation turn at a time with a Transformer and one
// of three caches, so the same binary can compare them:
//
//   kNone    recompute the whole conversation every turn;
//   kLocal   an in-process cache of each session's keys/values, as a single-process
//            server keeps it (block-granular by default, like a paged prefix cache);
//   kKvtier  kvtierd: probe the shared index, acquire the cached prefix (lease +
//            fence) when the probe found any, copy its blocks' rows into the turn's
//            K/V buffer (one copy per plane and block), prefill only the rest, and
//            commit the new full blocks under the session id after decoding.
//
// Only full blocks are shared; a partial tail block is recomputed next turn.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "transformer.h"

namespace kvtier::model {

enum class CacheMode { kNone, kLocal, kKvtier };
const char* CacheModeName(CacheMode mode);
Result<CacheMode> ParseCacheMode(std::string_view name);

struct ChatOptions {
  CacheMode mode = CacheMode::kKvtier;
  kvtier::Client* client = nullptr;  // Required for kKvtier; its profile must match the model.
  uint32_t block_tokens = 16;        // kLocal/kNone granularity; kKvtier uses the daemon's.
  bool local_token_granular = false;  // kLocal reuses every cached token, not just full blocks.
  bool keep_logits = false;          // TurnResult::logits holds every step's logits.
  // kKvtier: what Acquire does with host-tier hits. Default: kNow where the
  // model and the GPU tier are both on the GPU (the prefix is then copied
  // device to device), else kAfterRead (this worker copies the prefix out of
  // the pool into its CPU buffer anyway: from the host tier directly, with
  // no wait, and kvtierd promotes the blocks once the turn has read them).
  std::optional<Promote> promote{};
};

struct TurnResult {
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;    // Prompt tokens whose K/V came from the cache.
  uint32_t computed_tokens = 0;  // Prompt tokens prefilled (prompt - cached).
  uint32_t promoted_blocks = 0;  // Host-tier hits sent to the GPU tier (kKvtier): before this turn read them
                                 // (Promote::kNow), or after (kAfterRead).
  uint32_t committed_blocks = 0;  // New blocks stored by this turn's commit (kKvtier).
  uint32_t duplicate_blocks = 0;  // Committed blocks that were cached already (kKvtier).
  std::vector<TokenId> output;   // Greedy tokens.
  std::vector<at::Tensor> logits;  // [vocab] fp32 per output token, if keep_logits.
  bool acquired = false;  // kKvtier: an Acquire round trip was made (not when the
                          // shared-memory probe found nothing cached).
  double lookup_ms = 0;  // Cache lookup: acquire + fence wait + gather (kKvtier), or local.
  double acquire_ms = 0;  // kKvtier: the Acquire round trip (a wait for GPU room included).
  double wait_ms = 0;     // kKvtier: waiting for promoted blocks to land.
  double gather_ms = 0;   // kKvtier: copying the prefix's rows into the turn's K/V buffer.
  double ttft_ms = 0;    // Start of the turn to the first output token.
  double turn_ms = 0;    // Whole turn, decode and commit included.
  double commit_ms = 0;
  // CPU time of the whole process (every thread: the model's and BLAS's) over
  // the same spans, so a faster wall time bought with more cores shows.
  double ttft_cpu_ms = 0;
  double turn_cpu_ms = 0;
  std::string cache_error;  // A cache failure the turn survived (it recomputed instead).
};

class ChatRunner {
 public:
  // Fails if kKvtier has no client or the daemon's profile does not fit the model.
  static Result<std::unique_ptr<ChatRunner>> Create(const Transformer& model, const ChatOptions& options);

  // Prefills `prompt` (the whole conversation so far) for `session`, then decodes
  // `max_new_tokens` greedy tokens. REQUIRES: !prompt.empty(), max_new_tokens >= 1.
  Result<TurnResult> Turn(const std::string& session, std::span<const TokenId> prompt, uint32_t max_new_tokens);

  uint32_t block_tokens() const { return block_tokens_; }
  const ChatOptions& options() const { return options_; }

 private:
  ChatRunner(const Transformer& model, const ChatOptions& options, uint32_t block_tokens);
  // Loads the cached prefix of `prompt` into `kv` (kv.length = tokens reused).
  // The lease is returned so the caller can end it off the critical path.
  Result<Lease> LoadKvtier(const std::string& session, std::span<const TokenId> prompt, KvBuffer& kv,
                           std::vector<BlockKey>& keys, uint32_t& matched_blocks, TurnResult& r);
  // Stores the full blocks of `tokens` past `matched_blocks` (their K/V are in `kv`).
  void CommitKvtier(const std::string& session, std::span<const TokenId> tokens, const KvBuffer& kv,
                    const std::vector<BlockKey>& keys, uint32_t matched_blocks, TurnResult& r);

  struct LocalEntry {
    std::vector<TokenId> tokens;  // Tokens whose K/V are in kv.
    KvBuffer kv;
  };

  const Transformer& model_;
  ChatOptions options_;
  uint32_t block_tokens_;
  ModelProfile profile_;
  std::map<std::string, LocalEntry> local_;
  // kNone and kKvtier build each turn's K/V here; kept across turns so a turn
  // does not pay for fresh pages (tens of MB at 2k tokens).
  KvBuffer scratch_;
};

}  // namespace kvtier::model
