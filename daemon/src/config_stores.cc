// The stores: section of the configuration (config.h's StoresConfig).
#include <filesystem>
#include <string>

#include "config_section.h"

namespace kvtier::daemon {
namespace {

Status ParseTier(const YAML::Node& node, const std::string& path, const std::string& source, StoreTierConfig* t) {
  if (!node.IsMap()) return InvalidArgument(source + ": " + path + ": expected a mapping");
  Section s(node, path, source);
  KVTIER_RETURN_IF_ERROR(s.ReadString("kind", &t->kind, {"disk", "redis"}));
  if (t->kind.empty()) return s.Error("kind", "is required: disk or redis");
  std::string write = t->kind == "redis" ? "through" : "back";
  KVTIER_RETURN_IF_ERROR(s.ReadString("write", &write, {"back", "through"}));
  t->write_through = write == "through";
  if (t->kind == "disk") {
    KVTIER_RETURN_IF_ERROR(s.Known({"kind", "write", "path", "max_bytes", "direct_io"}));
    KVTIER_RETURN_IF_ERROR(s.ReadString("path", &t->path));
    if (t->path.empty() || t->path[0] != '/') return s.Error("path", "is required: an absolute directory path");
    KVTIER_RETURN_IF_ERROR(s.ReadBytes("max_bytes", &t->max_bytes));
    if (t->max_bytes == 0) return s.Error("max_bytes", "is required: the disk tier's size, such as 64GiB");
    KVTIER_RETURN_IF_ERROR(s.ReadBool("direct_io", &t->direct_io));
    return s.CheckUnknown();
  }
  KVTIER_RETURN_IF_ERROR(s.Known(
      {"kind", "write", "nodes", "cluster", "user", "password_file", "ttl_s", "connect_timeout_ms", "timeout_ms"}));
  YAML::Node nodes = s.Get("nodes");
  if (!nodes || !nodes.IsSequence() || nodes.size() == 0) {
    return s.Error("nodes", "is required: a list of host:port (the server, or a cluster's seed nodes)");
  }
  for (const auto& n : nodes) {
    const std::string hp = n.IsScalar() ? n.Scalar() : std::string();
    const size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size() ||
        hp.find_first_not_of("0123456789", colon + 1) != std::string::npos || hp.size() - colon - 1 > 5 ||
        std::stoul(hp.substr(colon + 1)) > 65535) {
      return s.Error("nodes", "'" + hp.substr(0, 80) + "' is not host:port");
    }
    t->nodes.push_back(hp);
  }
  KVTIER_RETURN_IF_ERROR(s.ReadBool("cluster", &t->cluster));
  KVTIER_RETURN_IF_ERROR(s.ReadString("user", &t->user));
  KVTIER_RETURN_IF_ERROR(s.ReadString("password_file", &t->password_file));
  if (!t->password_file.empty() && t->password_file[0] != '/') {
    return s.Error("password_file", "must be an absolute path");
  }
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("ttl_s", &t->ttl_s, 0, 365u * 86400));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("connect_timeout_ms", &t->connect_timeout_ms, 1, 60000));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("timeout_ms", &t->timeout_ms, 1, 60000));
  return s.CheckUnknown();
}

}  // namespace

Status ParseStores(const YAML::Node& node, const std::string& source, StoresConfig* out) {
  if (!node.IsMap()) return InvalidArgument(source + ": stores: expected a mapping (fetch_budget_ms, tiers, ...)");
  Section s(node, "stores", source);
  KVTIER_RETURN_IF_ERROR(s.Known({"tiers", "fetch_budget_ms", "key_prefix", "queue_bytes", "max_fetch_bytes"}));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("fetch_budget_ms", &out->fetch_budget_ms, 1, 60000));
  KVTIER_RETURN_IF_ERROR(s.ReadString("key_prefix", &out->key_prefix));
  if (out->key_prefix.size() > 64) return s.Error("key_prefix", "must be at most 64 bytes");
  KVTIER_RETURN_IF_ERROR(s.ReadBytes("queue_bytes", &out->queue_bytes));
  if (out->queue_bytes < (1u << 20)) return s.Error("queue_bytes", "must be at least 1MiB");
  KVTIER_RETURN_IF_ERROR(s.ReadBytes("max_fetch_bytes", &out->max_fetch_bytes));
  if (out->max_fetch_bytes < (1u << 20)) return s.Error("max_fetch_bytes", "must be at least 1MiB");
  YAML::Node tiers = s.Get("tiers");
  if (tiers && !tiers.IsNull()) {
    if (!tiers.IsSequence()) return s.Error("tiers", "expected a list of stores (kind: disk or redis)");
    if (tiers.size() > 8) return s.Error("tiers", "at most 8 stores");
    for (size_t i = 0; i < tiers.size(); ++i) {
      StoreTierConfig t;
      KVTIER_RETURN_IF_ERROR(ParseTier(tiers[i], "stores.tiers[" + std::to_string(i) + "]", source, &t));
      for (const StoreTierConfig& other : out->tiers) {
        if (t.kind == "disk" && other.kind == "disk" && t.path == other.path) {
          return s.Error("tiers[" + std::to_string(i) + "].path", "'" + t.path + "' is another disk store's too");
        }
      }
      out->tiers.push_back(std::move(t));
    }
  }
  return s.CheckUnknown();
}

}  // namespace kvtier::daemon
