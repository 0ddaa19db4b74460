#include "wire_samples.h"

#include <cstdint>
#include <limits>
#include <string>

namespace kvtier::wire::testing {
namespace {

SessionSummary Summary(const std::string& id, int32_t priority) {
  SessionSummary s;
  s.id = id;
  s.tenant = "tenant-a";
  s.priority = priority;
  s.last_use_ms_ago = 1234567890123ULL;
  s.blocks = 42;
  s.gpu_blocks = 30;
  s.host_blocks = 12;
  s.moving = 3;
  s.tokens = 42 * 16 + 7;
  return s;
}

}  // namespace

std::vector<Message> SampleMessages() {
  std::vector<Message> out;

  out.push_back(Hello{1, 3, "model_worker/0", 31337, "tenant-a", "llama-8b", ModelId{BlockKey{0x1234, 0xfedc}}});

  Welcome w;
  w.version = 2;
  w.instance_id = 0xfedcba9876543210ULL;
  w.client_id = 7;
  w.profile = ModelProfile{"llama-8b", 32, 8, 128, DType::kBF16, 16};
  w.ns = Namespace{BlockKey{0x1111222233334444ULL, 0x5555666677778888ULL}};
  w.backend = BackendKind::kCuda;
  PoolDesc gpu{Tier::kGpu, 2u << 20, 4096, "", {}};
  for (int i = 0; i < 64; ++i) gpu.ipc_handle.push_back(static_cast<uint8_t>(i * 3 + 1));
  w.pools.push_back(gpu);
  w.pools.push_back(PoolDesc{Tier::kHost, 2u << 20, 16384, "/kvtier.1.host", {}});
  w.index_segment = "/kvtier.1.index";
  w.fence_segment = "/kvtier.1.fence";
  w.max_blocks_per_request = 8192;
  w.max_payload = kMaxPayload;
  for (int e = 0; e < 3; ++e) {
    IpcEventHandle h{};
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(e * 64 + i);
    w.fence_events.push_back(h);
  }
  out.push_back(w);

  out.push_back(Ping{0x0123456789abcdefULL});
  out.push_back(Pong{0x0123456789abcdefULL});
  out.push_back(OkResponse{});
  out.push_back(ErrorResponse{StatusCode::kResourceExhausted, "gpu tier full (0 of 64 slots free)"});
  out.push_back(CountResponse{17});

  out.push_back(AllocateRequest{5});
  out.push_back(AllocateResponse{99, {3, 1, 4, 1, 5}});

  CommitRequest c;
  c.lease_id = 99;
  c.session = "chat-42";
  c.parent = BlockKey{0xdeadbeefULL, 0xcafef00dULL};
  c.start_block = 2;
  for (uint32_t t = 0; t < 32; ++t) c.tokens.push_back(128000 + t * 7);
  c.slots = {3, 1};
  c.writer_event.emplace();
  for (size_t i = 0; i < c.writer_event->size(); ++i) (*c.writer_event)[i] = static_cast<uint8_t>(255 - i);
  out.push_back(c);
  out.push_back(CommitResponse{1, 1});

  SaveRequest save;
  save.lease_id = 99;
  save.session = "vllm-1f2e3d4c-r0-cmpl-7";
  save.parent = BlockKey{0x1234ULL, 0x5678ULL};
  save.start_block = 128;
  save.flags = kSaveAdopt;
  save.refill = 2;
  for (uint32_t t = 0; t < 16; ++t) save.tokens.push_back(500 + t);
  save.slots = {7};
  save.writer_event.emplace();
  for (size_t i = 0; i < save.writer_event->size(); ++i) (*save.writer_event)[i] = static_cast<uint8_t>(i);
  out.push_back(save);
  out.push_back(SaveResponse{1, 0, 128, BlockKey{0xabcULL, 0xdefULL}, 100, 30000, {4, 9}});

  AcquireRequest a;
  a.session = "chat-42";
  a.flags = kAcquirePromote;
  a.keys = {BlockKey{1, 2}, BlockKey{3, 4}, BlockKey{~0ULL, 0}};
  for (uint32_t t = 0; t < 48; ++t) a.tokens.push_back(std::numeric_limits<uint32_t>::max() - t);
  out.push_back(a);

  AcquireResponse ar;
  ar.lease_id = 100;
  ar.matched = 3;
  ar.promoted = 1;
  ar.fence = Fence{77, CopyDirection::kHostToGpu};
  ar.blocks = {{Tier::kGpu, 3}, {Tier::kGpu, 1}, {Tier::kHost, 900}};
  out.push_back(ar);
  ReleaseRequest rel{100, IpcEventHandle{}};
  for (size_t i = 0; i < rel.after_event->size(); ++i) (*rel.after_event)[i] = static_cast<uint8_t>(i * 3);
  out.push_back(rel);

  out.push_back(PrefetchRequest{"chat-42"});
  out.push_back(DemoteRequest{"chat-43"});
  out.push_back(EvictRequest{"", "tenant-b", true});
  out.push_back(SetPriorityRequest{"chat-42", -5, 90000});
  out.push_back(ListSessionsRequest{"tenant-a", ListSessionsPage{500, "tenant-a", "chat-41"}});
  out.push_back(ListSessionsResponse{{Summary("chat-42", 0), Summary("chat-43", -5), Summary("", 100)}, true});
  out.push_back(SessionInfoRequest{"chat-42"});
  out.push_back(EndSessionRequest{"vllm-1f2e3d4c-r0-cmpl-7"});

  SessionInfoResponse si;
  si.summary = Summary("chat-42", 2);
  si.chain = {BlockKey{10, 11}, BlockKey{12, 13}};
  si.tiers = {0, 1};
  si.stores = {"disk", "redis"};
  out.push_back(si);

  out.push_back(StatsRequest{});
  out.push_back(StatsResponse{{{"gpu.slots_used", 123.0}, {"host.slots_used", 4.5e9}, {"hit_ratio", -0.25}}});
  out.push_back(ConfigRequest{});
  out.push_back(ConfigResponse{"device: auto\ngpu:\n  slots: 4096\nhost:\n  slots: 16384\n"});
  return out;
}

Message WithoutExtensions(const Message& m) {
  Message out = m;
  if (auto* w = std::get_if<Welcome>(&out)) w->fence_events.clear();
  if (auto* c = std::get_if<CommitRequest>(&out)) c->writer_event.reset();
  if (auto* s = std::get_if<SaveRequest>(&out)) s->writer_event.reset();
  if (auto* r = std::get_if<ReleaseRequest>(&out)) r->after_event.reset();
  if (auto* h = std::get_if<Hello>(&out)) h->model = ModelId{};
  if (auto* p = std::get_if<SetPriorityRequest>(&out)) p->ttl_ms = 0;
  if (auto* l = std::get_if<ListSessionsRequest>(&out)) l->page.reset();
  if (auto* l = std::get_if<ListSessionsResponse>(&out)) l->more = false;
  if (auto* i = std::get_if<SessionInfoResponse>(&out)) i->stores.clear();
  return out;
}

}  // namespace kvtier::wire::testing
