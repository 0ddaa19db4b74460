// Section: reading one YAML mapping of the configuration, so that every error
// names its key and unknown keys are errors (config.cc, config_stores.cc), and
// the YAML scalars DumpConfig writes. Internal to the configuration parser.
#pragma once

#include <yaml-cpp/yaml.h>

#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/byte_size.h"
#include "kvtier/status.h"

namespace kvtier::daemon {

// Walks a YAML mapping, remembering which keys were read, so unknown ones are errors.
class Section {
 public:
  Section(const YAML::Node& node, std::string path, std::string source)
      : node_(node), path_(std::move(path)), source_(std::move(source)) {}

  Status Error(std::string_view key, const std::string& what) const {
    return InvalidArgument(source_ + ": " + Join(key) + ": " + what);
  }
  std::string Join(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  YAML::Node Get(const char* key) {
    seen_.insert(key);
    return node_[key];
  }

  template <typename T>
  Status Read(const char* key, T* out, T lo, T hi) {
    YAML::Node n = Get(key);
    if (!n) return Status::Ok();
    try {
      if constexpr (std::is_same_v<T, double>) {
        const double v = n.as<double>();
        if (!(v >= lo && v <= hi))
          return Error(key, "must be in [" + Fmt(lo) + ", " + Fmt(hi) + "], got " + n.Scalar());
        *out = v;
      } else {
        const auto v = n.as<long long>();
        if (v < static_cast<long long>(lo) || v > static_cast<long long>(hi)) {
          return Error(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + n.Scalar());
        }
        *out = static_cast<T>(v);
      }
    } catch (const YAML::Exception&) {
      return Error(key, "expected a number, got '" + (n.IsScalar() ? n.Scalar() : std::string("a ") + Kind(n)) + "'");
    }
    return Status::Ok();
  }

  Status ReadString(const char* key, std::string* out, std::initializer_list<const char*> allowed = {}) {
    return ReadString(key, out, std::span<const char* const>(allowed.begin(), allowed.size()));
  }
  // `allowed`: the values it may take; empty: any.
  Status ReadString(const char* key, std::string* out, std::span<const char* const> allowed) {
    YAML::Node n = Get(key);
    if (!n) return Status::Ok();
    if (!n.IsScalar()) return Error(key, std::string("expected a string, got a ") + Kind(n));
    const std::string v = n.Scalar();
    if (allowed.size() != 0) {
      bool ok = false;
      std::string list;
      for (const char* a : allowed) {
        ok = ok || v == a;
        list += (list.empty() ? "" : ", ") + std::string(a);
      }
      if (!ok) return Error(key, "'" + v + "' is not one of " + list);
    }
    *out = v;
    return Status::Ok();
  }

  Status ReadBool(const char* key, bool* out) {
    YAML::Node n = Get(key);
    if (!n) return Status::Ok();
    const std::string v = n.IsScalar() ? n.Scalar() : std::string();
    if (v == "true") {
      *out = true;
    } else if (v == "false") {
      *out = false;
    } else {
      return Error(key, "expected true or false, got '" + (n.IsScalar() ? v : std::string("a ") + Kind(n)) + "'");
    }
    return Status::Ok();
  }

  Status ReadBytes(const char* key, uint64_t* out) {
    YAML::Node n = Get(key);
    if (!n) return Status::Ok();
    if (!n.IsScalar()) return Error(key, "expected a size such as 512MiB");
    auto v = ParseByteSize(n.Scalar());
    if (!v.ok()) return Error(key, v.status().message());
    *out = *v;
    return Status::Ok();
  }

  // Declares the keys this section may hold and fails on any other, first, so a
  // typo is reported as itself rather than as the key it was meant to be.
  Status Known(std::initializer_list<const char*> keys) {
    for (const char* k : keys) seen_.insert(k);
    return CheckUnknown();
  }

  Status CheckUnknown() const {
    if (!node_.IsMap()) return Status::Ok();
    for (const auto& kv : node_) {
      const std::string k = kv.first.Scalar();
      if (!seen_.count(k)) {
        std::string known;
        for (const auto& s : seen_) known += (known.empty() ? "" : ", ") + s;
        return Error(k, "unknown key (known here: " + known + ")");
      }
    }
    return Status::Ok();
  }

  static const char* Kind(const YAML::Node& n) {
    return n.IsMap() ? "mapping" : n.IsSequence() ? "sequence" : n.IsNull() ? "null" : "scalar";
  }

 private:
  static std::string Fmt(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  }

  YAML::Node node_;
  std::string path_;
  std::string source_;
  std::set<std::string> seen_;
};

// Writing YAML (config_dump.cc).
// `v` as a YAML scalar that reads back as the same string: plain when it is
// unambiguous (names, paths), otherwise double-quoted with escapes.
std::string YamlString(const std::string& v);
// ["a", "1001"]: a list of strings, each as YamlString writes it.
std::string YamlList(const std::vector<std::string>& items);
// The shortest text that reads back as exactly `v`.
std::string YamlDouble(double v);

struct DaemonConfig;

// The stores: section (config_stores.cc).
Status ParseStores(const YAML::Node& node, const std::string& source, DaemonConfig* config);

}  // namespace kvtier::daemon
