// Passing file descriptors over a Unix socket (SCM_RIGHTS, with a message's
// first byte): how kvtierd hands a client its Welcome's segments (wire.h) and
// how the client takes them. The control-message arithmetic in one place.
// Not part of the client's public API.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier {

// sendmsg of `bytes` with `fds` attached (none: a plain message), with
// `flags` | MSG_NOSIGNAL, again after EINTR. Returns sendmsg's result: the
// bytes sent (the descriptors went with the first), or -1 with errno set.
ssize_t SendWithFds(int socket, std::span<const uint8_t> bytes, std::span<const int> fds, int flags = 0);

// recvmsg into `buf` with `flags` | MSG_CMSG_CLOEXEC, with room for
// `max_fds` descriptors (the kernel discards what does not fit). Those that
// came are appended to *fds, or closed when `fds` is null, so none leaks.
// Returns recvmsg's result (EINTR is the caller's).
ssize_t ReceiveWithFds(int socket, std::span<uint8_t> buf, std::vector<int>* fds, size_t max_fds, int flags = 0);

}  // namespace kvtier
