#include "workload.h"

#include <string_view>

#include "tokenizer.h"

namespace kvtier::model {
namespace {

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::string_view kWords[] = {
    "the", "cache", "keeps", "keys", "and", "values", "of", "every", "block", "so", "a", "turn",
    "only", "computes", "what", "is", "new", "model", "worker", "reads", "from", "shared", "memory",
    "session", "prefix", "tokens", "history", "when", "GPU", "tier", "fills", "cold", "blocks",
    "move", "to", "host", "over", "PCIe", "then", "back", "again", "please", "explain", "why",
    "attention", "layer", "head", "query", "answer", "question", "about", "this", "document",
};

constexpr std::string_view kSystem =
    "You are a careful assistant. Answer the user's questions about the documents they share, "
    "cite the passage you rely on, say so when the text does not contain the answer, and keep "
    "every reply short. ";

}  // namespace

std::string WorkloadText(uint64_t seed, size_t n) {
  std::string out;
  uint64_t s = seed;
  while (out.size() < n) {
    out += kWords[SplitMix(s) % std::size(kWords)];
    out += SplitMix(s) % 9 == 0 ? ". " : " ";
  }
  out.resize(n);
  return out;
}

Conversation::Conversation(const WorkloadOptions& options, uint32_t session)
    : options_(options), session_(session), id_(options.session_prefix + std::to_string(session)) {}

const std::vector<TokenId>& Conversation::NextPrompt(uint32_t turn) {
  const uint64_t seed = options_.seed * 1000003 + uint64_t{session_} * 7919 + turn;
  const uint32_t n = turn == 0 ? options_.first_tokens : options_.user_tokens;
  if (options_.unique) {
    uint64_t s = seed ^ 0x5bd1e995;
    for (uint32_t i = 0; i < n; ++i) history_.push_back(static_cast<TokenId>(SplitMix(s) % 256));
    return history_;
  }
  if (turn == 0) {
    history_.push_back(kBos);
    std::string system;
    while (system.size() < options_.system_tokens) system += kSystem;
    system.resize(options_.system_tokens);
    for (TokenId t : Encode(system)) history_.push_back(t);
  }
  for (TokenId t : Encode(WorkloadText(seed, n))) history_.push_back(t);
  history_.push_back(kEndTurn);
  return history_;
}

void Conversation::AddReply(const std::vector<TokenId>& reply) {
  history_.insert(history_.end(), reply.begin(), reply.end());
  history_.push_back(kEndTurn);
}

std::vector<uint32_t> WorkerSessions(const WorkloadOptions& o) {
  std::vector<uint32_t> out;
  for (uint32_t s = o.worker_index; s < o.sessions; s += o.workers) out.push_back(s);
  return out;
}

}  // namespace kvtier::model
