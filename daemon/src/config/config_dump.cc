// Writing a DaemonConfig back out, and planning what a reload may change (config.h).
#include "config/config.h"
#include "config/config_keys.h"
#include "config/config_section.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>
#include <string>
#include <vector>

namespace kvtier::daemon {

std::string YamlDouble(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string YamlString(const std::string& v) {
  const bool plain =
      !v.empty() && v != "null" && v != "Null" && v != "NULL" && v != "~" &&
      (std::isalnum(static_cast<unsigned char>(v[0])) || v[0] == '/' || v[0] == '_') &&
      std::all_of(v.begin(), v.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '/' || ch == '_' || ch == '-' || ch == '.';
      });
  if (plain) return v;
  std::string out = "\"";
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += ch;  // UTF-8 bytes pass through.
    }
  }
  return out + "\"";
}

std::string YamlList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + YamlString(items[i]);
  return out + "]";
}

std::string DumpConfig(const DaemonConfig& c) {
  std::ostringstream o;
  o << DumpConfigKeys(c, "", "") << "profiles:\n";
  for (const ProfileConfig& p : c.profiles) {
    o << "  - name: " << YamlString(p.profile.name) << "\n"
      << "    layers: " << p.profile.layers << "\n"
      << "    kv_heads: " << p.profile.kv_heads << "\n"
      << "    head_dim: " << p.profile.head_dim << "\n"
      << "    dtype: " << DTypeName(p.profile.dtype) << "\n"
      << "    block_tokens: " << p.profile.block_tokens << "\n"
      << "    gpu_blocks: " << p.gpu_blocks << "    # " << p.gpu_blocks * p.profile.BlockBytes() / 1048576.0 << " MiB\n"
      << "    host_blocks: " << p.host_blocks << "    # " << p.host_blocks * p.profile.BlockBytes() / 1048576.0 << " MiB\n";
    if (!p.models.empty()) {
      o << "    models:\n";
      for (const ModelId& m : p.models) o << "      - \"" << m.ToHex() << "\"\n";
    }
  }
  for (const char* section : {"tiering", "limits", "metrics"}) o << section << ":\n" << DumpConfigKeys(c, section, "  ");
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", c.access.mode);
  o << "access:\n"
    << "  allow_users: " << YamlList(c.access.allow_users) << "\n"
    << "  allow_groups: " << YamlList(c.access.allow_groups) << "\n"
    << "  admin_users: " << YamlList(c.access.admin_users) << "\n"
    << "  admin_groups: " << YamlList(c.access.admin_groups) << "\n"
    << "  allow_root: " << (c.access.allow_root ? "true" : "false") << "\n"
    << "  group: " << YamlString(c.access.group) << "\n"
    << "  mode: \"" << mode << "\"\n";
  o << "tenants:" << (c.tenants.empty() ? " []" : "") << "\n";
  for (const TenantConfig& t : c.tenants) {
    o << "  - name: " << YamlString(t.name) << "\n"
      << "    users: " << YamlList(t.users) << "\n"
      << "    groups: " << YamlList(t.groups) << "\n"
      << "    allow_requested: " << (t.allow_requested ? "true" : "false") << "\n"
      << "    gpu_blocks: " << t.gpu_blocks << "\n"
      << "    host_blocks: " << t.host_blocks << "\n"
      << "    isolated: " << (t.isolated ? "true" : "false") << "\n";
  }
  o << "stores:\n" << DumpConfigKeys(c, "stores", "  ") << "  tiers:" << (c.stores.tiers.empty() ? " []" : "") << "\n";
  for (const StoreTierConfig& t : c.stores.tiers) {
    o << "    - kind: " << t.kind << "\n"
      << "      write: " << (t.write_through ? "through" : "back") << "\n";
    for (const auto& [key, value] : FindStoreKind(t.kind)->settings(t.options)) {
      o << "      " << key << ": " << value << "\n";
    }
  }
  o << "events:\n" << DumpConfigKeys(c, "events", "  ");
  return o.str();
}

namespace {

struct Setting {
  std::string key;
  std::string value;
  bool reloadable;
};

// Every setting as "key: value", in file order, marked as reloadable or not.
std::vector<Setting> Flatten(const DaemonConfig& c) {
  std::vector<Setting> out;
  auto add = [&](std::string key, std::string value, bool reloadable) {
    out.push_back(Setting{std::move(key), std::move(value), reloadable});
  };
  auto keys = [&](std::string_view section) {
    for (const ConfigKey& k : ConfigKeys()) {
      if (k.section == section) add(k.Path(), k.ValueText(c), k.reloadable);
    }
  };
  keys("");
  for (size_t i = 0; i < c.profiles.size(); ++i) {
    const ProfileConfig& p = c.profiles[i];
    const std::string k = "profiles[" + std::to_string(i) + "].";
    add(k + "name", p.profile.name, false);
    add(k + "layers", std::to_string(p.profile.layers), false);
    add(k + "kv_heads", std::to_string(p.profile.kv_heads), false);
    add(k + "head_dim", std::to_string(p.profile.head_dim), false);
    add(k + "dtype", std::string(DTypeName(p.profile.dtype)), false);
    add(k + "block_tokens", std::to_string(p.profile.block_tokens), false);
    add(k + "gpu_blocks", std::to_string(p.gpu_blocks), false);
    add(k + "host_blocks", std::to_string(p.host_blocks), false);
    std::string models;
    for (const ModelId& m : p.models) models += (models.empty() ? "" : ",") + m.ToHex();
    add(k + "models", models.empty() ? "any" : models, false);
  }
  keys("tiering");
  keys("limits");
  keys("metrics");
  add("access.allow_users", YamlList(c.access.allow_users), false);
  add("access.allow_groups", YamlList(c.access.allow_groups), false);
  add("access.admin_users", YamlList(c.access.admin_users), false);
  add("access.admin_groups", YamlList(c.access.admin_groups), false);
  add("access.allow_root", c.access.allow_root ? "true" : "false", false);
  add("access.group", "\"" + c.access.group + "\"", false);
  add("access.mode", std::to_string(c.access.mode), false);
  for (size_t i = 0; i < c.tenants.size(); ++i) {
    const TenantConfig& t = c.tenants[i];
    const std::string k = "tenants[" + std::to_string(i) + "].";
    add(k + "name", t.name, false);
    add(k + "users", YamlList(t.users), false);
    add(k + "groups", YamlList(t.groups), false);
    add(k + "allow_requested", t.allow_requested ? "true" : "false", false);
    add(k + "gpu_blocks", std::to_string(t.gpu_blocks), false);
    add(k + "host_blocks", std::to_string(t.host_blocks), false);
    add(k + "isolated", t.isolated ? "true" : "false", false);
  }
  keys("stores");
  for (size_t i = 0; i < c.stores.tiers.size(); ++i) {
    const StoreTierConfig& t = c.stores.tiers[i];
    const std::string k = "stores.tiers[" + std::to_string(i) + "].";
    add(k + "kind", t.kind, false);
    add(k + "write", t.write_through ? "through" : "back", false);
    for (auto& [key, value] : FindStoreKind(t.kind)->settings(t.options)) add(k + key, std::move(value), false);
  }
  keys("events");
  return out;
}

}  // namespace

ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& loaded) {
  ReloadPlan plan;
  plan.next = running;
  // Every reloadable key's value is taken from `loaded`.
  DaemonConfig& from = const_cast<DaemonConfig&>(loaded);  // Read only.
  for (const ConfigKey& k : ConfigKeys()) {
    if (!k.reloadable) continue;
    std::visit([&](auto member) { member(plan.next) = member(from); }, k.field);
  }

  const std::vector<Setting> before = Flatten(running), after = Flatten(loaded);
  auto find = [](const std::vector<Setting>& in, const std::string& key) -> const Setting* {
    for (const Setting& s : in) {
      if (s.key == key) return &s;
    }
    return nullptr;
  };
  for (const Setting& b : before) {
    const Setting* a = find(after, b.key);
    if (a == nullptr) {
      plan.kept.push_back(b.key + ": " + b.value + " -> (none)");
    } else if (a->value != b.value) {
      (b.reloadable ? plan.applied : plan.kept).push_back(b.key + ": " + b.value + " -> " + a->value);
    }
  }
  for (const Setting& a : after) {
    if (find(before, a.key) == nullptr) plan.kept.push_back(a.key + ": (none) -> " + a.value);
  }
  return plan;
}

}  // namespace kvtier::daemon
