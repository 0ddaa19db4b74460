// cachectl events: subscribes to kvtierd's KV events and prints them; a gap in
// sequence numbers is filled from kvtierd's replay (docs/events.md).
#include <sys/stat.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "commands.h"
#include "kvtier/event_stream.h"

namespace kvtier::cachectl {
namespace {

using json = nlohmann::json;
using events::kReplayEnd;

std::string Hex(const char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(p[i]);
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

// A msgpack value as JSON; binary (the block keys) as hex.
json ToJson(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL:
      return nullptr;
    case msgpack::type::BOOLEAN:
      return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER:
      return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER:
      return o.via.i64;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      return o.via.f64;
    case msgpack::type::STR:
      return std::string(o.via.str.ptr, o.via.str.size);
    case msgpack::type::BIN:
      return Hex(o.via.bin.ptr, o.via.bin.size);
    case msgpack::type::ARRAY: {
      json a = json::array();
      for (uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(ToJson(o.via.array.ptr[i]));
      return a;
    }
    case msgpack::type::MAP: {
      json m = json::object();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const msgpack::object& k = o.via.map.ptr[i].key;
        const std::string key = k.type == msgpack::type::STR ? std::string(k.via.str.ptr, k.via.str.size) : "?";
        m[key] = ToJson(o.via.map.ptr[i].val);
      }
      return m;
    }
    default:
      return "?";
  }
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string("-");
}

void PrintBatch(const json& b, bool as_json) {
  if (as_json) {
    std::printf("%s\n", b.dump().c_str());
    std::fflush(stdout);
    return;
  }
  const uint64_t seq = b.value("seq", uint64_t{0});
  for (const json& e : b.value("events", json::array())) {
    const std::string type = Str(e, "type");
    std::string line = "seq " + std::to_string(seq) + "  " + type;
    if (type == "stored") {
      line += "  " + Str(e, "tier") + "  " + Str(e, "key") + "  parent " +
              (e.contains("parent") && e["parent"].is_string() ? e["parent"].get<std::string>() : std::string("-"));
      if (e.contains("tokens")) line += "  (" + std::to_string(e["tokens"].size()) + " tokens)";
    } else if (type == "moved") {
      line += "  " + Str(e, "from") + " -> " + Str(e, "to") + "  " + Str(e, "key");
    } else if (type == "removed") {
      line += "  " + Str(e, "tier") + "  " + Str(e, "key");
    } else if (type == "session_evicted") {
      line += "  tenant '" + Str(e, "tenant") + "'  session '" + Str(e, "session") + "'";
    } else if (type == "cleared") {
      line += "  instance " + Str(b, "instance") + " (forget what it published before)";
    }
    if (e.contains("profile")) line += "  profile " + Str(e, "profile");
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int CmdEvents(const GlobalOptions& g, const EventsArgs& a) {
  const std::string publish = a.publish.empty() ? events::DefaultPublishEndpoint(g.socket) : a.publish;
  const std::string replay = a.replay.empty() ? events::DefaultReplayEndpoint(g.socket) : a.replay;
  for (const std::string& ep : {publish, replay}) {
    struct stat st {};
    if (ep.starts_with("ipc://") && ::stat(ep.c_str() + 6, &st) != 0) {
      std::fprintf(stderr,
                   "cachectl: events: no event stream at %s: is kvtierd running with events.enabled (or does "
                   "events.publish/replay name another endpoint: --publish, --replay)?\n",
                   ep.c_str());
      return kExitUnavailable;
    }
  }
  std::optional<std::chrono::milliseconds> idle_exit;
  if (!a.idle_exit.empty()) {
    auto d = ParseDuration(a.idle_exit);
    if (!d.ok()) return Usage("--idle-exit: " + d.status().message());
    idle_exit = *d;
  }
  try {
    zmq::context_t ctx(1);
    // Subscribed before any replay, so nothing published meanwhile is missed.
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, a.topic);
    sub.connect(publish);
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(replay);

    uint64_t last = 0;  // The last seq printed.
    uint64_t printed = 0;
    auto done = [&] { return a.count > 0 && printed >= a.count; };
    auto show = [&](uint64_t seq, const zmq::message_t& payload) {
      if (seq <= last && last != 0) return;  // Seen already (replayed, then live).
      json b;
      try {
        msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
        b = ToJson(h.get());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "cachectl: events: batch %" PRIu64 " does not decode: %s\n", seq, e.what());
        return;
      }
      if (seq > last + 1 && last != 0) {
        std::fprintf(stderr, "cachectl: events: batches %" PRIu64 "..%" PRIu64 " are lost (not kept for replay)\n",
                     last + 1, seq - 1);
      }
      last = seq;
      ++printed;
      PrintBatch(b, g.json);
    };
    // Asks for the batches from `from` on, and prints them; false if kvtierd did not answer.
    auto replay_from = [&](uint64_t from) {
      const std::string s8 = events::EncodeSeq(from);
      std::array<zmq::const_buffer, 2> req = {zmq::const_buffer(), zmq::buffer(s8)};
      if (!zmq::send_multipart(dealer, req)) return false;
      for (;;) {
        zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(g.timeout_ms * 5)) == 0) return false;
        std::vector<zmq::message_t> parts;
        (void)zmq::recv_multipart(dealer, std::back_inserter(parts));
        if (parts.size() != 3) continue;
        const uint64_t seq = events::DecodeSeq(parts[1].data(), parts[1].size());
        if (seq == kReplayEnd) return true;
        if (!done()) show(seq, parts[2]);
      }
    };
    if (a.from > 0 && !replay_from(a.from)) {
      std::fprintf(stderr, "cachectl: events: %s did not answer the replay\n", replay.c_str());
      return kExitUnavailable;
    }
    auto idle_since = std::chrono::steady_clock::now();
    while (!done()) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) {
        if (idle_exit && std::chrono::steady_clock::now() - idle_since >= *idle_exit) break;
        continue;
      }
      idle_since = std::chrono::steady_clock::now();
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(sub, std::back_inserter(parts));
      if (parts.size() != 3) continue;
      const uint64_t seq = events::DecodeSeq(parts[1].data(), parts[1].size());
      // A gap (this subscriber fell behind and its messages were dropped): filled from the replay.
      if (last != 0 && seq > last + 1 && !replay_from(last + 1)) {
        std::fprintf(stderr, "cachectl: events: %s did not answer the replay\n", replay.c_str());
      }
      if (!done()) show(seq, parts[2]);
    }
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "cachectl: events: %s\n", e.what());
    return kExitError;
  }
  return kExitOk;
}

}  // namespace kvtier::cachectl
