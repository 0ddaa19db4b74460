// kvtier-bench events: what publishing KV events costs a kvtierd.
//
// Two real kvtierd processes, one with events off and one with events on (a
// live subscriber draining the stream, as a router would), serve the same
// client workload: sessions committed, acquired (promoted) and demoted, with
// both tiers full enough that blocks are dropped. Rounds alternate which
// daemon goes first; the figure is the median of per-round time ratios
// (on / off) with a bootstrap 95% interval.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench_commands.h"
#include "bench_util.h"
#include "daemon_config.h"
#include "kvtier/client.h"
#include "kvtier/event_stream.h"
#include "process.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kBlocksPerSession = 8;

std::string Config(bool events) {
  std::string c = testing::kSmallDaemonConfig;
  c.replace(c.find("host_blocks: 1024"), 17, "host_blocks: 512");
  return events ? c + "events:\n  enabled: true\n  token_ids: true\n" : c;
}

std::unique_ptr<Client> Connect(const std::string& socket) {
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "events-bench";
  o.reconnect = false;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "kvtier-bench events: %s\n", c.status().ToString().c_str());
    return nullptr;
  }
  return std::move(c).value();
}

// One round: `sessions` sessions committed, acquired, every fourth demoted,
// then all evicted. Returns seconds, or a negative number on an error.
double Round(Client& c, uint32_t round, uint32_t sessions) {
  const auto t0 = Clock::now();
  std::vector<TokenId> tokens(kBlocksPerSession * c.block_tokens());
  for (uint32_t s = 0; s < sessions; ++s) {
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>((round * 100003 + s) * 131 + i);
    const std::string id = "r" + std::to_string(round) + "-" + std::to_string(s);
    auto w = c.Allocate(kBlocksPerSession);
    if (!w.ok()) return -1;
    if (!c.Commit(*w, id, BlockKey{}, 0, tokens).ok()) return -1;
    if (s % 4 == 0 && !c.Demote(id).ok()) return -1;
    auto lease = c.Acquire(id, tokens);
    if (!lease.ok() || !lease->Wait(std::chrono::seconds(10)).ok()) return -1;
  }
  for (uint32_t s = 0; s < sessions; ++s) (void)c.Evict("r" + std::to_string(round) + "-" + std::to_string(s));
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int RunEventsBench(int argc, char** argv) {
  uint32_t rounds = 31, sessions = 1000;
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      rounds = 3;
      sessions = 40;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf(
          "usage: kvtier-bench events [--quick]\n\n"
          "The same client workload (commit, acquire, demote, evict) against a kvtierd with\n"
          "KV events off and one with them on and a live subscriber, in alternating rounds:\n"
          "the median per-round time ratio on/off with a 95%% bootstrap interval.\n");
      return 0;
    } else {
      std::fprintf(stderr, "kvtier-bench events: unknown option '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  testing::DaemonProcess off(Config(false)), on(Config(true));
  for (auto* d : {&off, &on}) {
    if (Status st = d->Start(); !st.ok()) {
      std::fprintf(stderr, "kvtier-bench events: kvtierd did not start: %s\n%s", st.ToString().c_str(),
                   d->log().c_str());
      return 1;
    }
  }
  // A subscriber draining the stream on its own thread, as a router would.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  zmq::context_t ctx(1);
  std::thread subscriber([&] {
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, "");
    sub.connect(events::DefaultPublishEndpoint(on.socket()));
    while (!stop.load()) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(sub, std::back_inserter(parts));
      received.fetch_add(1);
    }
  });
  auto c_off = Connect(off.socket());
  auto c_on = Connect(on.socket());
  int rc = 0;
  std::vector<double> t_off, t_on;
  if (!c_off || !c_on) {
    rc = 1;
  } else {
    Progress("events: %u rounds of %u sessions (%u blocks each), alternating which kvtierd goes first\n", rounds,
             sessions, kBlocksPerSession);
    (void)Round(*c_off, 1000, sessions / 4);  // Warm-up, not counted.
    (void)Round(*c_on, 1000, sessions / 4);
    for (uint32_t r = 0; r < rounds && rc == 0; ++r) {
      double a = 0, b = 0;
      if (r % 2 == 0) {
        a = Round(*c_off, r, sessions);
        b = Round(*c_on, r, sessions);
      } else {
        b = Round(*c_on, r, sessions);
        a = Round(*c_off, r, sessions);
      }
      if (a <= 0 || b <= 0) {
        std::fprintf(stderr, "kvtier-bench events: a request failed in round %u\n", r);
        rc = 1;
        break;
      }
      t_off.push_back(a);
      t_on.push_back(b);
      Progress("  round %2u: off %.3f s, on %.3f s (%.3f)\n", r, a, b, b / a);
    }
  }
  double events = 0, batches = 0;
  if (c_on) {
    if (auto s = c_on->Stats(); s.ok()) {
      for (const auto& [k, v] : *s) {
        if (k == "events") events = v;
        if (k == "event_batches") batches = v;
      }
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop.store(true);
  subscriber.join();
  c_off.reset();
  c_on.reset();
  if (rc != 0) return rc;
  const Interval ratio = PairedMedianRatio(t_on, t_off, 42);
  const MachineInfo m = ReadMachineInfo();
  Progress("events on / off: %.3f [%.3f, %.3f] of the workload's time; %.0f events in %.0f batches, %llu received\n",
           ratio.value, ratio.lo, ratio.hi, events, batches, static_cast<unsigned long long>(received.load()));
  JsonObject j;
  j.Add("time_ratio_on_off", ratio, 3)
      .Add("off_s_median", Median(t_off), 4)
      .Add("on_s_median", Median(t_on), 4)
      .Add("events", static_cast<uint64_t>(events))
      .Add("batches", static_cast<uint64_t>(batches))
      .Add("batches_received", received.load())
      .Add("rounds", static_cast<uint64_t>(rounds))
      .Add("machine", m.cpu_model + ", " + std::to_string(m.cores) + " cores");
  std::printf("%s\n", j.ToString().c_str());
  return 0;
}

}  // namespace kvtier::bench
