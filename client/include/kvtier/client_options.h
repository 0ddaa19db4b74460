// ClientOptions: how a kvtier::Client connects (kvtier/client.h). Its own
// header so that the client library's transport and connection need not
// include the whole public API for it; client.h includes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "kvtier/block_key.h"

namespace kvtier {

struct ClientOptions {
  std::string socket_path = "/run/kvtier/kvtierd.sock";
  std::string client_name;  // Shown by cachectl; default: this program's name.
  std::string tenant;       // Blocks are shared only within a tenant.
  std::string profile;      // Model profile name; empty: the daemon's default.
  // The model's identity (a digest of its weights and tokenizer; see
  // ModelIdentity in kvtier/model_identity.h): blocks are shared only between
  // clients that give the same one. Null: none (keys depend on the profile's
  // geometry and the tenant alone, so models of equal geometry would share).
  ModelId model;
  std::chrono::milliseconds connect_timeout{2000};   // Per (re)connect, retries included.
  // Longest wait for one send or reply; 0 or less is 1 ms, never "no limit".
  // A request kvtierd did not answer in time fails with kTimeout and is not
  // resent (the connection is dropped; the next call makes it again); one
  // whose connection broke is resent once.
  std::chrono::milliseconds request_timeout{10000};
  bool reconnect = true;    // Reconnect at the next call after losing the daemon.
  // A request sent within this long of the previous reply polls for its reply
  // this long before sleeping (kvtierd is still awake then: its busy_poll_us);
  // zero: always sleep. Costs at most this much CPU per such request.
  std::chrono::microseconds reply_spin{50};
  // The uid kvtierd must run as; the process on the other end of the socket is
  // checked (SO_PEERCRED) at every connect and refused (kPermissionDenied) if
  // it runs as anyone else (root excepted). Unset: $KVTIER_SERVER_UID if set,
  // else the socket file's owner, trusted only in a directory nobody else may
  // write (a socket in /tmp could be anyone's: set this, or use a directory
  // kvtierd's user owns, such as /run/kvtier).
  std::optional<uint32_t> server_uid;
  // Map the GPU tier. On the cuda backend that loads the driver, creates the
  // device's primary context (hundreds of MiB of GPU memory) and opens the pool
  // and the promotion events through CUDA IPC. A client that never touches KV
  // bytes (cachectl, monitoring) sets it false: then Allocate is refused
  // (kFailedPrecondition), a leased GPU-tier block's BlockRef::data is null,
  // WaitOnStream waits on the CPU, and everything else works as before.
  bool open_gpu = true;
  // Map the host backend's pools into this process's page tables after each
  // connect, on a thread of their own, so that no later read or write of a slot
  // takes a page fault (a 6 MiB slot is ~1,500 pages). For a worker that loads
  // and saves for a long time (a vLLM engine); a pool kvtierd did not fault in
  // whole (its prefault: false) is left alone, since mapping its pages would
  // take the memory. Costs a moment of one core per GiB at each connect.
  bool prefault_pools = false;
};

}  // namespace kvtier
