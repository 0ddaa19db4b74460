// The three cache modes agree: a real kvtierd, the worker's transformer in this
// process, and a second worker process that shares a system prompt. Every turn's
// logits (each decoding step) must match recomputation within 1e-4 (fp32).
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "chat.h"
#include "process.h"
#include "redis_server.h"
#include "tiny_model.h"
#include "transformer.h"
#include "workload.h"

namespace kvtier::model {
namespace {

using namespace std::chrono_literals;
using kvtier::testing::DaemonProcess;
using kvtier::testing::Process;

// The daemon's profile matches TinyModel(): 2 layers x 2 kv heads x 16 dim,
// fp32, 16-token blocks (4 KiB). The GPU tier is small on purpose.
constexpr const char* kConfig = R"(backend: host
log_level: info
profiles:
  - name: worker-test
    layers: 2
    kv_heads: 2
    head_dim: 16
    dtype: fp32
    block_tokens: 16
    gpu_blocks: 96
    host_blocks: 1024
)";

// Flags that give kvtier-worker the same model.
std::vector<std::string> WorkerFlags() {
  const ModelConfig c = TinyModel();
  std::vector<std::string> out;
  for (const auto& [key, value] : std::vector<std::pair<std::string, uint64_t>>{
           {"layers", c.layers}, {"hidden", c.hidden}, {"heads", c.heads}, {"kv_heads", c.kv_heads},
           {"head_dim", c.head_dim}, {"intermediate", c.intermediate}, {"vocab", c.vocab}, {"seed", c.seed}}) {
    out.insert(out.end(), {"--set", key + "=" + std::to_string(value)});
  }
  return out;
}

WorkloadOptions Workload() {
  return {.sessions = 2, .turns = 5, .system_tokens = 70, .first_tokens = 90, .user_tokens = 23, .output_tokens = 6};
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::unique_ptr<Client> Connect(const std::string& socket, const ModelId& model) {
  ClientOptions o;
  o.socket_path = socket;
  o.model = model;
  o.client_name = "cache-modes-test";
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Waits until none of the session's blocks is moving.
bool WaitSettled(Client& c, const std::string& session) {
  for (int i = 0; i < 500; ++i) {
    auto info = c.GetSession(session);
    if (!info.ok() || info->summary.moving == 0) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Waits until none of the session's blocks is in the GPU tier or moving.
bool WaitAllOnHost(Client& c, const std::string& session) {
  for (int i = 0; i < 500; ++i) {
    auto info = c.GetSession(session);
    if (info.ok() && info->summary.gpu_blocks == 0 && info->summary.moving == 0 && info->summary.blocks > 0) {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

class CacheModesTest : public ::testing::Test {
 protected:
  // The daemon's configuration (a derived fixture adds stores).
  virtual std::string Config() { return kConfig; }

  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(Config());
    ASSERT_TRUE(daemon_->Start().ok()) << daemon_->log();
    auto m = Transformer::Create(TinyModel());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    auto id = model_->Identity();
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    model_id_ = *id;
    client_ = Connect(daemon_->socket(), model_id_);  // As kvtier-worker's --model-id auto does.
    ASSERT_NE(client_, nullptr);
  }

  // Runs kvtier-worker for session 1's first turn (it commits the system
  // prompt), with `extra` flags after the model's; returns its last line.
  std::string RunOtherWorker(const std::vector<std::string>& extra, const std::string& socket = "") {
    std::vector<std::string> argv = {KVTIER_MODEL_WORKER_PATH,
                                     "--cache",
                                     "kvtier",
                                     "--socket",
                                     socket.empty() ? daemon_->socket() : socket,
                                     "--json",
                                     "--sessions",
                                     "2",
                                     "--workers",
                                     "2",
                                     "--worker-index",
                                     "1",
                                     "--turns",
                                     "1",
                                     "--system-tokens",
                                     "70",
                                     "--first-tokens",
                                     "90",
                                     "--user-tokens",
                                     "23",
                                     "--output-tokens",
                                     "6"};
    for (const std::string& f : WorkerFlags()) argv.push_back(f);
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Process::Spawn(argv);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return "";
    std::string last;
    for (auto line = p->ReadLine(60s); line.ok(); line = p->ReadLine(60s)) last = *line;
    auto rc = p->Wait(10s);
    EXPECT_TRUE(rc.ok() && *rc == 0) << last;
    EXPECT_NE(last.find("\"summary\":true"), std::string::npos) << last;
    return last;
  }
  void TearDown() override {
    if (daemon_ == nullptr) return;
    daemon_->Kill(SIGTERM);
    (void)daemon_->Wait(10s);
    const std::string log = daemon_->log();
    EXPECT_EQ(log.find("ERROR: AddressSanitizer"), std::string::npos) << log;
  }

  std::unique_ptr<ChatRunner> Runner(CacheMode mode) {
    ChatOptions o{.mode = mode, .client = client_.get(), .keep_logits = true};
    auto r = ChatRunner::Create(*model_, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Runs session `s` of the workload through all three modes turn by turn and
  // checks they agree. `between` runs after each kvtier turn.
  void ExpectModesAgree(uint32_t s, const std::function<void(const std::string&)>& between,
                        std::vector<TurnResult>* kvtier_turns) {
    const WorkloadOptions w = Workload();
    auto none = Runner(CacheMode::kNone), local = Runner(CacheMode::kLocal), kv = Runner(CacheMode::kKvtier);
    ASSERT_TRUE(none && local && kv);
    Conversation chat(w, s);
    for (uint32_t turn = 0; turn < w.turns; ++turn) {
      const std::vector<TokenId> prompt = chat.NextPrompt(turn);
      auto rn = none->Turn(chat.id(), prompt, w.output_tokens);
      auto rl = local->Turn(chat.id(), prompt, w.output_tokens);
      auto rk = kv->Turn(chat.id(), prompt, w.output_tokens);
      ASSERT_TRUE(rn.ok() && rl.ok() && rk.ok());
      EXPECT_EQ(rk->cache_error, "") << "turn " << turn;
      ASSERT_EQ(rn->output, rl->output) << "turn " << turn;
      ASSERT_EQ(rn->output, rk->output) << "turn " << turn;
      ASSERT_EQ(rk->logits.size(), w.output_tokens);
      for (size_t i = 0; i < rn->logits.size(); ++i) {
        EXPECT_LT(MaxAbsDiff(rn->logits[i], rl->logits[i]), 1e-4) << "turn " << turn << " step " << i;
        EXPECT_LT(MaxAbsDiff(rn->logits[i], rk->logits[i]), 1e-4) << "turn " << turn << " step " << i;
      }
      if (turn > 0) {
        // Everything but the partial tail block (and the reply's last token) came from kvtierd.
        EXPECT_GE(rk->cached_tokens + 16 + 2 + w.user_tokens, prompt.size()) << "turn " << turn;
        EXPECT_EQ(rk->cached_tokens, rl->cached_tokens) << "turn " << turn;
      }
      kvtier_turns->push_back(*rk);
      chat.AddReply(rn->output);
      between(chat.id());
    }
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Transformer> model_;
  ModelId model_id_;
};

TEST_F(CacheModesTest, ThreeModesAgreeOnEveryTurn) {
  std::vector<TurnResult> turns;
  ExpectModesAgree(0, [](const std::string&) {}, &turns);
  ASSERT_EQ(turns.size(), 5u);
  EXPECT_EQ(turns[0].cached_tokens, 0u);
  for (const TurnResult& t : turns) EXPECT_GT(t.committed_blocks + t.duplicate_blocks, 0u);
  auto info = client_->GetSession("chat-0");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  // The session holds every full block of prompt + reply.
  EXPECT_EQ(info->summary.tokens % 16, 0u);
  EXPECT_GE(info->summary.blocks, turns.back().cached_tokens / 16);
}

TEST_F(CacheModesTest, AgreeWhenBlocksWereDemotedAndPromotedBack) {
  std::vector<TurnResult> turns;
  ExpectModesAgree(
      1,
      [&](const std::string& session) {
        // The last turn read its prefix in the host tier (Promote::kAfterRead):
        // those blocks are promoted after it, and a demotion skips moving blocks.
        ASSERT_TRUE(WaitSettled(*client_, session));
        auto n = client_->Demote(session);
        ASSERT_TRUE(n.ok()) << n.status().ToString();
        ASSERT_TRUE(WaitAllOnHost(*client_, session)) << "session " << session << " never reached the host tier";
      },
      &turns);
  for (size_t i = 1; i < turns.size(); ++i) {
    // The cached prefix was on the host tier: it came back through the copy engine.
    EXPECT_GT(turns[i].promoted_blocks, 0u) << "turn " << i;
    EXPECT_GE(turns[i].promoted_blocks * 16, turns[i].cached_tokens) << "turn " << i;
  }
}

TEST_F(CacheModesTest, SecondWorkerProcessReusesTheSharedSystemPrompt) {
  // Worker process 1 serves session 1's first turn: it commits the system prompt.
  RunOtherWorker({});
  auto other = client_->GetSession("chat-1");
  ASSERT_TRUE(other.ok()) << "the worker process did not commit: " << other.status().ToString();
  EXPECT_EQ(other->summary.model, model_id_) << "the worker computed the same identity from the same weights";

  // This process serves session 0: its first turn finds the system prompt cached
  // (71 tokens with the BOS token: 4 full blocks), computed by the other process.
  std::vector<TurnResult> turns;
  ExpectModesAgree(0, [](const std::string&) {}, &turns);
  EXPECT_EQ(turns[0].cached_tokens, 64u);
}

// A worker of another model with the same KV geometry (other weights: a
// fine-tune, say) commits the same system prompt: its blocks are never served
// here, or the answers would be another model's. Its identity differs, and
// kvtierd keys its blocks apart.
TEST_F(CacheModesTest, AModelOfEqualGeometryButOtherWeightsNeverHits) {
  RunOtherWorker({"--set", "seed=" + std::to_string(TinyModel().seed + 1)});
  auto other = client_->GetSession("chat-1");
  ASSERT_TRUE(other.ok()) << "the worker process did not commit: " << other.status().ToString();
  EXPECT_GT(other->summary.blocks, 0u);
  EXPECT_FALSE(other->summary.model.IsNull());
  EXPECT_NE(other->summary.model, model_id_);
  std::vector<TurnResult> turns;
  ExpectModesAgree(
      0, [](const std::string&) {}, &turns);
  EXPECT_EQ(turns[0].cached_tokens, 0u) << "served another model's KV";

  // Told it is this model (--model-id), a worker of those other weights would
  // be served this model's blocks: the identity is what kvtierd trusts.
  RunOtherWorker({"--set", "seed=" + std::to_string(TinyModel().seed + 1), "--model-id", model_id_.ToHex()});
  auto same = client_->GetSession("chat-1");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->summary.model, model_id_);
}

TEST_F(CacheModesTest, WorkerRejectsADaemonProfileThatDoesNotFitTheModel) {
  ModelConfig wider = TinyModel();
  wider.kv_heads = 4;
  auto m = Transformer::Create(wider);
  ASSERT_TRUE(m.ok());
  auto r = ChatRunner::Create(**m, {.mode = CacheMode::kKvtier, .client = client_.get()});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not fit"), std::string::npos) << r.status().message();
}

// Two hosts, each a kvtierd, sharing a Redis: a kvtier-worker process on host A
// serves session 1's first turn (it commits the system prompt, written through
// to Redis); this process, on host B, then serves session 0, whose first turn
// finds the system prompt in Redis, with the logits of recomputing every step.
class CacheModesAcrossHostsTest : public CacheModesTest {
 protected:
  std::string Config() override {
    return std::string(kConfig) + "stores:\n  fetch_budget_ms: 5000\n  tiers:\n    - kind: redis\n      nodes: [" +
           redis_->address() + "]\n";
  }
  void SetUp() override {
    ASSERT_TRUE(kvtier::testing::RedisInstalled()) << kvtier::testing::kRedisRequired;
    auto r = kvtier::testing::RedisServer::Start();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    redis_ = std::move(r).value();
    host_a_ = std::make_unique<DaemonProcess>(Config());
    ASSERT_TRUE(host_a_->Start().ok()) << host_a_->log();
    CacheModesTest::SetUp();  // Host B: daemon_ and client_.
  }
  void TearDown() override {
    CacheModesTest::TearDown();
    if (host_a_ != nullptr) {
      host_a_->Kill(SIGTERM);
      (void)host_a_->Wait(10s);
    }
  }
  std::unique_ptr<kvtier::testing::RedisServer> redis_;
  std::unique_ptr<DaemonProcess> host_a_;
};

TEST_F(CacheModesAcrossHostsTest, AWorkerOnHostBGetsTheSystemPromptAWorkerOnHostAComputedWithEqualLogits) {
  RunOtherWorker({}, host_a_->socket());
  auto on_a = Connect(host_a_->socket(), model_id_);
  ASSERT_NE(on_a, nullptr);
  double written = 0;
  for (int i = 0; i < 500 && written < 4; ++i) {
    auto st = on_a->Stats();
    ASSERT_TRUE(st.ok());
    for (const auto& [k, v] : *st) written = k == "store.redis.put_blocks" ? v : written;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(written, 4) << "host A wrote the system prompt's blocks through to Redis";
  EXPECT_EQ(client_->GetSession("chat-1").status().code(), StatusCode::kNotFound) << "host B never saw chat-1";

  std::vector<TurnResult> turns;
  ExpectModesAgree(
      0, [](const std::string&) {}, &turns);
  EXPECT_EQ(turns[0].cached_tokens, 64u) << "the system prompt's 4 full blocks came from Redis";
  auto st = client_->Stats();
  ASSERT_TRUE(st.ok());
  double hits = 0;
  for (const auto& [k, v] : *st) hits = k == "store.redis.hit_blocks" ? v : hits;
  EXPECT_EQ(hits, 4);
}

}  // namespace
}  // namespace kvtier::model
