// Reading stores.record_key_file (record_key_file.h).
#include "stores/record_key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/crypto.h>

namespace kvtier::daemon {

Result<stores::RecordKey> ReadRecordKeyFile(const std::string& path, const std::string& key) {
  const std::string where = key + ": '" + path + "'";
  // O_NONBLOCK: a FIFO put there is refused below instead of waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NotFound(where + " cannot be opened: " + std::strerror(errno));
  struct stat st {};
  std::string secret;
  Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = Unavailable(where + " cannot be examined: " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    bad = InvalidArgument(where + " is not a regular file");
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    bad = Status(StatusCode::kPermissionDenied, where + " has mode " + mode +
                           ": group and others must neither read nor write the record key (chmod 600)");
  } else if (st.st_size < static_cast<off_t>(stores::RecordKey::kMinBytes) ||
             st.st_size > static_cast<off_t>(stores::RecordKey::kMaxBytes)) {
    bad = InvalidArgument(where + " holds " + std::to_string(st.st_size) + " bytes: a record key has " +
                          std::to_string(stores::RecordKey::kMinBytes) + " to " +
                          std::to_string(stores::RecordKey::kMaxBytes) + " (head -c 32 /dev/urandom > FILE)");
  } else {
    secret.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < secret.size()) {
      const ssize_t n = ::read(fd, secret.data() + got, secret.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != secret.size()) bad = Unavailable(where + " could not be read whole");
  }
  ::close(fd);
  if (!bad.ok()) return bad;
  Result<stores::RecordKey> k = stores::RecordKey::FromSecret(secret);
  OPENSSL_cleanse(secret.data(), secret.size());
  if (!k.ok()) return Status(k.status().code(), where + ": " + k.status().message());
  return k;
}

}  // namespace kvtier::daemon
