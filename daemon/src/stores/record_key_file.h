// The record key (stores.record_key_file): the secret every kvtierd sharing a
// store signs its records with and checks them against (block_record.h).
#pragma once

#include <string>

#include "kvtier/status.h"
#include "kvtier/stores/block_record.h"

namespace kvtier::daemon {

// Reads the key in `path`: every byte of the file is the secret (raw bytes,
// not decoded: `head -c 32 /dev/urandom > FILE` makes one; a hex line works
// too, as its own bytes), 32 to 4096 of them. The file must be a regular file
// (a link to one is followed) that neither group nor others may read or
// write. Every error names `key` and the file, never a byte of its contents.
// Read once at start: not on reload (the stores keep the key they opened with).
Result<stores::RecordKey> ReadRecordKeyFile(const std::string& path, const std::string& key);

}  // namespace kvtier::daemon
