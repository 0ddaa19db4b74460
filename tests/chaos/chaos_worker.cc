// chaos_worker: one model-worker-like process for the chaos and soak tests. It
// links libkvtier only and runs random operations on its own conversations
// until SIGTERM (or --seconds), riding out daemon restarts:
//
//   chaos_worker --socket PATH --seed S --worker I [--incarnation K] [--seconds N]
//
// S picks the token streams (shared by every incarnation of worker I); the
// operation sequence follows from S, I and K, the driver's respawn count.
// Operations: probe the shared index; acquire a prefix (with or without a
// session) and verify every leased block's payload; a chat turn (acquire under
// the session, verify, allocate, write, commit); allocate, write and abandon;
// hold a lease across later operations; demote/prefetch/evict its own sessions.
// Payloads are a function of the block key (tests/support/payload.h).
//
// Every failed call is classified. Documented, allowed errors (counted):
//   unavailable, timeout     the daemon is gone or restarting; the next call reconnects
//   resource_exhausted       the gpu tier or this client's lease limit is full
//   failed_precondition      a commit continues a session that lost blocks meanwhile
//                            (dropped under pressure, evicted, or a new daemon)
//   not_found                demote/prefetch/evict of a session the daemon no longer has
// Anything else, or a block whose bytes do not verify, ends the worker:
// exit 3 (undocumented error) or 4 (corrupt payload), with a JSON line saying why.
//
// stdout, one JSON object per line:
//   {"event":"instance","worker":I,"instance":ID,"t_ns":T}  first success on a daemon instance
//                                                          (T: CLOCK_MONOTONIC, comparable across processes)
//   {"event":"done",...counters...}                        at a clean stop
//   {"event":"fatal",...}                                  before exit 3/4
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chaos_common.h"
#include "kvtier/client.h"
#include "payload.h"

using namespace kvtier;

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Hex(const std::byte* p, size_t n) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned>(p[i]));
    out += buf;
  }
  return out;
}

enum class Op { kProbe, kRead, kTurn, kAbandon, kHold, kDemote, kPrefetch, kEvict };

const char* OpName(Op op) {
  switch (op) {
    case Op::kProbe: return "probe";
    case Op::kRead: return "read";
    case Op::kTurn: return "turn";
    case Op::kAbandon: return "abandon";
    case Op::kHold: return "hold";
    case Op::kDemote: return "demote";
    case Op::kPrefetch: return "prefetch";
    case Op::kEvict: return "evict";
  }
  return "?";
}

// The errors an operation may end with in normal operation (see the header).
bool Allowed(Op op, StatusCode code) {
  switch (code) {
    case StatusCode::kUnavailable:
    case StatusCode::kTimeout:
    case StatusCode::kResourceExhausted:
      return true;
    case StatusCode::kFailedPrecondition:
      return op == Op::kTurn;
    case StatusCode::kNotFound:
      return op == Op::kDemote || op == Op::kPrefetch || op == Op::kEvict;
    default:
      return false;
  }
}

class Worker {
 public:
  Worker(std::string socket, uint64_t seed, uint32_t index, uint64_t incarnation)
      : socket_(std::move(socket)),
        seed_(seed),
        index_(index),
        rng_(testing::Mix64(seed ^ testing::Mix64((uint64_t{index} << 32) + incarnation + 1))) {}

  int Run(double seconds) {
    const auto until = seconds > 0 ? std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds)
                                   : std::chrono::steady_clock::time_point::max();
    while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
      if (client_ == nullptr) {
        ClientOptions o;
        o.socket_path = socket_;
        o.client_name = "chaos-worker-" + std::to_string(index_);
        o.connect_timeout = std::chrono::milliseconds(500);
        auto c = Client::Connect(o);
        if (!c.ok()) {
          if (const int rc = Check(Op::kProbe, c.status()); rc != 0) return rc;
          continue;
        }
        client_ = std::move(c).value();
        bt_ = client_->block_tokens();
        for (uint32_t conv = 0; conv < chaos::kConversations; ++conv) {
          tokens_[conv] = chaos::ConversationTokens(seed_, index_, conv, bt_);
        }
      }
      const Op op = Pick();
      const Status st = Do(op);
      ++ops_[OpName(op)];
      if (!st.ok()) {
        if (const int rc = Check(op, st); rc != 0) return rc;
        continue;
      }
      if (client_->instance_id() != instance_) {
        instance_ = client_->instance_id();
        std::printf("{\"event\":\"instance\",\"worker\":%u,\"instance\":%llu,\"t_ns\":%lld}\n", index_,
                    static_cast<unsigned long long>(instance_), static_cast<long long>(NowNs()));
        std::fflush(stdout);
      }
    }
    held_.clear();
    std::string counters;
    uint64_t total = 0;
    for (const auto& [name, n] : ops_) {
      counters += ",\"" + name + "\":" + std::to_string(n);
      total += n;
    }
    for (const auto& [name, n] : errors_) counters += ",\"err_" + name + "\":" + std::to_string(n);
    std::printf("{\"event\":\"done\",\"worker\":%u,\"ops\":%llu,\"verified_blocks\":%llu,\"committed_blocks\":%llu%s}\n",
                index_, static_cast<unsigned long long>(total), static_cast<unsigned long long>(verified_),
                static_cast<unsigned long long>(committed_), counters.c_str());
    std::fflush(stdout);
    return 0;
  }

 private:
  Op Pick() {
    const uint32_t r = rng_() % 100;
    if (r < 15) return Op::kProbe;
    if (r < 35) return Op::kRead;
    if (r < 70) return Op::kTurn;
    if (r < 76) return Op::kAbandon;
    if (r < 84) return Op::kHold;
    if (r < 89) return Op::kDemote;
    if (r < 94) return Op::kPrefetch;
    return Op::kEvict;
  }

  int Check(Op op, const Status& st) {
    if (Allowed(op, st.code())) {
      ++errors_[std::string(StatusCodeName(st.code()))];
      if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kTimeout) {
        held_.clear();  // Leases of a dead daemon are worthless.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      return 0;
    }
    return Fatal(3, std::string("undocumented error in ") + OpName(op) + ": " + st.ToString());
  }

  int Fatal(int rc, const std::string& why) {
    std::string escaped;
    for (char ch : why) {
      if (ch == '"' || ch == '\\') escaped += '\\';
      escaped += (ch == '\n' ? ' ' : ch);
    }
    std::printf("{\"event\":\"fatal\",\"worker\":%u,\"rc\":%d,\"error\":\"%s\"}\n", index_, rc, escaped.c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "chaos_worker %u: %s\n", index_, why.c_str());
    std::exit(rc);
  }

  // A random prefix of a random conversation, in whole blocks.
  std::span<const TokenId> Prefix(uint32_t conv, uint32_t blocks) const {
    return std::span<const TokenId>(tokens_.at(conv)).first(size_t{blocks} * bt_);
  }

  // Waits for a lease's promotions in short steps, checking between them that the
  // daemon is still the one that made the lease (a killed daemon never completes
  // its fences; a real worker would not wait out a long timeout either).
  Status WaitLease(const Lease& lease) {
    const uint64_t instance = client_->instance_id();
    for (int i = 0; i < 100; ++i) {
      const Status st = lease.Wait(std::chrono::milliseconds(50));
      if (st.code() != StatusCode::kTimeout) return st;
      KVTIER_RETURN_IF_ERROR(client_->Ping().status());
      if (client_->instance_id() != instance) return Unavailable("the daemon restarted while a lease waited");
    }
    return Internal("promoted blocks did not land within 5 s on a live daemon");
  }

  Status Verify(const Lease& lease, std::span<const TokenId> tokens) {
    KVTIER_RETURN_IF_ERROR(WaitLease(lease));
    const std::vector<BlockKey> keys = client_->Keys(tokens);
    if (lease.size() > keys.size() || lease.matched() < lease.size()) {
      Fatal(3, "lease of " + std::to_string(lease.size()) + " blocks (matched " + std::to_string(lease.matched()) +
                   ") for a prompt of " + std::to_string(keys.size()));
    }
    for (size_t i = 0; i < lease.size(); ++i) {
      if (!testing::PayloadIntact(keys[i], lease.block(i).data, lease.slot_bytes())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const bool later = testing::PayloadIntact(keys[i], lease.block(i).data, lease.slot_bytes());
        Fatal(4, std::string(OpName(op_)) + ": block " + std::to_string(i) + " of " + std::to_string(lease.size()) +
                     " (" + keys[i].ToHex() + ") in " + TierName(lease.block(i).tier) + " slot " +
                     std::to_string(lease.block(i).slot) + " does not hold its payload (promoted " +
                     std::to_string(lease.promoted()) + ", fence seq " + std::to_string(lease.fence().seq) +
                     (later ? "; it does 50 ms later" : "; nor 50 ms later") + "; starts " +
                     Hex(lease.block(i).data, 16) + ")");
      }
      ++verified_;
    }
    return Status::Ok();
  }

  Status Do(Op op) {
    op_ = op;
    Client& c = *client_;
    const uint32_t conv = static_cast<uint32_t>(rng_() % chaos::kConversations);
    const uint32_t blocks = 1 + static_cast<uint32_t>(rng_() % chaos::kMaxBlocks);
    const std::string session = chaos::SessionName(index_, conv);
    const auto tokens = Prefix(conv, blocks);
    switch (op) {
      case Op::kProbe: {
        std::vector<Tier> tiers(blocks);
        const size_t n = c.Probe(tokens, tiers);
        if (n > blocks) Fatal(3, "probe found " + std::to_string(n) + " of " + std::to_string(blocks) + " blocks");
        for (size_t i = 0; i < n; ++i) {
          if (tiers[i] != Tier::kGpu && tiers[i] != Tier::kHost) Fatal(3, "probe reports a bad tier");
        }
        return Status::Ok();
      }
      case Op::kRead:
      case Op::kHold: {
        static constexpr Promote kModes[] = {Promote::kNow, Promote::kNow, Promote::kNo, Promote::kAfterRead};
        auto lease = c.Acquire(rng_() % 2 ? session : std::string(), tokens, kModes[rng_() % 4]);
        if (!lease.ok()) return lease.status();
        // Without promotion now, a host-tier block is read where it lies.
        KVTIER_RETURN_IF_ERROR(Verify(*lease, tokens));
        if (op == Op::kHold) {
          held_.push_back(std::move(*lease));
          if (held_.size() > 3) held_.erase(held_.begin() + static_cast<long>(rng_() % held_.size()));
          return Status::Ok();
        }
        return lease->Release();
      }
      case Op::kTurn: {
        auto lease = c.Acquire(session, tokens);
        if (!lease.ok()) return lease.status();
        KVTIER_RETURN_IF_ERROR(Verify(*lease, tokens));
        const uint32_t have = static_cast<uint32_t>(lease->size());
        if (have >= blocks) return Status::Ok();
        const uint32_t fresh = blocks - have;
        auto w = c.Allocate(fresh);
        if (!w.ok()) return w.status();
        const std::vector<BlockKey> keys = c.Keys(tokens);
        for (uint32_t i = 0; i < fresh; ++i) testing::FillPayload(keys[have + i], w->data(i), w->slot_bytes());
        auto res = c.Commit(*w, session, have == 0 ? BlockKey{} : keys[have - 1], have, tokens.subspan(size_t{have} * bt_));
        if (!res.ok()) return res.status();
        if (res->stored + res->duplicates != fresh) {
          Fatal(3, "commit of " + std::to_string(fresh) + " blocks stored " + std::to_string(res->stored) + " + " +
                       std::to_string(res->duplicates) + " duplicates");
        }
        committed_ += res->stored;
        return Status::Ok();
      }
      case Op::kAbandon: {
        auto w = c.Allocate(1 + static_cast<uint32_t>(rng_() % 4));
        if (!w.ok()) return w.status();
        // Garbage that must never be seen as a block.
        for (size_t i = 0; i < w->size(); ++i) std::memset(w->data(i), 0xA5, w->slot_bytes());
        return rng_() % 2 ? w->Release() : Status::Ok();  // Or let the destructor give the slots back.
      }
      case Op::kDemote: return c.Demote(session).status();
      case Op::kPrefetch: return c.Prefetch(session).status();
      case Op::kEvict: return c.Evict(session).status();
    }
    return Status::Ok();
  }

  std::string socket_;
  uint64_t seed_;
  uint32_t index_;
  std::mt19937_64 rng_;
  std::unique_ptr<Client> client_;
  uint32_t bt_ = 0;
  uint64_t instance_ = 0;
  std::map<uint32_t, std::vector<TokenId>> tokens_;
  std::vector<Lease> held_;
  std::map<std::string, uint64_t> ops_, errors_;
  uint64_t verified_ = 0, committed_ = 0;
  Op op_ = Op::kProbe;
};

}  // namespace

int main(int argc, char** argv) {
  // Die with the driver, whatever happens to it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string socket;
  uint64_t seed = 0;
  uint32_t index = 0;
  uint64_t incarnation = 0;
  double seconds = 0;
  bool have_seed = false, have_index = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) break;
    if (a == "--socket") socket = v;
    else if (a == "--seed") seed = std::strtoull(v, nullptr, 10), have_seed = true;
    else if (a == "--worker") index = static_cast<uint32_t>(std::strtoul(v, nullptr, 10)), have_index = true;
    else if (a == "--incarnation") incarnation = std::strtoull(v, nullptr, 10);
    else if (a == "--seconds") seconds = std::atof(v);
    else break;
    ++i;
  }
  if (socket.empty() || !have_seed || !have_index || argc % 2 == 0) {
    std::fprintf(stderr, "usage: chaos_worker --socket PATH --seed S --worker I [--incarnation K] [--seconds N]\n");
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return Worker(socket, seed, index, incarnation).Run(seconds);
}
