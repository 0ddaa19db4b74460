// Writing a DaemonConfig back out, and planning what a reload may change (config.h).
#include "config.h"
#include "config_section.h"

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
  o << "instance: " << YamlString(c.instance) << "\n"
    << "socket: " << YamlString(c.socket_path) << "\n"
    << "backend: " << c.backend << "\n"
    << "log_level: " << c.log_level << "\n"
    << "warm_restart: " << (c.warm_restart ? "true" : "false") << "\n"
    << "busy_poll_us: " << c.busy_poll_us << "\n"
    << "profiles:\n";
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
  o << "tiering:\n"
    << "  gpu_high_watermark: " << YamlDouble(c.gpu_high_watermark) << "\n"
    << "  gpu_low_watermark: " << YamlDouble(c.gpu_low_watermark) << "\n"
    << "  host_high_watermark: " << YamlDouble(c.host_high_watermark) << "\n"
    << "  host_low_watermark: " << YamlDouble(c.host_low_watermark) << "\n"
    << "  max_copy_batch: " << c.max_copy_batch << "\n"
    << "  policy: " << c.policy << "\n"
    << "  tick_ms: " << c.tick_ms << "\n"
    << "  warm_snapshot_ms: " << c.warm_snapshot_ms << "\n"
    << "limits:\n"
    << "  max_clients: " << c.max_clients << "\n"
    << "  max_clients_per_tenant: " << c.max_clients_per_tenant << "\n"
    << "  max_sessions: " << c.max_sessions << "\n"
    << "  max_sessions_per_tenant: " << c.max_sessions_per_tenant << "\n"
    << "  max_session_blocks: " << c.max_session_blocks << "\n"
    << "  max_tenants: " << c.max_tenants << "\n"
    << "  max_leases_per_client: " << c.max_leases_per_client << "\n"
    << "  max_blocks_per_request: " << c.max_blocks_per_request << "\n"
    << "  max_frame_bytes: " << c.max_frame_bytes << "\n"
    << "  hello_timeout_ms: " << c.hello_timeout_ms << "\n"
    << "  frame_timeout_ms: " << c.frame_timeout_ms << "\n"
    << "  max_reply_backlog_bytes: " << c.max_reply_backlog_bytes << "\n"
    << "  lease_timeout_ms: " << c.lease_timeout_ms << "\n"
    << "metrics:\n"
    << "  listen: " << (c.metrics_listen.empty() ? "\"\"" : YamlString(c.metrics_listen)) << "\n";
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", c.access.mode);
  o << "access:\n"
    << "  allow_users: " << YamlList(c.access.allow_users) << "\n"
    << "  allow_groups: " << YamlList(c.access.allow_groups) << "\n"
    << "  admin_users: " << YamlList(c.access.admin_users) << "\n"
    << "  admin_groups: " << YamlList(c.access.admin_groups) << "\n"
    << "  allow_root: " << (c.access.allow_root ? "true" : "false") << "\n"
    << "  group: " << (c.access.group.empty() ? "\"\"" : YamlString(c.access.group)) << "\n"
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
  const StoresConfig& st = c.stores;
  o << "stores:\n"
    << "  fetch_budget_ms: " << st.fetch_budget_ms << "\n"
    << "  key_prefix: " << (st.key_prefix.empty() ? "\"\"" : YamlString(st.key_prefix)) << "\n"
    << "  queue_bytes: " << st.queue_bytes << "\n"
    << "  max_fetch_bytes: " << st.max_fetch_bytes << "\n"
    << "  tiers:" << (st.tiers.empty() ? " []" : "") << "\n";
  for (const StoreTierConfig& t : st.tiers) {
    o << "    - kind: " << t.kind << "\n"
      << "      write: " << (t.write_through ? "through" : "back") << "\n";
    for (const auto& [key, value] : FindStoreKind(t.kind)->settings(t.options)) {
      o << "      " << key << ": " << value << "\n";
    }
  }
  const EventsConfig& ev = c.events;
  o << "events:\n"
    << "  enabled: " << (ev.enabled ? "true" : "false") << "\n"
    << "  publish: " << (ev.publish.empty() ? "\"\"" : YamlString(ev.publish)) << "\n"
    << "  replay: " << (ev.replay.empty() ? "\"\"" : YamlString(ev.replay)) << "\n"
    << "  topic: " << (ev.topic.empty() ? "\"\"" : YamlString(ev.topic)) << "\n"
    << "  token_ids: " << (ev.token_ids ? "true" : "false") << "\n"
    << "  max_batch_events: " << ev.max_batch_events << "\n"
    << "  replay_batches: " << ev.replay_batches << "\n"
    << "  queue_batches: " << ev.queue_batches << "\n";
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
  add("instance", c.instance, false);
  add("socket", c.socket_path, false);
  add("backend", c.backend, false);
  add("log_level", c.log_level, true);
  add("warm_restart", c.warm_restart ? "true" : "false", false);
  add("busy_poll_us", std::to_string(c.busy_poll_us), true);
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
  add("tiering.gpu_high_watermark", YamlDouble(c.gpu_high_watermark), true);
  add("tiering.gpu_low_watermark", YamlDouble(c.gpu_low_watermark), true);
  add("tiering.host_high_watermark", YamlDouble(c.host_high_watermark), true);
  add("tiering.host_low_watermark", YamlDouble(c.host_low_watermark), true);
  add("tiering.max_copy_batch", std::to_string(c.max_copy_batch), true);
  add("tiering.policy", c.policy, true);
  add("tiering.tick_ms", std::to_string(c.tick_ms), true);
  add("tiering.warm_snapshot_ms", std::to_string(c.warm_snapshot_ms), true);
  add("limits.max_clients", std::to_string(c.max_clients), true);
  add("limits.max_clients_per_tenant", std::to_string(c.max_clients_per_tenant), true);
  add("limits.max_sessions", std::to_string(c.max_sessions), false);
  add("limits.max_sessions_per_tenant", std::to_string(c.max_sessions_per_tenant), false);
  add("limits.max_session_blocks", std::to_string(c.max_session_blocks), false);
  add("limits.max_tenants", std::to_string(c.max_tenants), true);
  add("limits.max_leases_per_client", std::to_string(c.max_leases_per_client), true);
  add("limits.max_blocks_per_request", std::to_string(c.max_blocks_per_request), false);
  add("limits.max_frame_bytes", std::to_string(c.max_frame_bytes), false);
  add("limits.hello_timeout_ms", std::to_string(c.hello_timeout_ms), true);
  add("limits.frame_timeout_ms", std::to_string(c.frame_timeout_ms), true);
  add("limits.max_reply_backlog_bytes", std::to_string(c.max_reply_backlog_bytes), true);
  add("limits.lease_timeout_ms", std::to_string(c.lease_timeout_ms), true);
  add("metrics.listen", "\"" + c.metrics_listen + "\"", false);
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
  add("stores.fetch_budget_ms", std::to_string(c.stores.fetch_budget_ms), false);
  add("stores.key_prefix", "\"" + c.stores.key_prefix + "\"", false);
  add("stores.queue_bytes", std::to_string(c.stores.queue_bytes), false);
  add("stores.max_fetch_bytes", std::to_string(c.stores.max_fetch_bytes), false);
  for (size_t i = 0; i < c.stores.tiers.size(); ++i) {
    const StoreTierConfig& t = c.stores.tiers[i];
    const std::string k = "stores.tiers[" + std::to_string(i) + "].";
    add(k + "kind", t.kind, false);
    add(k + "write", t.write_through ? "through" : "back", false);
    for (auto& [key, value] : FindStoreKind(t.kind)->settings(t.options)) add(k + key, std::move(value), false);
  }
  add("events.enabled", c.events.enabled ? "true" : "false", false);
  add("events.publish", c.events.publish, false);
  add("events.replay", c.events.replay, false);
  add("events.topic", c.events.topic, false);
  add("events.token_ids", c.events.token_ids ? "true" : "false", false);
  add("events.max_batch_events", std::to_string(c.events.max_batch_events), false);
  add("events.replay_batches", std::to_string(c.events.replay_batches), false);
  add("events.queue_batches", std::to_string(c.events.queue_batches), false);
  return out;
}

}  // namespace

ReloadPlan PlanReload(const DaemonConfig& running, const DaemonConfig& loaded) {
  ReloadPlan plan;
  plan.next = running;
  DaemonConfig& n = plan.next;
  n.log_level = loaded.log_level;
  n.busy_poll_us = loaded.busy_poll_us;
  n.gpu_high_watermark = loaded.gpu_high_watermark;
  n.gpu_low_watermark = loaded.gpu_low_watermark;
  n.host_high_watermark = loaded.host_high_watermark;
  n.host_low_watermark = loaded.host_low_watermark;
  n.max_copy_batch = loaded.max_copy_batch;
  n.policy = loaded.policy;
  n.tick_ms = loaded.tick_ms;
  n.warm_snapshot_ms = loaded.warm_snapshot_ms;
  n.max_clients = loaded.max_clients;
  n.max_clients_per_tenant = loaded.max_clients_per_tenant;
  n.max_leases_per_client = loaded.max_leases_per_client;
  n.max_tenants = loaded.max_tenants;
  n.hello_timeout_ms = loaded.hello_timeout_ms;
  n.frame_timeout_ms = loaded.frame_timeout_ms;
  n.max_reply_backlog_bytes = loaded.max_reply_backlog_bytes;
  n.lease_timeout_ms = loaded.lease_timeout_ms;

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
