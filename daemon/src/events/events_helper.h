// The KV events helper: a child process of kvtierd that owns the events'
// ZMQ sockets (PUB and ROUTER), so that what a peer does to them cannot stop
// the daemon.
//
// Why a process: libzmq aborts the whole process when its listener's accept()
// fails with EMFILE, and any member of the socket's group can open plain
// connections to an ipc:// endpoint until it does. In a child, that abort ends
// the child; kvtierd notices, counts it (event_helper_restarts) and starts
// another (events_link.h).
//
// kvtierd starts it by spawning its own executable (/proc/self/exe, never a
// fork of the multithreaded daemon) as `kvtierd --events-helper FD SHM PPID`:
// FD is one end of a SOCK_STREAM socketpair, SHM a memfd holding the
// counters the helper keeps (HelperCounters), PPID kvtierd's pid. The stream
// carries, daemon to helper, frames of a 24-byte header (FrameHeader) and a
// body: first the configuration (kConfig), then batches. Helper to daemon it
// carries one line: "OK\n" once both sockets are bound, or "ERR <why>\n"
// before the helper exits. A stream, not SOCK_SEQPACKET: a batch can be far
// larger than a socket's send buffer (net.core.wmem_max caps SO_SNDBUF for an
// unprivileged process), and a datagram larger than that is refused whole
// (EMSGSIZE); on a stream kvtierd writes what fits and the rest at its next
// tick.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "kvtier/status.h"

namespace kvtier::daemon {

// What the helper needs to know, sent as the first frame.
struct HelperConfig {
  std::string publish, replay;  // ZMQ endpoints.
  std::string topic;
  bool vllm = false;              // events.format: vllm (replay answers carry the topic).
  std::string group;                 // Its name, for messages.
  uint32_t group_gid = 0xffffffffu;  // An ipc socket file's group (AccessConfig::kNoGroup: leave it).
  uint32_t mode = 0660;              // And its mode.
  uint32_t replay_batches = 0;       // Batches kept for replays.
  uint32_t queue_batches = 0;        // The PUB socket's high-water mark.

  std::string Encode() const;
  static Result<HelperConfig> Decode(const std::string& bytes);
};

enum class FrameKind : uint8_t {
  kConfig = 1,   // Body: HelperConfig::Encode().
  kPublish = 2,  // Body: an encoded batch; published on PUB and kept for replays.
  kKeep = 3,     // Body: an encoded batch; kept for replays only (re-sent after a restart).
};

// Native byte order: both ends are the same executable on the same host.
struct FrameHeader {
  uint64_t size = 0;  // Of the body.
  uint64_t seq = 0;   // The batch's sequence number (0 for kConfig).
  uint8_t kind = 0;   // FrameKind.
  uint8_t pad[7] = {};
};
static_assert(sizeof(FrameHeader) == 24);

// A body larger than this is refused by both ends: kvtierd drops (and
// counts) such a batch, the helper exits on one (a corrupt stream).
inline constexpr uint64_t kMaxFrameBody = uint64_t{1} << 32;

// In the memfd both processes map: what only the helper can count. It adds
// to them, so they run on across restarts. Lock-free atomics work across
// processes on one mapping.
struct HelperCounters {
  std::atomic<uint64_t> replays{0};
  std::atomic<uint64_t> replays_refused{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// The hidden first argument that makes kvtierd the helper.
inline constexpr const char* kEventsHelperArg = "--events-helper";

// The helper's main: argv is kvtierd's (argv[1] == kEventsHelperArg). Returns
// the exit code: 0 at EOF from kvtierd, 1 on an error (told to kvtierd first
// when it can be).
int RunEventsHelper(int argc, char** argv);

}  // namespace kvtier::daemon
