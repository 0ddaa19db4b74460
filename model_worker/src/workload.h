// The chat workload the worker serves and the end-to-end benchmark measures:
// S sessions x T turns, a system prompt every session shares, a long first
// message, then short follow-ups; each reply is appended to the history.
// Deterministic from its seed, so every worker process (and every cache mode)
// sees the same conversations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier::model {

struct WorkloadOptions {
  uint32_t sessions = 4;         // In total, across all workers.
  uint32_t turns = 4;
  uint32_t workers = 1;          // Session s is served by worker s % workers.
  uint32_t worker_index = 0;
  uint32_t system_tokens = 256;  // Shared by every session (0: none).
  uint32_t first_tokens = 512;   // The first user message (a document to discuss).
  uint32_t user_tokens = 48;     // Each later user message.
  uint32_t output_tokens = 16;   // Reply length.
  bool unique = false;           // No shared system prompt; every token random (zero reuse).
  uint64_t seed = 1;
  std::string session_prefix = "chat-";  // Session ids are prefix + index.
};

// Text of `n` bytes of plausible words, deterministic in `seed`.
std::string WorkloadText(uint64_t seed, size_t n);

class Conversation {
 public:
  Conversation(const WorkloadOptions& options, uint32_t session);
  const std::string& id() const { return id_; }
  // Appends the next user message; returns the prompt (the whole history).
  const std::vector<TokenId>& NextPrompt(uint32_t turn);
  // Appends the model's reply and an end-of-turn token.
  void AddReply(const std::vector<TokenId>& reply);
  const std::vector<TokenId>& history() const { return history_; }

 private:
  WorkloadOptions options_;
  uint32_t session_;
  std::string id_;
  std::vector<TokenId> history_;
};

// The sessions worker `options.worker_index` serves, in arrival order within a turn.
std::vector<uint32_t> WorkerSessions(const WorkloadOptions& options);

}  // namespace kvtier::model
