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

namespace {

// Percentile-bootstrap interval of `statistic` over resamplings of the pair indices.
template <typename Statistic>
Interval Bootstrap(size_t n, uint64_t seed, int resamples, double value, Statistic statistic) {
  Interval out;
  out.value = value;
  out.n = n;
  Rng rng(seed);
  std::vector<double> estimates;
  estimates.reserve(static_cast<size_t>(resamples));
  std::vector<size_t> idx(n);
  for (int r = 0; r < resamples; ++r) {
    for (size_t& i : idx) i = rng.Below(n);
    estimates.push_back(statistic(idx));
  }
  out.lo = Percentile(estimates, 2.5);
  out.hi = Percentile(estimates, 97.5);
  return out;
}

}  // namespace

Interval PairedMedianRatio(const std::vector<double>& a, const std::vector<double>& b, uint64_t seed,
                           int resamples) {
  std::vector<double> ratios(a.size());
  for (size_t i = 0; i < a.size(); ++i) ratios[i] = a[i] / b[i];
  std::vector<double> pick(a.size());
  return Bootstrap(a.size(), seed, resamples, Median(ratios), [&](const std::vector<size_t>& idx) {
    for (size_t k = 0; k < idx.size(); ++k) pick[k] = ratios[idx[k]];
    return Median(pick);
  });
}

Interval PairedPercentileRatio(const std::vector<double>& a, const std::vector<double>& b, double p, uint64_t seed,
                               int resamples) {
  std::vector<double> pa(a.size()), pb(b.size());
  return Bootstrap(a.size(), seed, resamples, Percentile(a, p) / Percentile(b, p),
                   [&](const std::vector<size_t>& idx) {
                     for (size_t k = 0; k < idx.size(); ++k) {
                       pa[k] = a[idx[k]];
                       pb[k] = b[idx[k]];
                     }
                     return Percentile(pa, p) / Percentile(pb, p);
                   });
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

JsonObject& JsonObject::Add(std::string_view key, const Interval& i, int decimals) {
  const std::string k(key);
  Add(k, i.value, decimals);
  Add(k + "_lo", i.lo, decimals);
  return Add(k + "_hi", i.hi, decimals);
}

JsonObject& JsonObject::AddRaw(std::string_view key, std::string json) {
  fields_.emplace_back(std::string(key), std::move(json));
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
