// DaemonConfig: parsing and checking the YAML configuration (config.h).
#include "config/config.h"

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/config_keys.h"
#include "config/config_section.h"
#include "kvtier/event_stream.h"

namespace kvtier::daemon {
namespace {

Status ParseProfile(const YAML::Node& node, const std::string& path, const std::string& source, ProfileConfig* out) {
  if (!node.IsMap()) return InvalidArgument(source + ": " + path + ": expected a mapping");
  Section s(node, path, source);
  KVTIER_RETURN_IF_ERROR(s.Known({"name", "layers", "kv_heads", "head_dim", "block_tokens", "dtype", "gpu_bytes",
                                  "gpu_blocks", "host_bytes", "host_blocks", "models"}));
  ModelProfile& p = out->profile;
  KVTIER_RETURN_IF_ERROR(s.ReadString("name", &p.name));
  if (p.name.empty()) return s.Error("name", "is required");
  for (char c : p.name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      return s.Error("name", "'" + p.name + "' may hold only letters, digits, '-' and '_'");
    }
  }
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("layers", &p.layers, 1, 4096));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("kv_heads", &p.kv_heads, 1, 4096));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("head_dim", &p.head_dim, 1, 4096));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("block_tokens", &p.block_tokens, 1, kMaxBlockTokens));
  std::string dtype = std::string(DTypeName(p.dtype));
  KVTIER_RETURN_IF_ERROR(s.ReadString("dtype", &dtype, {"fp16", "bf16", "fp32"}));
  p.dtype = *ParseDType(dtype);
  for (const char* k : {"layers", "kv_heads", "head_dim"}) {
    if (!node[k]) return s.Error(k, "is required");
  }
  const Status valid = p.Validate();
  if (!valid.ok()) return InvalidArgument(source + ": " + path + ": " + valid.message());
  const uint64_t block = p.BlockBytes();
  for (const char* tier : {"gpu", "host"}) {
    const std::string bytes_key = std::string(tier) + "_bytes";
    const std::string blocks_key = std::string(tier) + "_blocks";
    uint64_t bytes = 0;
    int64_t blocks = -1;
    KVTIER_RETURN_IF_ERROR(s.ReadBytes(bytes_key.c_str(), &bytes));
    KVTIER_RETURN_IF_ERROR(s.Read<int64_t>(blocks_key.c_str(), &blocks, 1, int64_t{1} << 28));
    if (bytes != 0 && blocks >= 0) return s.Error(bytes_key, "give " + bytes_key + " or " + blocks_key + ", not both");
    if (bytes == 0 && blocks < 0) return s.Error(bytes_key, "is required (or " + blocks_key + ")");
    if (bytes != 0) blocks = static_cast<int64_t>(bytes / block);
    if (blocks < 1) return s.Error(bytes_key, "holds no whole block of " + std::to_string(block) + " bytes");
    if (blocks > int64_t{1} << 28) {
      return s.Error(bytes_key, "holds " + std::to_string(blocks) + " blocks of " + std::to_string(block) +
                                    " bytes, more than the 2^28 slots a tier may have");
    }
    (tier[0] == 'g' ? out->gpu_blocks : out->host_blocks) = static_cast<uint32_t>(blocks);
  }
  if (YAML::Node models = s.Get("models"); models && !models.IsNull()) {
    if (!models.IsSequence()) return s.Error("models", "expected a list of model identities (32 hex digits each)");
    for (const auto& m : models) {
      const std::string text = m.IsScalar() ? m.Scalar() : std::string();
      const std::optional<ModelId> id = ModelId::FromHex(text);
      if (!id || id->IsNull()) {
        return s.Error("models", "'" + text.substr(0, 64) + "' is not a model identity (32 hex digits, not all zero)");
      }
      if (std::find(out->models.begin(), out->models.end(), *id) != out->models.end()) {
        return s.Error("models", "'" + text + "' appears twice");
      }
      out->models.push_back(*id);
    }
  }
  return s.CheckUnknown();
}

// "alice" or "1001" -> a uid (a numeric id needs no passwd entry).
Result<uint32_t> ResolveId(const std::string& text, bool user) {
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    if (text.size() > 10 || std::stoull(text) >= 0xffffffffull) return InvalidArgument("id " + text + " is out of range");
    return static_cast<uint32_t>(std::stoul(text));
  }
  std::vector<char> buf(16384);
  if (user) {
    passwd pw{}, *found = nullptr;
    if (::getpwnam_r(text.c_str(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) return found->pw_uid;
    return NotFound("unknown user '" + text + "'");
  }
  group gr{}, *found = nullptr;
  if (::getgrnam_r(text.c_str(), &gr, buf.data(), buf.size(), &found) == 0 && found != nullptr) return found->gr_gid;
  return NotFound("unknown group '" + text + "'");
}

// A name, an id, or a list of them -> both spellings, resolved.
Status ReadIds(Section& s, const char* key, bool user, std::vector<std::string>* names, std::vector<uint32_t>* ids) {
  YAML::Node n = s.Get(key);
  if (!n || n.IsNull()) return Status::Ok();
  std::vector<std::string> items;
  if (n.IsScalar()) {
    items.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (const auto& e : n) {
      if (!e.IsScalar()) return s.Error(key, "expected a list of user or group names or ids");
      items.push_back(e.Scalar());
    }
  } else {
    return s.Error(key, "expected a list of user or group names or ids");
  }
  for (const std::string& item : items) {
    auto id = ResolveId(item, user);
    if (!id.ok()) return s.Error(key, id.status().message());
    if (std::find(names->begin(), names->end(), item) != names->end()) return s.Error(key, "'" + item + "' appears twice");
    names->push_back(item);
    ids->push_back(*id);
  }
  return Status::Ok();
}

Status ReadBool(Section& s, const char* key, bool* out) {
  YAML::Node n = s.Get(key);
  if (!n) return Status::Ok();
  const std::string v = n.IsScalar() ? n.Scalar() : "";
  if (v == "true" || v == "yes") *out = true;
  else if (v == "false" || v == "no") *out = false;
  else return s.Error(key, "expected true or false, got '" + v + "'");
  return Status::Ok();
}

Status ParseAccess(const YAML::Node& node, const std::string& source, AccessConfig* a) {
  if (!node.IsMap()) return InvalidArgument(source + ": access: expected a mapping");
  Section s(node, "access", source);
  KVTIER_RETURN_IF_ERROR(
      s.Known({"allow_users", "allow_groups", "admin_users", "admin_groups", "allow_root", "group", "mode"}));
  KVTIER_RETURN_IF_ERROR(ReadIds(s, "allow_users", true, &a->allow_users, &a->allow_uids));
  KVTIER_RETURN_IF_ERROR(ReadIds(s, "allow_groups", false, &a->allow_groups, &a->allow_gids));
  KVTIER_RETURN_IF_ERROR(ReadIds(s, "admin_users", true, &a->admin_users, &a->admin_uids));
  KVTIER_RETURN_IF_ERROR(ReadIds(s, "admin_groups", false, &a->admin_groups, &a->admin_gids));
  KVTIER_RETURN_IF_ERROR(ReadBool(s, "allow_root", &a->allow_root));
  KVTIER_RETURN_IF_ERROR(s.ReadString("group", &a->group));
  if (!a->group.empty()) {
    auto gid = ResolveId(a->group, false);
    if (!gid.ok()) return s.Error("group", gid.status().message());
    a->group_gid = *gid;
  }
  if (YAML::Node m = s.Get("mode")) {
    // Written as 0660 (YAML reads it as a decimal-looking string) or "0600".
    const std::string v = m.IsScalar() ? m.Scalar() : "";
    if (v == "0660" || v == "660") a->mode = 0660;
    else if (v == "0600" || v == "600") a->mode = 0600;
    else return s.Error("mode", "'" + v + "' is not 0660 or 0600 (others never get access)");
  }
  return s.CheckUnknown();
}

Status ParseTenants(const YAML::Node& node, const std::string& source, std::vector<TenantConfig>* out) {
  if (!node.IsSequence()) return InvalidArgument(source + ": tenants: expected a list of tenants");
  if (node.size() > kMaxTenants) {
    return InvalidArgument(source + ": tenants: at most " + std::to_string(kMaxTenants) + " tenants");
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string path = "tenants[" + std::to_string(i) + "]";
    if (!node[i].IsMap()) return InvalidArgument(source + ": " + path + ": expected a mapping");
    Section s(node[i], path, source);
    KVTIER_RETURN_IF_ERROR(
        s.Known({"name", "users", "groups", "allow_requested", "gpu_blocks", "host_blocks", "isolated"}));
    TenantConfig t;
    KVTIER_RETURN_IF_ERROR(s.ReadString("name", &t.name));
    if (t.name.empty() || t.name.size() > kMaxTenantName) return s.Error("name", "is required: 1-64 characters");
    if (!IsValidTenantName(t.name)) {
      return s.Error("name", "'" + t.name + "' may hold only letters, digits, '-', '_' and '.'");
    }
    KVTIER_RETURN_IF_ERROR(ReadIds(s, "users", true, &t.users, &t.uids));
    KVTIER_RETURN_IF_ERROR(ReadIds(s, "groups", false, &t.groups, &t.gids));
    KVTIER_RETURN_IF_ERROR(ReadBool(s, "allow_requested", &t.allow_requested));
    KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("gpu_blocks", &t.gpu_blocks, 0, 1u << 28));
    KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("host_blocks", &t.host_blocks, 0, 1u << 28));
    KVTIER_RETURN_IF_ERROR(ReadBool(s, "isolated", &t.isolated));
    if (t.isolated && (t.gpu_blocks == 0 || t.host_blocks == 0)) {
      return s.Error("isolated",
                     "an isolated tenant's pools are sized by its gpu_blocks and host_blocks: set both (got " +
                         std::to_string(t.gpu_blocks) + " and " + std::to_string(t.host_blocks) + ")");
    }
    for (const TenantConfig& o : *out) {
      if (o.name == t.name) return s.Error("name", "tenant '" + t.name + "' appears twice");
      for (size_t k = 0; k < t.uids.size(); ++k) {
        if (std::find(o.uids.begin(), o.uids.end(), t.uids[k]) != o.uids.end()) {
          return s.Error("users", "user '" + t.users[k] + "' is already in tenant '" + o.name +
                                      "' (a user maps to one tenant)");
        }
      }
    }
    KVTIER_RETURN_IF_ERROR(s.CheckUnknown());
    out->push_back(std::move(t));
  }
  return Status::Ok();
}

// A section that holds only keys of the table (config_keys.cc): tiering, limits, metrics, events.
Status ParseKeySection(Section& top, const char* section, const std::string& source, DaemonConfig* c) {
  YAML::Node node = top.Get(section);
  if (!node || node.IsNull()) return Status::Ok();
  if (!node.IsMap()) return top.Error(section, "expected a mapping");
  Section s(node, section, source);
  KVTIER_RETURN_IF_ERROR(ReadConfigKeys(s, section, c));
  return s.CheckUnknown();
}

// The isolated tenants' pools are carved out of each profile's; what is left
// is the pool the other tenants share, which must keep at least one block.
Status CheckIsolatedPools(const DaemonConfig& c, const std::string& source) {
  uint64_t gpu = 0, host = 0;
  for (const TenantConfig& t : c.tenants) {
    if (!t.isolated) continue;
    gpu += t.gpu_blocks;
    host += t.host_blocks;
  }
  if (gpu == 0 && host == 0) return Status::Ok();
  for (size_t i = 0; i < c.profiles.size(); ++i) {
    const ProfileConfig& p = c.profiles[i];
    const char* tier = p.gpu_blocks <= gpu ? "gpu_blocks" : p.host_blocks <= host ? "host_blocks" : nullptr;
    if (tier == nullptr) continue;
    const bool g = p.gpu_blocks <= gpu;
    return InvalidArgument(source + ": profiles[" + std::to_string(i) + "]." + tier + ": " +
                           std::to_string(g ? p.gpu_blocks : p.host_blocks) + " must exceed the isolated tenants' " +
                           tier + " (" + std::to_string(g ? gpu : host) +
                           " in all): they are carved out of the profile's, and the rest is the pool the other "
                           "tenants share");
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t start = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == start) return InvalidArgument("'" + std::string(text) + "' is not a size (e.g. 4096, 512MiB, 2GiB)");
  double value = 0;
  const char* const digits_end = text.data() + i;
  const auto parsed = std::from_chars(text.data() + start, digits_end, value, std::chars_format::fixed);
  if (parsed.ec == std::errc::result_out_of_range) {
    return InvalidArgument("size '" + std::string(text) + "' is out of range");
  }
  if (parsed.ec != std::errc() || parsed.ptr != digits_end) {
    return InvalidArgument("'" + std::string(text) + "' is not a size (e.g. 4096, 512MiB, 2GiB)");
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const std::string unit(text.substr(i));
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else return InvalidArgument("unknown size unit '" + unit + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB)");
  const double bytes = value * mult;
  if (!(bytes >= 0) || bytes > kMaxByteSize) return InvalidArgument("size '" + std::string(text) + "' is out of range");
  return static_cast<uint64_t>(std::llround(bytes));
}

bool IsValidTenantName(std::string_view name) {
  if (name.empty() || name.size() > kMaxTenantName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

uint32_t SessionsPerTenant(const DaemonConfig& c) {
  if (c.max_sessions_per_tenant != 0 || c.tenants.empty()) return c.max_sessions_per_tenant;
  return std::max<uint32_t>(1, c.engine_limits.max_sessions / static_cast<uint32_t>(c.tenants.size() + 1));
}

uint32_t ClientsPerTenant(const DaemonConfig& c) {
  if (c.max_clients_per_tenant != 0 || c.tenants.empty()) return c.max_clients_per_tenant;
  return std::max<uint32_t>(1, c.max_clients / static_cast<uint32_t>(c.tenants.size() + 1));
}

Result<DaemonConfig> ParseConfig(std::string_view yaml, std::string_view source_view) {
  const std::string source(source_view);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::ParserException& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                           ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) return InvalidArgument(source + ": expected a mapping at the top level");
  DaemonConfig c;
  try {
    Section top(root, "", source);
    KVTIER_RETURN_IF_ERROR(ReadConfigKeys(top, "", &c));
    YAML::Node profiles = top.Get("profiles");
    if (!profiles || !profiles.IsSequence() || profiles.size() == 0) {
      return top.Error("profiles", "is required: a list of at least one model profile");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < profiles.size(); ++i) {
      ProfileConfig pc;
      KVTIER_RETURN_IF_ERROR(ParseProfile(profiles[i], "profiles[" + std::to_string(i) + "]", source, &pc));
      if (!names.insert(pc.profile.name).second) {
        return top.Error("profiles[" + std::to_string(i) + "].name", "'" + pc.profile.name + "' appears twice");
      }
      c.profiles.push_back(pc);
    }

    for (const char* section : {"tiering", "limits", "metrics"}) {
      KVTIER_RETURN_IF_ERROR(ParseKeySection(top, section, source, &c));
    }
    if (YAML::Node a = top.Get("access")) KVTIER_RETURN_IF_ERROR(ParseAccess(a, source, &c.access));
    if (YAML::Node t = top.Get("tenants")) {
      if (!t.IsNull()) KVTIER_RETURN_IF_ERROR(ParseTenants(t, source, &c.tenants));
    }
    if (YAML::Node st = top.Get("stores")) {
      if (!st.IsNull()) KVTIER_RETURN_IF_ERROR(ParseStores(st, source, &c));
    }
    KVTIER_RETURN_IF_ERROR(ParseKeySection(top, "events", source, &c));
    KVTIER_RETURN_IF_ERROR(CheckIsolatedPools(c, source));
    KVTIER_RETURN_IF_ERROR(top.CheckUnknown());
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return c;
}

std::string EventsPublishEndpoint(const EventsConfig& e, const std::string& socket_path) {
  return e.publish.empty() ? events::DefaultPublishEndpoint(socket_path) : e.publish;
}

std::string EventsReplayEndpoint(const EventsConfig& e, const std::string& socket_path) {
  return e.replay.empty() ? events::DefaultReplayEndpoint(socket_path) : e.replay;
}

Result<DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read config file '" + path + "'");
  // At most one byte past the limit is read, so neither a huge file nor an
  // endless one (/dev/zero) holds the caller (at SIGHUP, the event loop).
  std::string text(kMaxConfigFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigFileBytes) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);  // Fails unless it is a regular file.
    return InvalidArgument("config file '" + path + "' is " +
                           (!ec && size > kMaxConfigFileBytes ? std::to_string(size) + " bytes, " : "") +
                           "larger than the limit of " + std::to_string(kMaxConfigFileBytes) + " bytes (1 MiB)");
  }
  if (in.bad()) return NotFound("cannot read config file '" + path + "'");
  return ParseConfig(text, path);
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  const std::string usage = "'" + std::string(text) + "' is not HOST:PORT (e.g. 127.0.0.1:9464 or [::1]:9464)";
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return InvalidArgument(usage);
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  const bool bracketed = host.front() == '[';
  if (bracketed) {
    if (host.size() < 3 || host.back() != ']') return InvalidArgument(usage);
    host = host.substr(1, host.size() - 2);
  }
  if (host.find('\0') != std::string_view::npos) return InvalidArgument(usage);  // inet_pton would stop there.
  ListenAddress out;
  out.host = std::string(host);
  unsigned char buf[sizeof(in6_addr)];
  const bool v4 = !bracketed && ::inet_pton(AF_INET, out.host.c_str(), buf) == 1;
  const bool v6 = bracketed && ::inet_pton(AF_INET6, out.host.c_str(), buf) == 1;
  if (!v4 && !v6) {
    return InvalidArgument("'" + out.host + "' is not an IPv4 address or a bracketed IPv6 address (host names are not "
                           "resolved)");
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return InvalidArgument(usage);
  }
  const int p = std::stoi(std::string(port));
  if (p > 65535) return InvalidArgument("port " + std::string(port) + " is not in [0, 65535]");
  out.port = static_cast<uint16_t>(p);
  return out;
}

}  // namespace kvtier::daemon
