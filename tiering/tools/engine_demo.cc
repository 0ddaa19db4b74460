// kvtier-engine-demo: drives the cache engine on the host backend through a
// multi-turn chat workload and prints what happened at each step.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine_inspector.h"
#include "kvtier/block_key.h"
#include "kvtier/shm_names.h"
#include "kvtier/tiering/engine.h"
#include "kvtier/tiering/host_backend.h"

using namespace kvtier;
using namespace kvtier::tiering;

namespace {

void Die(const Status& st) {
  std::fprintf(stderr, "kvtier-engine-demo: %s\n", st.ToString().c_str());
  std::exit(1);
}

void PrintStats(const Engine& e, const char* when) {
  const EngineStats s = e.stats();
  std::printf("  [%s] gpu %u/%u  host %u/%u  blocks %u  sessions %u  hits %llu  misses %llu  demoted %llu  promoted %llu  dropped %llu\n",
              when, s.used[Tier::kGpu], s.slots[Tier::kGpu], s.used[Tier::kHost], s.slots[Tier::kHost], s.blocks, s.sessions,
              static_cast<unsigned long long>(s.hit_blocks), static_cast<unsigned long long>(s.miss_blocks),
              static_cast<unsigned long long>(s.demoted_blocks), static_cast<unsigned long long>(s.promoted_blocks),
              static_cast<unsigned long long>(s.dropped_blocks));
}

}  // namespace

int main(int argc, char** argv) {
  int sessions = 6, turns = 4;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: kvtier-engine-demo [--sessions N] [--turns N]\n"
                  "Runs a multi-turn chat workload against the cache engine (host backend)\n"
                  "with a GPU tier smaller than the working set, and prints each step.\n");
      return 0;
    }
    if (!std::strcmp(argv[i], "--sessions") && i + 1 < argc) sessions = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--turns") && i + 1 < argc) turns = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "kvtier-engine-demo: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }

  const std::string prefix = "kvtier-demo." + std::to_string(getpid());
  HostBackendOptions bo;
  bo.name_prefix = prefix;
  auto backend = CreateHostBackend(bo);
  if (!backend.ok()) Die(backend.status());

  EngineOptions o;
  o.profile = ModelProfile{"demo-llama", 4, 2, 64, DType::kF16, 16};
  o.gpu_slots = 48;
  o.host_slots = 256;
  o.index_segment = shm_names::Index(prefix, o.name);
  auto engine_or = Engine::Create(o, **backend);
  if (!engine_or.ok()) Die(engine_or.status());
  Engine& engine = **engine_or;
  std::printf("engine: %s\n", o.profile.Describe().c_str());
  std::printf("backend: %s\n", (*backend)->Describe().c_str());
  std::printf("tiers: gpu %u slots, host %u slots (%.1f MiB + %.1f MiB)\n", o.gpu_slots, o.host_slots,
              o.gpu_slots * o.profile.BlockBytes() / 1048576.0, o.host_slots * o.profile.BlockBytes() / 1048576.0);

  const Tenant tenant = Tenant::Make(o.profile.Fingerprint(), "demo-tenant");
  const uint32_t bt = o.profile.block_tokens;
  std::vector<TokenId> system_prompt(4 * bt);
  for (size_t i = 0; i < system_prompt.size(); ++i) system_prompt[i] = 1000 + static_cast<TokenId>(i);
  std::vector<std::vector<TokenId>> history(sessions, system_prompt);

  uint64_t prompt_tokens = 0, cached_tokens = 0;
  for (int turn = 0; turn < turns; ++turn) {
    for (int s = 0; s < sessions; ++s) {
      const std::string sid = "chat-" + std::to_string(s);
      auto& h = history[s];
      for (uint32_t i = 0; i < 2 * bt; ++i) h.push_back(static_cast<TokenId>(s * 100000 + turn * 1000 + i));
      const size_t full = h.size() / bt;
      std::vector<BlockKey> keys(full);
      ComputeKeys(tenant.ns, BlockKey{}, h, bt, keys);
      auto lease = engine.Acquire(tenant, sid, keys, std::span<const TokenId>(h.data(), full * bt));
      if (!lease.ok()) Die(lease.status());
      if (!lease->fence.IsNull()) (void)(*backend)->Wait(lease->fence, std::chrono::seconds(5));
      const uint32_t hit = static_cast<uint32_t>(lease->blocks.size());
      prompt_tokens += h.size();
      cached_tokens += uint64_t{hit} * bt;
      const uint32_t fresh = static_cast<uint32_t>(full) - hit;
      std::printf("turn %d %-7s prompt %4zu tokens: %2u blocks cached (%u promoted from host), %2u to prefill\n", turn,
                  sid.c_str(), h.size(), hit, lease->promoted, fresh);
      if (fresh > 0) {
        auto w = engine.Allocate(tenant, fresh);
        if (!w.ok()) Die(w.status());
        for (uint32_t i = 0; i < fresh; ++i) {
          std::memset(engine.pool(Tier::kGpu).slot_data(w->slots[i]), static_cast<int>(hit + i), o.profile.BlockBytes());
        }
        const BlockKey parent = hit == 0 ? BlockKey{} : keys[hit - 1];
        auto c = engine.Commit(w->id, tenant, sid, parent, hit,
                               std::span<const TokenId>(h.data() + size_t{hit} * bt, size_t{fresh} * bt), w->slots);
        if (!c.ok()) Die(c.status());
        (void)engine.Release(w->id);
      }
      if (lease->id != 0) (void)engine.Release(lease->id);
      engine.Tick();
    }
    (void)engine.WaitIdle(std::chrono::seconds(5));
    engine.Tick();
    PrintStats(engine, ("after turn " + std::to_string(turn)).c_str());
  }
  std::printf("sessions:\n");
  for (const SessionInfo& s : engine.ListSessions()) {
    std::printf("  %-8s %3u blocks (%u gpu, %u host), %llu tokens\n", s.id.c_str(), s.blocks, s.blocks_in[Tier::kGpu],
                s.blocks_in[Tier::kHost], static_cast<unsigned long long>(s.tokens));
  }
  const Status inv = EngineInspector::CheckInvariants(engine);
  std::printf("prompt tokens %llu, served from cache %llu (hit rate %.1f%%); invariants: %s\n",
              static_cast<unsigned long long>(prompt_tokens), static_cast<unsigned long long>(cached_tokens),
              100.0 * static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens), inv.ToString().c_str());
  return inv.ok() ? 0 : 1;
}
