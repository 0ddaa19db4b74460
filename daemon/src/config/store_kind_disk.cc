// kind: disk (store_kind_disk.h).
#include "config/store_kind_disk.h"

#include "config/config_section.h"
#include "config/store_kinds.h"

#ifndef KVTIER_CONFIG_PARSER_ONLY
#include "disk/disk_store.h"
#include "log.h"
#endif

namespace kvtier::daemon {
namespace {

Status Parse(Section& s, StoreOptions* out) {
  DiskTierOptions& o = out->emplace<DiskTierOptions>();
  KVTIER_RETURN_IF_ERROR(s.Known({"path", "max_bytes", "direct_io"}));
  KVTIER_RETURN_IF_ERROR(s.ReadString("path", &o.path));
  if (o.path.empty() || o.path[0] != '/') return s.Error("path", "is required: an absolute directory path");
  KVTIER_RETURN_IF_ERROR(s.ReadBytes("max_bytes", &o.max_bytes));
  if (o.max_bytes == 0) return s.Error("max_bytes", "is required: the disk tier's size, such as 64GiB");
  return s.ReadBool("direct_io", &o.direct_io);
}

std::vector<std::pair<std::string, std::string>> Settings(const StoreOptions& options) {
  const auto& o = std::get<DiskTierOptions>(options);
  return {{"path", YamlString(o.path)},
          {"max_bytes", std::to_string(o.max_bytes)},
          {"direct_io", o.direct_io ? "true" : "false"}};
}

#ifndef KVTIER_CONFIG_PARSER_ONLY
Result<std::unique_ptr<stores::BlockStore>> Open(const StoreOptions& options, const std::string& key) {
  const auto& o = std::get<DiskTierOptions>(options);
  stores::DiskStoreOptions d;
  d.dir = o.path;
  d.max_bytes = o.max_bytes;
  d.direct_io = o.direct_io;
  // A directory that cannot be used now is no reason to refuse to start, as a
  // Redis server that is down is not: the store serves misses, counts its
  // errors and comes up when the directory can be used (retried every second).
  d.wait_for_dir = true;
  auto store = stores::OpenDiskStore(d);
  if (store.ok()) {
    if (const std::string why = stores::DiskStoreDownReason(**store); !why.empty()) {
      LogError(key + " (disk " + o.path + "): " + why +
               "; the store serves misses until the directory can be used (retried every second)");
    }
  }
  return store;
}
#else
constexpr std::nullptr_t Open = nullptr;
#endif

}  // namespace

const StoreKind kDiskStoreKind{"disk", /*writes_through=*/false, "path", &Parse, &Settings, Open};

}  // namespace kvtier::daemon
