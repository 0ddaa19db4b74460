// The stores: section of the configuration (config.h's StoresConfig): its keys are
// rows of config_keys.cc, its tiers entries each of a StoreKind (store_kinds.h).
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "config/config_keys.h"
#include "config/config_section.h"

namespace kvtier::daemon {
namespace {

// The kinds' names, for an error naming them.
std::vector<const char*> KindNames() {
  std::vector<const char*> out;
  for (const StoreKind* k : kStoreKinds) out.push_back(k->name);
  return out;
}

Status ParseTier(const YAML::Node& node, const std::string& path, const std::string& source, StoreTierConfig* t) {
  if (!node.IsMap()) return InvalidArgument(source + ": " + path + ": expected a mapping");
  Section s(node, path, source);
  const std::vector<const char*> kinds = KindNames();
  KVTIER_RETURN_IF_ERROR(s.ReadString("kind", &t->kind, kinds));
  const StoreKind* kind = FindStoreKind(t->kind);
  if (kind == nullptr) {
    std::string names;
    for (const char* k : kinds) names += (names.empty() ? "" : " or ") + std::string(k);
    return s.Error("kind", "is required: " + names);
  }
  std::string write = kind->writes_through ? "through" : "back";
  KVTIER_RETURN_IF_ERROR(s.ReadString("write", &write, {"back", "through"}));
  t->write_through = write == "through";
  KVTIER_RETURN_IF_ERROR(kind->parse(s, &t->options));
  return s.CheckUnknown();
}

// The value of `key` among a store's settings, or nullptr.
const std::string* SettingOf(const std::vector<std::pair<std::string, std::string>>& settings, const char* key) {
  for (const auto& [k, v] : settings) {
    if (k == key) return &v;
  }
  return nullptr;
}

}  // namespace

Status ParseStores(const YAML::Node& node, const std::string& source, DaemonConfig* config) {
  if (!node.IsMap()) return InvalidArgument(source + ": stores: expected a mapping (fetch_budget_ms, tiers, ...)");
  Section s(node, "stores", source);
  KVTIER_RETURN_IF_ERROR(ReadConfigKeys(s, "stores", config));
  StoresConfig* out = &config->stores;
  YAML::Node tiers = s.Get("tiers");
  if (tiers && !tiers.IsNull()) {
    if (!tiers.IsSequence()) return s.Error("tiers", "expected a list of stores (each with its kind:)");
    if (tiers.size() > 8) return s.Error("tiers", "at most 8 stores");
    for (size_t i = 0; i < tiers.size(); ++i) {
      StoreTierConfig t;
      KVTIER_RETURN_IF_ERROR(ParseTier(tiers[i], "stores.tiers[" + std::to_string(i) + "]", source, &t));
      // Two stores of a kind may not share its exclusive key's value (one directory, one disk store).
      const StoreKind& kind = *FindStoreKind(t.kind);
      for (const StoreTierConfig& other : out->tiers) {
        if (kind.exclusive_key == nullptr || other.kind != t.kind) continue;
        const auto my_settings = kind.settings(t.options), their_settings = kind.settings(other.options);
        const std::string* mine = SettingOf(my_settings, kind.exclusive_key);
        const std::string* theirs = SettingOf(their_settings, kind.exclusive_key);
        if (mine != nullptr && theirs != nullptr && *mine == *theirs) {
          return s.Error("tiers[" + std::to_string(i) + "]." + kind.exclusive_key,
                         "'" + *mine + "' is another " + t.kind + " store's too");
        }
      }
      out->tiers.push_back(std::move(t));
    }
  }
  return s.CheckUnknown();
}

}  // namespace kvtier::daemon
