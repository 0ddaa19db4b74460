// kvtier-chat-demo: a stand-in model worker that serves multi-turn chats through
// kvtierd. Each turn re-sends the whole conversation; the worker acquires the
// cached prefix, "prefills" only the new blocks (it writes synthetic KV where a
// real worker would run the model), commits them, and reports what it reused.
//
//   kvtier-chat-demo --socket PATH [--name W] [--sessions N] [--turns N] [--seed S]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvtier/client.h"

using namespace kvtier;

namespace {

// Synthetic KV for a block: a function of its key, so any reader can check it.
void WriteKv(const BlockKey& key, std::byte* dst, size_t bytes) {
  uint64_t s = key.lo ^ (key.hi * 0x9e3779b97f4a7c15ULL);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    std::memcpy(dst + i, &s, 8);
  }
}

bool KvIntact(const BlockKey& key, const std::byte* src, size_t bytes) {
  uint64_t s = key.lo ^ (key.hi * 0x9e3779b97f4a7c15ULL);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    if (std::memcmp(src + i, &s, 8) != 0) return false;
  }
  return true;
}

int Usage(int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: kvtier-chat-demo --socket PATH [--name NAME] [--sessions N] [--turns N] [--seed S]\n"
               "       kvtier-chat-demo --socket PATH --report\n"
               "Serves N chat sessions for N turns each through kvtierd, reusing cached prefixes.\n"
               "--report prints the daemon's sessions and statistics instead; --verbose prints\n"
               "every turn (default: the turns of the first session).\n");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  ClientOptions o;
  o.client_name = "chat-demo";
  int sessions = 3, turns = 4;
  uint64_t seed = 1;
  bool report = false;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") return Usage(0);
    if (a == "--socket" && (v = next())) o.socket_path = v;
    else if (a == "--name" && (v = next())) o.client_name = v;
    else if (a == "--sessions" && (v = next())) sessions = std::atoi(v);
    else if (a == "--turns" && (v = next())) turns = std::atoi(v);
    else if (a == "--seed" && (v = next())) seed = std::strtoull(v, nullptr, 10);
    else if (a == "--report") report = true;
    else if (a == "--verbose") verbose = true;
    else return Usage(2);
  }
  auto connected = Client::Connect(o);
  if (!connected.ok()) {
    std::fprintf(stderr, "%s: %s\n", o.client_name.c_str(), connected.status().ToString().c_str());
    return 1;
  }
  Client& c = **connected;
  const uint32_t bt = c.block_tokens();
  if (report) {
    auto list = c.ListSessions();
    auto stats = c.Stats();
    if (!list.ok() || !stats.ok()) {
      std::fprintf(stderr, "report: %s\n", (list.ok() ? stats.status() : list.status()).ToString().c_str());
      return 1;
    }
    std::printf("%-22s %7s %5s %5s %8s\n", "session", "blocks", "gpu", "host", "tokens");
    for (const auto& s : *list) {
      std::printf("%-22s %7u %5u %5u %8llu\n", s.id.c_str(), s.blocks, s.gpu_blocks, s.host_blocks,
                  (unsigned long long)s.tokens);
    }
    for (const auto& [name, value] : *stats) std::printf("  %-20s %.0f\n", name.c_str(), value);
    return 0;
  }
  std::printf("[%s] connected: backend %s, %s\n", o.client_name.c_str(), c.backend().c_str(),
              c.profile().Describe().c_str());

  // Every conversation starts with the same system prompt (shared across workers).
  std::vector<TokenId> system(8 * bt);
  for (size_t i = 0; i < system.size(); ++i) system[i] = static_cast<TokenId>(100 + i);
  std::vector<std::vector<TokenId>> history(sessions, system);
  std::mt19937_64 rng(seed);
  uint64_t prompt_tokens = 0, reused_tokens = 0, computed_tokens = 0;
  for (int turn = 0; turn < turns; ++turn) {
    for (int s = 0; s < sessions; ++s) {
      const std::string session = o.client_name + "-chat-" + std::to_string(s);
      auto& h = history[s];
      const size_t user = bt * (2 + rng() % 4) + rng() % bt;  // A new message, not block-aligned.
      for (size_t i = 0; i < user; ++i) h.push_back(static_cast<TokenId>(rng() % 32000));
      const auto t0 = std::chrono::steady_clock::now();
      auto lease = c.Acquire(session, h);
      if (!lease.ok() || !lease->Wait(std::chrono::seconds(5)).ok()) {
        std::fprintf(stderr, "[%s] acquire: %s\n", o.client_name.c_str(), lease.status().ToString().c_str());
        return 1;
      }
      const std::vector<BlockKey> keys = c.Keys(h);
      bool intact = true;
      for (size_t i = 0; i < lease->size(); ++i) intact &= KvIntact(keys[i], lease->block(i).data, lease->slot_bytes());
      const uint32_t have = static_cast<uint32_t>(lease->size());
      const uint32_t fresh = static_cast<uint32_t>(keys.size()) - have;
      if (fresh > 0) {
        auto w = c.Allocate(fresh);
        if (!w.ok()) {
          std::fprintf(stderr, "[%s] allocate: %s\n", o.client_name.c_str(), w.status().ToString().c_str());
          return 1;
        }
        for (uint32_t i = 0; i < fresh; ++i) WriteKv(keys[have + i], w->data(i), w->slot_bytes());
        auto r = c.Commit(*w, session, have ? keys[have - 1] : BlockKey{}, have,
                          std::span<const TokenId>(h).subspan(size_t{have} * bt, size_t{fresh} * bt));
        if (!r.ok()) {
          std::fprintf(stderr, "[%s] commit: %s\n", o.client_name.c_str(), r.status().ToString().c_str());
          return 1;
        }
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      const size_t reused = size_t{have} * bt;
      prompt_tokens += h.size();
      reused_tokens += reused;
      computed_tokens += h.size() - reused;
      if (verbose || s == 0 || !intact) std::printf("[%s] turn %d %-18s prompt %5zu tokens: %5zu from cache (%u blocks%s), %4zu to prefill, %.0f us%s\n",
                  o.client_name.c_str(), turn, session.c_str(), h.size(), reused, have,
                  lease->promoted() ? (", " + std::to_string(lease->promoted()) + " promoted").c_str() : "",
                  h.size() - reused, us, intact ? "" : "  CORRUPT");
      if (!intact) return 3;
      for (int i = 0; i < 24; ++i) h.push_back(static_cast<TokenId>(rng() % 32000));  // The reply.
    }
  }
  std::printf("[%s] done: %d sessions x %d turns, %llu prompt tokens, %llu served from cache (%.1f%%), %llu computed\n",
              o.client_name.c_str(), sessions, turns, (unsigned long long)prompt_tokens, (unsigned long long)reused_tokens,
              100.0 * static_cast<double>(reused_tokens) / static_cast<double>(prompt_tokens),
              (unsigned long long)computed_tokens);
  return 0;
}
