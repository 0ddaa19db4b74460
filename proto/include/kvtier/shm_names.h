// The names of everything a kvtierd instance labels in shared memory and puts
// beside its socket. Every part of kvtier that creates, opens or removes one
// builds its name here, so that the daemon, the backends, warm restart and
// operators' tools agree (docs/operating.md, "Warm restart", lists them for operators).
//
// Labels of nameless (memfd) segments, passed to clients as descriptors:
//   <instance>.fences             copy fences, one per instance (the backend)
//   <instance>.<profile>.gpu      a profile's GPU-tier pool (host backend; CUDA memory on the cuda backend)
//   <instance>.<profile>.host     a profile's host-tier pool
//   <instance>.<profile>.index    a profile's block index
// Named, in /dev/shm, owner-only, only with warm restart:
//   /<instance>.<profile>.host     the host-tier pool kept across runs
//   /<instance>.<profile>.warm     its manifest; ".tmp" while it is written
// An isolated tenant's engine (pools, index, manifest of its own) puts
// <profile>.<tenant> where these have <profile> (Domain); profile names hold no
// '.', so no name of one domain is another's.
//   /dev/shm/<instance>.lock       the instance lock; <socket>.lock the socket's (always)
//
// Segment names are POSIX shared-memory names: one leading '/', no other.
#pragma once

#include <string>
#include <string_view>

#include "kvtier/tier.h"

namespace kvtier::shm_names {

// Where Linux keeps POSIX shared-memory objects as files.
inline constexpr std::string_view kShmDir = "/dev/shm";

// "/<instance>.<object>": the segment of one object of an instance. Backends
// name their pools this way from PoolSpec::name (PoolObject for the engine's).
std::string Segment(std::string_view instance, std::string_view object);
// "<profile>.<tier>": the object name of a profile's pool in `tier`.
std::string PoolObject(std::string_view profile, Tier tier);

// The object name of one engine's segments: "<profile>" for the pools a
// profile's tenants share, "<profile>.<tenant>" for an isolated tenant's.
// Pool, Index and WarmManifest take it where they say `profile`.
std::string Domain(std::string_view profile, std::string_view isolated_tenant);

std::string Fences(std::string_view instance);
std::string Pool(std::string_view instance, std::string_view profile, Tier tier);
std::string Index(std::string_view instance, std::string_view profile);
std::string WarmManifest(std::string_view instance, std::string_view profile);
// The name a segment is written under before it is renamed into place.
std::string Staging(std::string_view segment);
// The file behind segment `segment` ("/dev/shm/<name>").
std::string ShmPath(std::string_view segment);
// Lock files (InstanceLock in the daemon).
std::string InstanceLock(std::string_view instance);
std::string SocketLock(std::string_view socket_path);

}  // namespace kvtier::shm_names
