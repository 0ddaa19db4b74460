// kvtier-test-worker: a worker process for the integration tests. It links the
// client library only, and prints one JSON line per command for the test to parse.
//
//   kvtier-test-worker SOCKET commit SESSION SEED BLOCKS   acquire, write the missing blocks, commit
//   kvtier-test-worker SOCKET read   SESSION SEED BLOCKS   acquire and verify every leased block's bytes
//   kvtier-test-worker SOCKET hold   SESSION SEED BLOCKS ALLOC   acquire + allocate, print, sleep until killed
//   kvtier-test-worker SOCKET loop   SEED SECONDS          commit/read sessions until time is up, riding
//                                                          out daemon restarts; prints a summary
// Token IDs come from SEED: the same seed gives the same prompt (and prefix).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/client.h"
#include "payload.h"

using namespace kvtier;

namespace {

std::vector<TokenId> Prompt(uint64_t seed, uint32_t tokens) {
  std::mt19937_64 rng(seed);
  std::vector<TokenId> t(tokens);
  for (auto& x : t) x = static_cast<TokenId>(rng() % 32000);
  return t;
}

int Fail(const Status& st) {
  std::printf("{\"ok\":false,\"code\":\"%s\",\"error\":\"%s\"}\n", std::string(StatusCodeName(st.code())).c_str(),
              st.message().c_str());
  std::fflush(stdout);
  return 1;
}

struct TurnResult {
  uint32_t matched = 0, leased = 0, stored = 0, duplicates = 0;
  bool intact = true;
};

// One chat turn: acquire the cached prefix, verify it, write and commit the rest.
Result<TurnResult> Turn(Client& c, const std::string& session, const std::vector<TokenId>& tokens, bool commit) {
  TurnResult r;
  auto lease = c.Acquire(session, tokens);
  if (!lease.ok()) return lease.status();
  KVTIER_RETURN_IF_ERROR(lease->Wait(std::chrono::seconds(10)));
  const std::vector<BlockKey> keys = c.Keys(tokens);
  r.matched = lease->matched();
  r.leased = static_cast<uint32_t>(lease->size());
  for (size_t i = 0; i < lease->size(); ++i) {
    r.intact = r.intact && testing::PayloadIntact(keys[i], lease->block(i).data, lease->slot_bytes());
  }
  const uint32_t have = static_cast<uint32_t>(lease->size());
  if (commit && have < keys.size()) {
    const uint32_t fresh = static_cast<uint32_t>(keys.size()) - have;
    auto w = c.Allocate(fresh);
    if (!w.ok()) return w.status();
    for (uint32_t i = 0; i < fresh; ++i) testing::FillPayload(keys[have + i], w->data(i), w->slot_bytes());
    const uint32_t bt = c.block_tokens();
    auto res = c.Commit(*w, session, have == 0 ? BlockKey{} : keys[have - 1], have,
                        std::span<const TokenId>(tokens).subspan(size_t{have} * bt, size_t{fresh} * bt));
    if (!res.ok()) return res.status();
    r.stored = res->stored;
    r.duplicates = res->duplicates;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kvtier-test-worker SOCKET commit|read|hold|loop ARGS...\n");
    return 2;
  }
  ClientOptions o;
  o.socket_path = argv[1];
  o.client_name = "test-worker";
  const std::string cmd = argv[2];
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  Client& c = **client;

  if ((cmd == "commit" || cmd == "read") && argc == 6) {
    const uint32_t blocks = static_cast<uint32_t>(std::atoi(argv[5]));
    const auto tokens = Prompt(std::strtoull(argv[4], nullptr, 10), blocks * c.block_tokens());
    const size_t probed = c.Probe(tokens);
    auto r = Turn(c, argv[3], tokens, cmd == "commit");
    if (!r.ok()) return Fail(r.status());
    std::printf("{\"ok\":%s,\"probed\":%zu,\"matched\":%u,\"leased\":%u,\"stored\":%u,\"duplicates\":%u,\"intact\":%s}\n",
                r->intact ? "true" : "false", probed, r->matched, r->leased, r->stored, r->duplicates,
                r->intact ? "true" : "false");
    return r->intact ? 0 : 3;
  }
  if (cmd == "hold" && argc == 7) {
    const uint32_t blocks = static_cast<uint32_t>(std::atoi(argv[5]));
    const auto tokens = Prompt(std::strtoull(argv[4], nullptr, 10), blocks * c.block_tokens());
    auto lease = c.Acquire(argv[3], tokens);
    if (!lease.ok()) return Fail(lease.status());
    auto w = c.Allocate(static_cast<uint32_t>(std::atoi(argv[6])));
    if (!w.ok()) return Fail(w.status());
    std::printf("{\"ok\":true,\"holding\":%zu,\"allocated\":%zu}\n", lease->size(), w->size());
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (cmd == "loop" && argc == 5) {
    const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::atof(argv[4]));
    std::mt19937_64 rng(seed);
    uint64_t turns = 0, errors = 0, corrupt = 0, reconnects = 0;
    uint64_t instance = c.instance_id();
    std::string last_error;
    while (std::chrono::steady_clock::now() < until) {
      const uint64_t conv = rng() % 8;
      const uint32_t blocks = 1 + static_cast<uint32_t>(rng() % 12);
      const auto tokens = Prompt(seed * 1000 + conv, blocks * c.block_tokens());
      auto r = Turn(c, "loop-" + std::to_string(seed) + "-" + std::to_string(conv), tokens, true);
      if (!r.ok()) {
        // Only documented, transient errors are acceptable while the daemon restarts:
        // unavailable/timeout (it is gone), and failed_precondition (a commit that
        // continues a prefix acquired from the previous daemon, which the new one lacks).
        const StatusCode code = r.status().code();
        if (code != StatusCode::kUnavailable && code != StatusCode::kResourceExhausted && code != StatusCode::kTimeout &&
            code != StatusCode::kFailedPrecondition) {
          return Fail(r.status());
        }
        ++errors;
        last_error = r.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      ++turns;
      corrupt += r->intact ? 0 : 1;
      if (c.instance_id() != instance) {
        instance = c.instance_id();
        ++reconnects;
      }
    }
    std::printf("{\"ok\":%s,\"turns\":%llu,\"errors\":%llu,\"corrupt\":%llu,\"reconnects\":%llu}\n",
                corrupt == 0 ? "true" : "false", (unsigned long long)turns, (unsigned long long)errors,
                (unsigned long long)corrupt, (unsigned long long)reconnects);
    return corrupt == 0 ? 0 : 3;
  }
  std::fprintf(stderr, "kvtier-test-worker: bad command line\n");
  return 2;
}
