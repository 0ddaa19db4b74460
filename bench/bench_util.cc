#include "bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace kvtier::bench {

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  const size_t i = rank < 1 ? 0 : std::min(v.size() - 1, static_cast<size_t>(rank) - 1);
  return v[i];
}

MachineInfo ReadMachineInfo() {
  MachineInfo m;
  m.cpu_model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t begin = line.find_first_not_of(" \t", colon + 1);
    if (begin != std::string::npos) m.cpu_model = line.substr(begin);
    break;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  m.cores = n > 0 ? static_cast<unsigned>(n) : 0;
  return m;
}

void Progress(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);
}

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

JsonObject& JsonObject::Add(std::string_view key, double value, int decimals) {
  char buf[64];
  if (std::isfinite(value)) {
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  } else {
    std::snprintf(buf, sizeof(buf), "null");  // JSON has no NaN or infinity.
  }
  fields_.emplace_back(std::string(key), buf);
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, uint64_t value) {
  fields_.emplace_back(std::string(key), std::to_string(value));
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, std::string_view value) {
  fields_.emplace_back(std::string(key), JsonQuote(value));
  return *this;
}

JsonObject& JsonObject::Add(std::string_view key, const JsonObject& value) {
  fields_.emplace_back(std::string(key), value.ToString());
  return *this;
}

std::string JsonObject::ToString() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i > 0) out += ", ";
    out += JsonQuote(fields_[i].first);
    out += ": ";
    out += fields_[i].second;
  }
  out += "}";
  return out;
}

int ParseQuickFlags(int argc, char** argv, const char* subcommand, void (*print_help)(), bool* quick) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      *quick = true;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      print_help();
      return 0;
    } else {
      std::fprintf(stderr, "kvtier-bench %s: unknown argument '%s' (try --help)\n", subcommand, argv[i]);
      return 2;
    }
  }
  return -1;
}

}  // namespace kvtier::bench
