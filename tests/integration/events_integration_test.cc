// KV events from a real kvtierd, read by real ZMQ subscribers: replaying a
// workload's events gives exactly the daemon's blocks per tier; a subscriber
// that loses batches recovers them through the replay; one that never reads
// does not hold anyone up; with events off nothing is published. The events
// sockets live in a helper process: a peer that floods them with connections
// until descriptors run out, or a kill, ends the helper, never kvtierd, and
// events resume once another helper runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <csignal>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>
#define MSGPACK_NO_BOOST
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/event_stream.h"
#include "process.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using events::kReplayEnd;

uint64_t FromSeq8(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), events::kSeqBytes);
  return events::DecodeSeq(m.data(), m.size());
}

std::string Hex(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  EXPECT_EQ(o.via.bin.size, 16u);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint32_t i = 0; i < o.via.bin.size; ++i) {
    const auto b = static_cast<unsigned char>(o.via.bin.ptr[i]);
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

// The value of `key` in msgpack map `m` (nil if absent).
const msgpack::object& Field(const msgpack::object& m, std::string_view key) {
  static const msgpack::object kNil;
  if (m.type != msgpack::type::MAP) return kNil;
  for (uint32_t i = 0; i < m.via.map.size; ++i) {
    const msgpack::object& k = m.via.map.ptr[i].key;
    if (k.type == msgpack::type::STR && std::string_view(k.via.str.ptr, k.via.str.size) == key) {
      return m.via.map.ptr[i].val;
    }
  }
  return kNil;
}

std::string Text(const msgpack::object& o) {
  return o.type == msgpack::type::STR ? std::string(o.via.str.ptr, o.via.str.size) : std::string();
}

// Replays batches, in seq order, into the blocks per tier (key hex -> tier).
struct Replica {
  std::unordered_map<std::string, std::string> tier_of;
  std::map<std::string, std::vector<uint32_t>> tokens;  // Of stored blocks, when the stream carries them.
  std::vector<std::string> evicted;
  uint64_t applied = 0;

  void Apply(uint64_t seq, const std::string& payload) {
    ASSERT_EQ(seq, applied + 1) << "batches are applied in order, none missing";
    applied = seq;
    msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& b = h.get();
    ASSERT_EQ(Field(b, "v").as<uint32_t>(), 1u);
    ASSERT_EQ(Field(b, "seq").as<uint64_t>(), seq);
    const msgpack::object& events = Field(b, "events");
    ASSERT_EQ(events.type, msgpack::type::ARRAY);
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      const msgpack::object& e = events.via.array.ptr[i];
      const std::string type = Text(Field(e, "type"));
      if (type == "cleared") {
        tier_of.clear();
      } else if (type == "stored") {
        const std::string key = Hex(Field(e, "key"));
        EXPECT_TRUE(tier_of.emplace(key, Text(Field(e, "tier"))).second) << "stored twice: " << key;
        EXPECT_EQ(Field(e, "block_tokens").as<uint32_t>(), 16u);
        if (Field(e, "tokens").type == msgpack::type::ARRAY)
          tokens[key] = Field(e, "tokens").as<std::vector<uint32_t>>();
      } else if (type == "moved") {
        auto it = tier_of.find(Hex(Field(e, "key")));
        ASSERT_NE(it, tier_of.end()) << "moved before it was stored";
        EXPECT_EQ(it->second, Text(Field(e, "from")));
        it->second = Text(Field(e, "to"));
      } else if (type == "removed") {
        auto it = tier_of.find(Hex(Field(e, "key")));
        ASSERT_NE(it, tier_of.end()) << "removed before it was stored";
        EXPECT_EQ(it->second, Text(Field(e, "tier")));
        tier_of.erase(it);
      } else if (type == "session_evicted") {
        evicted.push_back(Text(Field(e, "session")));
      } else {
        ADD_FAILURE() << "unknown event type '" << type << "'";
      }
    }
  }
};

// A subscriber to kvtierd's PUB socket that fills gaps from its ROUTER socket.
class Subscriber {
 public:
  Subscriber(zmq::context_t& ctx, const std::string& publish, const std::string& replay)
      : sub_(ctx, zmq::socket_type::sub), dealer_(ctx, zmq::socket_type::dealer) {
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::subscribe, "kvtier");
    sub_.connect(publish);
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect(replay);
  }

  // The batches kvtierd keeps from `from` on, as its replay answers.
  std::vector<std::pair<uint64_t, std::string>> Replay(uint64_t from) {
    std::vector<std::pair<uint64_t, std::string>> out;
    const std::string s8 = events::EncodeSeq(from);
    std::array<zmq::const_buffer, 2> req = {zmq::const_buffer(), zmq::buffer(s8)};
    EXPECT_TRUE(zmq::send_multipart(dealer_, req));
    for (;;) {
      zmq::pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 5000ms) == 0) {
        ADD_FAILURE() << "no answer to the replay";
        return out;
      }
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(dealer_, std::back_inserter(parts));
      EXPECT_EQ(parts.size(), 3u);
      if (parts.size() != 3) return out;
      EXPECT_EQ(parts[0].size(), 0u);
      const uint64_t seq = FromSeq8(parts[1]);
      if (seq == kReplayEnd) return out;
      out.emplace_back(seq, parts[2].to_string());
    }
  }

  // Reads live batches until `seq` is applied; `lose(seq)` true: that batch is
  // thrown away as received, as if it had been dropped. A gap is filled from
  // the replay. Returns false if `seq` did not come in time.
  bool ReadUntil(uint64_t seq, const std::function<bool(uint64_t)>& lose = nullptr) {
    const auto until = Clock::now() + 10s;
    while (replica.applied < seq && Clock::now() < until) ReadOne(100ms, lose);
    return replica.applied >= seq;
  }
  // Catches up from the replay (from seq 1), then, until a live batch arrives
  // (the subscription reached kvtierd), has `poke` make one.
  void Join(const std::function<void()>& poke) {
    for (auto& [seq, payload] : Replay(1)) Keep(seq, payload);
    ASSERT_GE(replica.applied, 1u) << "the first batch (cleared) is kept for replays";
    for (int i = 0; i < 100; ++i) {
      poke();
      if (ReadOne(100ms, nullptr)) return;
    }
    FAIL() << "no live batch reached the subscriber";
  }

  Replica replica;
  std::map<uint64_t, std::string> seen;  // Every batch applied, by seq.
  int lost = 0, gaps = 0;

 private:
  // Reads at most one live batch; false if none came within `timeout`.
  bool ReadOne(std::chrono::milliseconds timeout, const std::function<bool(uint64_t)>& lose) {
    zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, timeout);
    if (!(item.revents & ZMQ_POLLIN)) return false;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(sub_, std::back_inserter(parts));
    if (parts.size() != 3) {
      ADD_FAILURE() << "a message of " << parts.size() << " frames";
      return true;
    }
    EXPECT_EQ(parts[0].to_string(), "kvtier");
    const uint64_t got = FromSeq8(parts[1]);
    if (lose && lose(got)) {
      ++lost;
      return true;
    }
    if (got <= replica.applied) return true;
    if (got > replica.applied + 1) {
      ++gaps;
      for (auto& [s, payload] : Replay(replica.applied + 1)) {
        if (s > replica.applied && s < got) Keep(s, payload);
      }
    }
    Keep(got, parts[2].to_string());
    return true;
  }
  void Keep(uint64_t seq, std::string payload) {
    replica.Apply(seq, payload);
    seen[seq] = std::move(payload);
  }
  zmq::socket_t sub_, dealer_;
};

std::vector<TokenId> Tokens(uint32_t seed, uint32_t blocks) {
  std::vector<TokenId> t;
  for (uint32_t i = 0; i < blocks * 16; ++i) t.push_back(seed * 7919 + i);
  return t;
}

// GPU 48 and host 32 blocks: eight 12-block sessions overflow both tiers.
// `events` replaces the events section's defaults for the test.
std::string EventsConfig(uint32_t max_batch_events = 64, const std::string& events = "  token_ids: true\n") {
  std::string config = kSmallDaemonConfig;
  config.replace(config.find("gpu_blocks: 256"), 15, "gpu_blocks: 48");
  config.replace(config.find("host_blocks: 1024"), 17, "host_blocks: 32");
  return config + "events:\n  enabled: true\n" + events + "  max_batch_events: " + std::to_string(max_batch_events) +
         "\n";
}

class EventsTest : public ::testing::Test {
 protected:
  // `config`, if given, is the daemon's whole configuration instead.
  explicit EventsTest(uint32_t max_batch_events = 64, const std::string& events = "  token_ids: true\n",
                      const std::string& config = "")
      : daemon_(config.empty() ? EventsConfig(max_batch_events, events) : config) {}
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
    ClientOptions o;
    o.socket_path = daemon_.socket();
    o.client_name = "events-test";
    o.reconnect = false;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  void TearDown() override {
    client_.reset();
    const std::string log = daemon_.log();
    for (const char* bad : {"ThreadSanitizer", "AddressSanitizer", "LeakSanitizer", "runtime error:"}) {
      EXPECT_EQ(log.find(bad), std::string::npos) << "kvtierd's log reports " << bad;
    }
    if (HasFailure()) std::fprintf(stderr, "--- kvtierd log ---\n%s", log.c_str());
  }
  std::string Publish() const { return "ipc://" + daemon_.socket() + ".events"; }
  std::string ReplayEndpoint() const { return "ipc://" + daemon_.socket() + ".replay"; }

  double Stat(const std::string& name) {
    auto s = client_->Stats();
    EXPECT_TRUE(s.ok());
    for (const auto& [k, v] : *s) {
      if (k == name) return v;
    }
    ADD_FAILURE() << "no stat " << name;
    return -1;
  }
  void Commit(const std::string& session, const std::vector<TokenId>& tokens) {
    auto w = client_->Allocate(static_cast<uint32_t>(tokens.size() / 16));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto r = client_->Commit(*w, session, BlockKey{}, 0, tokens);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // A workload that stores, demotes, promotes, drops and evicts blocks.
  void Workload(uint32_t seed) {
    for (uint32_t i = 0; i < 8; ++i) {
      const std::string id = "s" + std::to_string(seed) + "-" + std::to_string(i);
      const auto tokens = Tokens(seed * 100 + i, 12);
      Commit(id, tokens);
      if (i % 3 == 0) {
        ASSERT_TRUE(client_->Demote(id).ok());
      }
      if (i % 3 == 2) {
        auto lease = client_->Acquire("s" + std::to_string(seed) + "-0", Tokens(seed * 100, 12));
        ASSERT_TRUE(lease.ok()) << lease.status().ToString();
        ASSERT_TRUE(lease->Wait(10s).ok());
      }
    }
    ASSERT_TRUE(client_->Evict("s" + std::to_string(seed) + "-7").ok());
  }
  // Every session's blocks and their tier, as `cachectl session` prints them.
  std::unordered_map<std::string, std::string> DaemonBlocks() {
    std::unordered_map<std::string, std::string> out;
    const nlohmann::json list = Cachectl({"sessions"});
    for (const nlohmann::json& s : list["sessions"]) {
      const nlohmann::json info = Cachectl({"session", s["id"].get<std::string>()});
      for (const nlohmann::json& b : info["chain"]) out[b["key"].get<std::string>()] = b["tier"].get<std::string>();
    }
    return out;
  }
  // cachectl --json ARGS: its one line of JSON.
  nlohmann::json Cachectl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {CACHECTL_PATH, "--socket", daemon_.socket(), "--json"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = Process::Spawn(argv);
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return {};
    auto line = p->ReadLine(10s);
    auto rc = p->Wait(10s);
    EXPECT_TRUE(line.ok() && rc.ok() && *rc == 0) << args[0];
    return line.ok() ? nlohmann::json::parse(*line) : nlohmann::json();
  }
  // Waits for copies to settle: the replica equals the daemon's blocks once
  // the stream's last batch is read and nothing moved meanwhile.
  void ExpectReplicaMatches(Subscriber& sub, const std::function<bool(uint64_t)>& lose = nullptr) {
    std::unordered_map<std::string, std::string> daemon;
    for (int i = 0; i < 200; ++i) {  // Copies still landing move blocks: at most 10 s.
      const auto seq = static_cast<uint64_t>(Stat("event_seq"));
      ASSERT_TRUE(sub.ReadUntil(seq, lose)) << "batch " << seq << " never came";
      daemon = DaemonBlocks();
      if (static_cast<uint64_t>(Stat("event_seq")) == seq && sub.replica.tier_of == daemon) break;
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_EQ(sub.replica.tier_of, daemon);
    EXPECT_FALSE(daemon.empty());
  }

  // Brings `sub` up to date and makes sure live batches reach it (each poke: a one-block session).
  void Join(Subscriber& sub) {
    int n = 0;
    sub.Join([&] {
      ++n;
      Commit("probe-" + std::to_string(n), Tokens(9000 + n, 1));
    });
  }

  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
  zmq::context_t ctx_{1};
};

TEST_F(EventsTest, ASubscribersReplayOfTheEventsEndsWithTheDaemonsBlocksPerTier) {
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  // Joined after the stream began: the replay brings it up to date from seq 1.
  Join(sub);
  Workload(1);
  ExpectReplicaMatches(sub);
  EXPECT_EQ(sub.replica.evicted, std::vector<std::string>{"s1-7"});
  // Stored blocks carry their tokens (events.token_ids): those of s1-6's first block.
  const std::vector<BlockKey> keys = client_->Keys(Tokens(106, 12));
  const auto tokens = Tokens(106, 1);
  EXPECT_EQ(sub.replica.tokens[keys[0].ToHex()], std::vector<uint32_t>(tokens.begin(), tokens.end()));
  EXPECT_GT(Stat("events"), 0);
  EXPECT_EQ(Stat("event_batches_dropped"), 0);
  // Every tier took part: blocks were demoted, promoted and dropped.
  std::map<std::string, int> tiers;
  for (const auto& [k, t] : sub.replica.tier_of) ++tiers[t];
  EXPECT_GT(tiers["gpu"], 0);
  EXPECT_GT(tiers["host"], 0);

  // cachectl events, replaying from seq 1, prints the same batches.
  auto ctl = Process::Spawn(
      {CACHECTL_PATH, "--socket", daemon_.socket(), "--json", "events", "--from", "1", "--idle-exit", "500ms"});
  ASSERT_TRUE(ctl.ok()) << ctl.status().ToString();
  std::vector<std::string> lines;
  for (;;) {
    auto line = ctl->ReadLine(10s);
    if (!line.ok()) break;
    lines.push_back(*line);
  }
  auto rc = ctl->Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
  ASSERT_EQ(lines.size(), sub.seen.size()) << "one JSON line per batch";
  EXPECT_NE(lines.front().find("\"type\":\"cleared\""), std::string::npos) << lines.front();
  EXPECT_NE(lines.back().find("\"seq\":" + std::to_string(sub.seen.rbegin()->first)), std::string::npos);
}

TEST_F(EventsTest, ASubscriberThatLosesBatchesRecoversThemThroughTheReplay) {
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  Join(sub);
  const uint64_t start = sub.replica.applied;
  // Batches start+2 and start+3 are thrown away as they arrive; later ones show the gap.
  auto lose = [&](uint64_t seq) { return seq >= start + 2 && seq <= start + 3 && sub.lost < 2; };
  Workload(2);
  Workload(6);
  ExpectReplicaMatches(sub, lose);
  EXPECT_GT(sub.lost, 0) << "the workload made enough batches to lose some";
  EXPECT_GE(sub.gaps, 1);
}

TEST_F(EventsTest, AMalformedReplayRequestGetsTheEndMarkerAndHarmsNothing) {
  zmq::socket_t dealer(ctx_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(ReplayEndpoint());
  auto ask = [&](std::vector<std::string> frames) {
    std::vector<zmq::const_buffer> out;
    for (const std::string& f : frames) out.push_back(zmq::buffer(f));
    EXPECT_TRUE(zmq::send_multipart(dealer, out));
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&item, 1, 5000ms), 1) << "no answer";
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(dealer, std::back_inserter(parts));
    EXPECT_EQ(parts.size(), 3u);
    return parts.size() == 3 ? FromSeq8(parts[1]) : 0;
  };
  EXPECT_EQ(ask({"", "abc"}), kReplayEnd) << "a 3-byte sequence number";
  EXPECT_EQ(ask({"garbage"}), kReplayEnd) << "no empty delimiter";
  EXPECT_EQ(ask({"", events::EncodeSeq(1), "more"}), kReplayEnd) << "a frame too many";
  // kvtierd goes on publishing and answering.
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  Join(sub);
  Workload(10);
  ExpectReplicaMatches(sub);
}

// One event per batch: far more batches than a subscriber's queue and socket buffers hold.
class SlowSubscriberTest : public EventsTest {
 protected:
  SlowSubscriberTest() : EventsTest(1) {}
};

TEST_F(SlowSubscriberTest, ASubscriberThatNeverReadsHoldsNobodyUp) {
  // A subscriber with room for one message that never reads it.
  zmq::socket_t slow(ctx_, zmq::socket_type::sub);
  slow.set(zmq::sockopt::rcvhwm, 1);
  slow.set(zmq::sockopt::linger, 0);
  slow.set(zmq::sockopt::subscribe, "");
  slow.connect(Publish());
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  Join(sub);
  const int gaps = sub.gaps;  // Joining may have skipped batches published before the subscription took.
  for (uint32_t seed = 3; seed < 9; ++seed) {
    Workload(seed);
    // Read as it goes (a few hundred batches per workload, below the queues' 1000): as a router would.
    ASSERT_TRUE(sub.ReadUntil(static_cast<uint64_t>(Stat("event_seq"))));
  }
  ExpectReplicaMatches(sub);
  EXPECT_EQ(sub.gaps, gaps) << "the reading subscriber lost nothing";
  EXPECT_EQ(Stat("event_batches_dropped"), 0);
  const double batches = Stat("event_batches");
  // What the slow one has now: what its queue and the socket's buffers held; the rest was dropped for it.
  int got = 0;
  for (;;) {
    zmq::pollitem_t item{slow.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 200ms) == 0) break;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(slow, std::back_inserter(parts));
    ++got;
  }
  EXPECT_GT(got, 0) << "it was subscribed";
  EXPECT_LT(got, batches) << "kvtierd dropped messages for it rather than wait";
  std::printf("%.0f batches published, %d reached the subscriber that never read\n", batches, got);
}

// ---- the events helper process ----

// kvtierd's children that run as its events helper (kvtierd --events-helper ...), from /proc.
std::vector<pid_t> HelperPids(pid_t daemon) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces; the fields after its ')' do not.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != daemon) continue;
    std::ifstream cmd(entry.path() / "cmdline");
    const std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find("--events-helper") != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

bool ProcessExists(pid_t pid) { return std::filesystem::exists("/proc/" + std::to_string(pid)); }

// A plain (not ZMQ) connection to a unix socket, non-blocking; -1 if refused or the backlog is full.
int ConnectUnix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A low descriptor limit, so that a flood reaches it fast: kvtierd's own and
// the helpers' (those it starts later inherit it).
constexpr rlim_t kFloodFdLimit = 256;

class EventsHelperTest : public EventsTest {
 protected:
  void LowerFdLimit() {
    const rlimit low{kFloodFdLimit, kFloodFdLimit};
    ASSERT_EQ(::prlimit(daemon_.pid(), RLIMIT_NOFILE, &low, nullptr), 0) << std::strerror(errno);
    for (pid_t helper : HelperPids(daemon_.pid())) ASSERT_EQ(::prlimit(helper, RLIMIT_NOFILE, &low, nullptr), 0);
  }
  bool DaemonAlive() { return !daemon_.Wait(std::chrono::milliseconds(1)).ok(); }
  // One Acquire of `tokens` (committed as `session`) and its release: how long it took.
  double AcquireMs(const std::string& session, const std::vector<TokenId>& tokens) {
    const auto t0 = Clock::now();
    auto lease = client_->Acquire(session, tokens);
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    if (!lease.ok()) return -1;
    EXPECT_TRUE(lease->Wait(10s).ok());
    EXPECT_TRUE(lease->Release().ok());
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  static double Median(std::vector<double> v) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

TEST_F(EventsHelperTest, AConnectionFloodOnTheEventSocketsLeavesKvtierdServing) {
  LowerFdLimit();
  const auto bystander = Tokens(77, 4);
  Commit("bystander", bystander);
  std::vector<double> quiet;
  for (int i = 0; i < 200; ++i) quiet.push_back(AcquireMs("bystander", bystander));
  const uint64_t seq_before = static_cast<uint64_t>(Stat("event_seq"));

  // Plain connections to both event sockets, held open, far past the limit:
  // libzmq's accept fails with EMFILE and aborts the process that owns them.
  std::atomic<bool> flooding{true};
  std::vector<int> fds;
  std::thread flood([&] {
    const auto until = Clock::now() + 4s;
    for (int i = 0; fds.size() < 4 * kFloodFdLimit && Clock::now() < until; ++i) {
      const int fd = ConnectUnix(daemon_.socket() + (i % 4 == 0 ? ".events" : ".replay"));
      if (fd < 0) {
        std::this_thread::sleep_for(1ms);  // Backlog full, or no helper listening right now.
        continue;
      }
      fds.push_back(fd);
    }
    flooding = false;
  });
  // A bystander's requests go on meanwhile, and make events.
  std::vector<double> flooded;
  while (flooding && DaemonAlive() && !HasFailure()) {
    flooded.push_back(AcquireMs("bystander", bystander));
    Commit("during-" + std::to_string(flooded.size()), Tokens(5000 + static_cast<uint32_t>(flooded.size()), 1));
  }
  flood.join();
  std::printf("flood: %zu connections held; bystander acquire p50 %.3f ms quiet (%zu), %.3f ms during the flood (%zu)\n",
              fds.size(), Median(quiet), quiet.size(), Median(flooded), flooded.size());
  ASSERT_TRUE(DaemonAlive()) << "kvtierd died during the flood\n" << daemon_.log();
  EXPECT_GT(fds.size(), 2 * kFloodFdLimit) << "the flood passed the descriptor limit";
  for (int fd : fds) ::close(fd);

  // The flood ended the helper at least once; kvtierd started another.
  for (int i = 0; i < 300; ++i) {
    if (Stat("event_helper_restarts") >= 1 && HelperPids(daemon_.pid()).size() == 1) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GE(Stat("event_helper_restarts"), 1);
  ASSERT_EQ(HelperPids(daemon_.pid()).size(), 1u);
  EXPECT_GE(AcquireMs("bystander", bystander), 0);

  // Events are published again: a new subscriber receives live batches.
  zmq::socket_t live(ctx_, zmq::socket_type::sub);
  live.set(zmq::sockopt::linger, 0);
  live.set(zmq::sockopt::subscribe, "kvtier");
  live.connect(Publish());
  uint64_t got = 0;
  for (int i = 0; i < 200 && got == 0; ++i) {
    Commit("after-" + std::to_string(i), Tokens(7000 + i, 1));
    zmq::pollitem_t item{live.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 100ms) == 0) continue;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(live, std::back_inserter(parts));
    ASSERT_EQ(parts.size(), 3u);
    got = FromSeq8(parts[1]);
  }
  EXPECT_GT(got, seq_before) << "live batches reach a subscriber after the flood";
  // And a replay serves what came before the flood (re-sent to each new helper) and after it.
  Subscriber replayer(ctx_, Publish(), ReplayEndpoint());
  const auto kept = replayer.Replay(1);
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(kept.front().first, 1u);
  EXPECT_GE(kept.back().first, got);
  EXPECT_TRUE(DaemonAlive());
}

TEST_F(EventsHelperTest, AKilledHelperIsRestartedAndEventsResume) {
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  Join(sub);
  Workload(21);
  ExpectReplicaMatches(sub);
  const std::vector<pid_t> before = HelperPids(daemon_.pid());
  ASSERT_EQ(before.size(), 1u) << "one helper, a child of kvtierd";
  EXPECT_EQ(Stat("event_helper_restarts"), 0);
  ASSERT_EQ(::kill(before[0], SIGKILL), 0);
  std::vector<pid_t> after;
  for (int i = 0; i < 200; ++i) {
    after = HelperPids(daemon_.pid());
    if (after.size() == 1 && after[0] != before[0] && Stat("event_helper_restarts") >= 1) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(after.size(), 1u);
  EXPECT_NE(after[0], before[0]);
  EXPECT_EQ(Stat("event_helper_restarts"), 1);
  EXPECT_FALSE(ProcessExists(before[0])) << "the killed helper was reaped (no zombie)";
  // A subscriber that joins now replays, from seq 1, what the first helper
  // published (kvtierd re-sent it), then reads live batches: its replica ends
  // with the daemon's blocks. No batch was made while no helper ran, so no gap.
  Subscriber late(ctx_, Publish(), ReplayEndpoint());
  Join(late);
  Workload(22);
  ExpectReplicaMatches(late);
  EXPECT_EQ(Stat("event_batches_dropped"), 0);
  EXPECT_NE(daemon_.log().find("helper process (pid " + std::to_string(before[0]) + ") killed by signal 9"),
            std::string::npos)
      << daemon_.log();
}

// Big batches (one per tick, up to 100,000 events with their tokens) while the
// helper is stopped: the stream's buffer fills, frames are written in pieces
// at later ticks, and a subscriber still gets every batch whole and in order.
class BigBatchTest : public EventsTest {
 protected:
  BigBatchTest() : EventsTest(100000) {}
};

TEST_F(BigBatchTest, BatchesLargerThanTheStreamsBufferArriveWhole) {
  Subscriber sub(ctx_, Publish(), ReplayEndpoint());
  Join(sub);
  const std::vector<pid_t> helper = HelperPids(daemon_.pid());
  ASSERT_EQ(helper.size(), 1u);
  ASSERT_EQ(::kill(helper[0], SIGSTOP), 0);
  const double events_before = Stat("events");
  const auto until = Clock::now() + 20s;
  uint32_t seed = 100;
  // Well past what the socket holds (a stored event with 16 tokens is about 150 bytes).
  while (Stat("events") - events_before < 120000 && Clock::now() < until) Workload(seed++);
  ASSERT_EQ(::kill(helper[0], SIGCONT), 0);
  std::printf("%.0f events in %.0f batches made while the helper was stopped\n", Stat("events") - events_before,
              Stat("event_batches"));
  ExpectReplicaMatches(sub);
  EXPECT_EQ(Stat("event_batches_dropped"), 0);
  EXPECT_EQ(Stat("event_helper_restarts"), 0);
  EXPECT_EQ(HelperPids(daemon_.pid()), helper);
}

TEST_F(EventsHelperTest, NoHelperOutlivesKvtierd) {
  const std::vector<pid_t> helpers = HelperPids(daemon_.pid());
  ASSERT_EQ(helpers.size(), 1u);
  client_.reset();
  daemon_.Kill(SIGTERM);
  auto rc = daemon_.Wait(15s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0);
  EXPECT_FALSE(ProcessExists(helpers[0])) << "kvtierd stopped and reaped its helper";

  // Killed outright, kvtierd cannot stop it: the helper ends on its own (EOF, PR_SET_PDEATHSIG).
  ASSERT_TRUE(daemon_.Start().ok()) << daemon_.log();
  const std::vector<pid_t> second = HelperPids(daemon_.pid());
  ASSERT_EQ(second.size(), 1u);
  daemon_.Kill(SIGKILL);
  ASSERT_TRUE(daemon_.Wait(10s).ok());
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    // Its parent gone, it is init's (or a subreaper's) child to reap: "gone" is not running any more.
    std::ifstream stat("/proc/" + std::to_string(second[0]) + "/stat");
    std::string line;
    gone = !std::getline(stat, line) || line.find(") Z") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(gone) << "the helper of a killed kvtierd ended";
}

// ---- events.format: vllm ----

// The block hash the vllm format gives a key: its low word, the last 16 of the 32 hex digits.
uint64_t VllmHashOf(const std::string& key_hex) { return std::stoull(key_hex.substr(16), nullptr, 16); }

const char* MediumOf(const std::string& tier) { return tier == "gpu" ? "GPU" : tier == "host" ? "CPU" : "?"; }

// Replays vLLM KVEventBatch payloads ([ts, events, data_parallel_rank], each
// event a map tagged by `type`) into the block hashes per medium.
struct VllmReplica {
  std::map<std::string, std::set<uint64_t>> medium;
  std::map<uint64_t, std::vector<uint32_t>> tokens;  // Of each hash, from its BlockStored events.
  std::map<uint64_t, uint64_t> parent;               // Of each hash (0: none).
  uint64_t applied = 0;
  int stored = 0, removed = 0, cleared = 0;

  void Apply(uint64_t seq, const std::string& payload) {
    ASSERT_EQ(seq, applied + 1) << "batches are applied in order, none missing";
    applied = seq;
    msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& b = h.get();
    ASSERT_EQ(b.type, msgpack::type::ARRAY) << "KVEventBatch is array-like";
    ASSERT_EQ(b.via.array.size, 3u);
    EXPECT_EQ(b.via.array.ptr[0].type, msgpack::type::FLOAT64) << "ts";
    EXPECT_EQ(b.via.array.ptr[2].as<int>(), 0) << "data_parallel_rank";
    const msgpack::object& events = b.via.array.ptr[1];
    ASSERT_EQ(events.type, msgpack::type::ARRAY);
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      const msgpack::object& e = events.via.array.ptr[i];
      ASSERT_EQ(e.type, msgpack::type::MAP);
      const std::string type = Text(Field(e, "type"));
      if (type == "AllBlocksCleared") {
        medium.clear();
        ++cleared;
        continue;
      }
      const auto hashes = Field(e, "block_hashes").as<std::vector<uint64_t>>();
      ASSERT_EQ(hashes.size(), 1u);
      const std::string where = Text(Field(e, "medium"));
      EXPECT_TRUE(where == "GPU" || where == "CPU" || where == "STORAGE") << where;
      if (type == "BlockStored") {
        ++stored;
        EXPECT_TRUE(medium[where].insert(hashes[0]).second) << "stored twice in " << where;
        EXPECT_EQ(Field(e, "block_size").as<uint32_t>(), 16u);
        ASSERT_EQ(Field(e, "token_ids").type, msgpack::type::ARRAY) << "token_ids is always there";
        tokens[hashes[0]] = Field(e, "token_ids").as<std::vector<uint32_t>>();
        EXPECT_EQ(tokens[hashes[0]].size(), 16u);
        const msgpack::object& p = Field(e, "parent_block_hash");
        parent[hashes[0]] = p.type == msgpack::type::NIL ? 0 : p.as<uint64_t>();
        // Required by vLLM's BlockStored (no default): present, nil here.
        for (const char* k : {"lora_id", "lora_name"}) {
          bool present = false;
          for (uint32_t j = 0; j < e.via.map.size; ++j) present |= Text(e.via.map.ptr[j].key) == k;
          EXPECT_TRUE(present) << k;
        }
      } else if (type == "BlockRemoved") {
        ++removed;
        EXPECT_EQ(medium[where].erase(hashes[0]), 1u) << "removed from " << where << " before it was stored there";
      } else {
        ADD_FAILURE() << "unknown event type '" << type << "'";
      }
    }
  }
};

class VllmEventsTest : public EventsTest {
 protected:
  static constexpr const char* kTopic = "kv@host-a@tiny";
  VllmEventsTest() : EventsTest(64, std::string("  format: vllm\n  topic: \"") + kTopic + "\"\n") {}
  explicit VllmEventsTest(const std::string& config) : EventsTest(64, "", config) {}

  // vLLM's replay: [empty, start] in; [empty, topic, seq, batch] per batch kept, then [empty, "", 0xFF..FF, ""].
  std::vector<std::pair<uint64_t, std::string>> Replay(zmq::socket_t& dealer, uint64_t from) {
    std::vector<std::pair<uint64_t, std::string>> out;
    const std::string s8 = events::EncodeSeq(from);
    std::array<zmq::const_buffer, 2> req = {zmq::const_buffer(), zmq::buffer(s8)};
    EXPECT_TRUE(zmq::send_multipart(dealer, req));
    for (;;) {
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 5000ms) == 0) {
        ADD_FAILURE() << "no answer to the replay";
        return out;
      }
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(dealer, std::back_inserter(parts));
      EXPECT_EQ(parts.size(), 4u);
      if (parts.size() != 4) return out;
      EXPECT_EQ(parts[0].size(), 0u);
      const uint64_t seq = FromSeq8(parts[2]);
      if (seq == kReplayEnd) {
        EXPECT_EQ(parts[1].size(), 0u) << "the end marker's topic is empty";
        EXPECT_EQ(parts[3].size(), 0u);
        return out;
      }
      EXPECT_EQ(parts[1].to_string(), kTopic);
      out.emplace_back(seq, parts[3].to_string());
    }
  }
  // Per medium, the hashes of every session's blocks, as `cachectl session` prints them.
  std::map<std::string, std::set<uint64_t>> DaemonMedia() {
    std::map<std::string, std::set<uint64_t>> out;
    for (const auto& [key, tier] : DaemonBlocks()) out[MediumOf(tier)].insert(VllmHashOf(key));
    return out;
  }
};

TEST_F(VllmEventsTest, VllmFormatBatchesReplayIntoTheDaemonsBlocksPerMedium) {
  zmq::socket_t sub(ctx_, zmq::socket_type::sub), dealer(ctx_, zmq::socket_type::dealer);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, "kv@");
  sub.connect(Publish());
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(ReplayEndpoint());
  VllmReplica replica;
  // Joins through the replay, then reads live until a probe's batch arrives.
  for (auto& [seq, payload] : Replay(dealer, 1)) replica.Apply(seq, payload);
  ASSERT_EQ(replica.cleared, 1) << "the stream opens with AllBlocksCleared";
  auto read_one = [&](std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, timeout);
    if (!(item.revents & ZMQ_POLLIN)) return false;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(sub, std::back_inserter(parts));
    EXPECT_EQ(parts.size(), 3u) << "[topic, seq, batch]";
    if (parts.size() != 3) return true;
    EXPECT_EQ(parts[0].to_string(), kTopic);
    const uint64_t seq = FromSeq8(parts[1]);
    if (seq <= replica.applied) return true;
    if (seq > replica.applied + 1) {
      for (auto& [s, payload] : Replay(dealer, replica.applied + 1)) {
        if (s > replica.applied && s < seq) replica.Apply(s, payload);
      }
    }
    replica.Apply(seq, parts[2].to_string());
    return true;
  };
  bool joined = false;
  for (int i = 0; i < 100 && !joined; ++i) {
    Commit("probe-" + std::to_string(i), Tokens(9000 + i, 1));
    joined = read_one(100ms);
  }
  ASSERT_TRUE(joined) << "no live batch reached the subscriber";

  Workload(1);
  Workload(2);
  std::map<std::string, std::set<uint64_t>> daemon;
  for (int i = 0; i < 200; ++i) {  // Copies still landing move blocks: at most 10 s.
    const auto seq = static_cast<uint64_t>(Stat("event_seq"));
    const auto until = Clock::now() + 10s;
    while (replica.applied < seq && Clock::now() < until) read_one(100ms);
    ASSERT_GE(replica.applied, seq) << "batch " << seq << " never came";
    daemon = DaemonMedia();
    std::erase_if(replica.medium, [](const auto& m) { return m.second.empty(); });
    if (static_cast<uint64_t>(Stat("event_seq")) == seq && replica.medium == daemon) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(replica.medium, daemon);
  EXPECT_FALSE(daemon["GPU"].empty());
  EXPECT_FALSE(daemon["CPU"].empty()) << "the workload demoted blocks";
  EXPECT_GT(replica.removed, 0) << "moves and drops remove";
  // token_ids are there without events.token_ids, and parents chain by the same hashes.
  const std::vector<BlockKey> keys = client_->Keys(Tokens(106, 12));
  const auto first = Tokens(106, 1);
  EXPECT_EQ(replica.tokens[keys[0].lo], std::vector<uint32_t>(first.begin(), first.end()));
  EXPECT_EQ(replica.parent[keys[0].lo], 0u) << "block 0 has no parent";
  EXPECT_EQ(replica.parent[keys[1].lo], keys[0].lo);
  // Two events per move: the counter counts what was encoded (the opening
  // AllBlocksCleared aside, as in the kvtier format).
  EXPECT_EQ(Stat("events"), replica.stored + replica.removed);
  EXPECT_EQ(Stat("event_batches_dropped"), 0);
}

// ---- events.format: vllm with a disk store: the STORAGE medium ----

// The block hashes of the block files in `dir` (a file's name is its StoreKey:
// "<prefix><fingerprint>:<32 hex digits of the key>").
std::set<uint64_t> StoredHashes(const std::string& dir) {
  std::set<uint64_t> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || name.size() < 32) continue;
    out.insert(VllmHashOf(name.substr(name.size() - 32)));
  }
  return out;
}

// The block file in `dir` of the key whose vLLM hash is `hash`.
std::string FileOfHash(const std::string& dir, uint64_t hash) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(".") && name.size() >= 32 && VllmHashOf(name.substr(name.size() - 32)) == hash) {
      return e.path().string();
    }
  }
  return "";
}

std::string StorageDir() { return "/tmp/kvtier-storage-events-" + std::to_string(::getpid()); }

// 16 host slots (no watermark drops), a write-back disk tier of 9 records
// (8352 bytes each: 96 of header, 64 of tokens, 8192 of payload).
std::string StorageConfig() {
  std::string config = kSmallDaemonConfig;
  config.replace(config.find("host_blocks: 1024"), 17, "host_blocks: 16");
  return config + "tiering:\n  host_high_watermark: 1.0\n  host_low_watermark: 1.0\n" +
         "stores:\n  tiers:\n    - kind: disk\n      path: " + StorageDir() +
         "\n      max_bytes: 80KiB\n      write: back\n" + "events:\n  enabled: true\n  format: vllm\n  topic: \"" +
         "kv@host-a@tiny" + "\"\n";
}

class VllmStorageEventsTest : public VllmEventsTest {
 protected:
  VllmStorageEventsTest() : VllmEventsTest((std::filesystem::remove_all(StorageDir()), StorageConfig())) {}
  void TearDown() override {
    VllmEventsTest::TearDown();
    std::filesystem::remove_all(StorageDir());
  }

  // Reads live batches (filling gaps from the replay) until `seq` is applied.
  bool ReadUntil(uint64_t seq, std::chrono::milliseconds limit = 10s) {
    const auto until = Clock::now() + limit;
    while (replica_.applied < seq && Clock::now() < until) {
      zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 100ms);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(sub_, std::back_inserter(parts));
      if (parts.size() != 3) continue;
      const uint64_t got = FromSeq8(parts[1]);
      if (got <= replica_.applied) continue;
      if (got > replica_.applied + 1) {
        for (auto& [s, payload] : Replay(dealer_, replica_.applied + 1)) {
          if (s > replica_.applied && s < got) replica_.Apply(s, payload);
        }
      }
      replica_.Apply(got, parts[2].to_string());
    }
    return replica_.applied >= seq;
  }
  void Join() {
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::subscribe, "kv@");
    sub_.connect(Publish());
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect(ReplayEndpoint());
    for (auto& [seq, payload] : Replay(dealer_, 1)) replica_.Apply(seq, payload);
    const uint64_t start = replica_.applied;
    for (int i = 0; i < 100; ++i) {
      Commit("probe-" + std::to_string(i), Tokens(9000 + i, 1));
      if (ReadUntil(start + 1, 100ms)) return;
    }
    FAIL() << "no live batch reached the subscriber";
  }
  void CommitAndDemote(const std::string& session, const std::vector<TokenId>& tokens) {
    Commit(session, tokens);
    size_t demoted = 0;
    for (int i = 0; i < 500 && demoted < tokens.size() / 16; ++i) {
      auto d = client_->Demote(session);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      demoted += *d;
    }
  }
  // Per place `cachectl session` names ("gpu", "host", "disk"), the hashes of
  // every session's blocks; "nowhere": each session's first block no store
  // holds (those after it are nowhere a fetch reaches, whatever a store holds).
  std::map<std::string, std::set<uint64_t>> DaemonPlaces() {
    std::map<std::string, std::set<uint64_t>> out;
    const nlohmann::json list = Cachectl({"sessions"});
    for (const nlohmann::json& s : list["sessions"]) {
      const nlohmann::json info = Cachectl({"session", s["id"].get<std::string>()});
      bool lost = false;
      for (const nlohmann::json& b : info["chain"]) {
        const std::string place = b["tier"].get<std::string>();
        if (place == "nowhere" && std::exchange(lost, true)) continue;
        out[place].insert(VllmHashOf(b["key"].get<std::string>()));
      }
    }
    return out;
  }
  // Waits until the stream read so far says what kvtierd and the directory
  // say: GPU and CPU as the sessions' tiers, STORAGE as the block files there
  // (those the sessions place on "disk" among them, not the first each places "nowhere").
  void ExpectReplicaMatches() {
    std::map<std::string, std::set<uint64_t>> daemon;
    std::set<uint64_t> files;
    auto agree = [&] {
      auto medium = [&](const char* m) {
        auto it = replica_.medium.find(m);
        return it == replica_.medium.end() ? std::set<uint64_t>() : it->second;
      };
      const std::set<uint64_t> storage = medium("STORAGE");
      bool ok = medium("GPU") == daemon["gpu"] && medium("CPU") == daemon["host"] && storage == files;
      for (uint64_t h : daemon["disk"]) ok &= storage.count(h) == 1;
      for (uint64_t h : daemon["nowhere"]) ok &= storage.count(h) == 0;
      return ok;
    };
    for (int i = 0; i < 200; ++i) {
      const auto seq = static_cast<uint64_t>(Stat("event_seq"));
      ASSERT_TRUE(ReadUntil(seq)) << "batch " << seq << " never came";
      daemon = DaemonPlaces();  // Its locates may learn of blocks gone: read the stream again after.
      files = StoredHashes(StorageDir());
      if (static_cast<uint64_t>(Stat("event_seq")) == seq && agree()) break;
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_EQ(replica_.medium["STORAGE"], files);
    EXPECT_EQ(replica_.medium["GPU"], daemon["gpu"]);
    EXPECT_EQ(replica_.medium["CPU"], daemon["host"]);
    EXPECT_TRUE(agree()) << "the sessions' disk blocks are in STORAGE, their lost ones are not";
  }

  zmq::socket_t sub_{ctx_, zmq::socket_type::sub}, dealer_{ctx_, zmq::socket_type::dealer};
  VllmReplica replica_;
};

TEST_F(VllmStorageEventsTest, BlocksTheDiskTierWritesLosesAndEvictsComeAndGoInStorage) {
  Join();
  // a's 12 blocks demoted, then b's: the host tier's 16 slots drop 8 of a's, which the disk tier takes.
  const auto a = Tokens(1, 12), b = Tokens(2, 12), c = Tokens(3, 12);
  const std::vector<BlockKey> ka = client_->Keys(a);
  CommitAndDemote("a", a);
  CommitAndDemote("b", b);
  for (int i = 0; i < 200 && Stat("store.disk.put_blocks") < 8; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(Stat("store.disk.put_blocks"), 8) << "a's dropped blocks";
  ExpectReplicaMatches();
  EXPECT_EQ(replica_.medium["STORAGE"].size(), 8u);
  const int stored_once = replica_.stored;
  // What a router needs of a STORAGE block: its tokens and its parent, by the same hashes as GPU and CPU.
  const auto tail = Tokens(1, 12);
  EXPECT_EQ(replica_.tokens[ka[11].lo], std::vector<uint32_t>(tail.end() - 16, tail.end()));
  EXPECT_EQ(replica_.parent[ka[11].lo], ka[10].lo);

  // The first of a's blocks on disk lost behind kvtierd's back: the Acquire's fetch misses it.
  uint64_t first_on_disk = 0;
  size_t at = 0;
  for (; at < ka.size(); ++at) {
    if (replica_.medium["STORAGE"].count(ka[at].lo) != 0) {
      first_on_disk = ka[at].lo;
      break;
    }
  }
  ASSERT_NE(first_on_disk, 0u);
  ASSERT_TRUE(std::filesystem::remove(FileOfHash(StorageDir(), first_on_disk)));
  const int removed_before = replica_.removed;
  auto lease = client_->Acquire("a", a);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ(lease->size(), at) << "a's prefix from the local tiers, nothing past the lost block";
  ASSERT_TRUE(lease->Wait(10s).ok());
  EXPECT_TRUE(lease->Release().ok());
  ExpectReplicaMatches();
  EXPECT_EQ(replica_.medium["STORAGE"].count(first_on_disk), 0u) << "BlockRemoved in STORAGE";
  EXPECT_GT(replica_.removed, removed_before);

  // c's demotion drops more into a disk tier of 9 records: its evictions are removals too.
  CommitAndDemote("c", c);
  for (int i = 0; i < 200 && Stat("store.disk.evicted_files") == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GT(Stat("store.disk.evicted_files"), 0);
  ExpectReplicaMatches();
  EXPECT_GT(replica_.stored, stored_once);
  EXPECT_LE(replica_.medium["STORAGE"].size(), 9u);
  EXPECT_EQ(Stat("event_storage_dropped"), 0);
  EXPECT_EQ(Stat("event_storage_forgotten"), 0);
}

TEST(EventsOffTest, WithEventsOffNothingIsPublished) {
  DaemonProcess daemon(kSmallDaemonConfig);
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  struct stat st {};
  EXPECT_NE(::stat((daemon.socket() + ".events").c_str(), &st), 0) << "no event socket";
  auto ctl = Process::Spawn({CACHECTL_PATH, "--socket", daemon.socket(), "events", "--count", "1"});
  ASSERT_TRUE(ctl.ok());
  auto rc = ctl->Wait(10s);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 3) << "cachectl events says there is no stream";
}

TEST(EventsOffTest, EventSocketsGetTheDaemonSocketsMode) {
  DaemonProcess daemon(EventsConfig());
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  for (const char* suffix : {".events", ".replay"}) {
    struct stat st {};
    ASSERT_EQ(::stat((daemon.socket() + suffix).c_str(), &st), 0) << suffix;
    EXPECT_EQ(st.st_mode & 0777, 0660u) << suffix << ": access.mode's default";
  }
  daemon.Kill(SIGTERM);
  ASSERT_TRUE(daemon.Wait(10s).ok());
  struct stat st {};
  EXPECT_NE(::stat((daemon.socket() + ".events").c_str(), &st), 0) << "removed at exit";
}

}  // namespace
}  // namespace kvtier::testing
