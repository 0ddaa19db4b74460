// Small helpers shared by the kvtier-bench subcommands: clocks, statistics, a
// deterministic random generator, machine description and a flat JSON writer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier::bench {

using Clock = std::chrono::steady_clock;

inline double NanosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

// Median of `v` (the mean of the two middle values for an even count). REQUIRES: !v.empty().
double Median(std::vector<double> v);
// The p-th percentile (0..100), nearest rank. REQUIRES: !v.empty().
double Percentile(std::vector<double> v, double p);

// Keeps the compiler from discarding the computation that produced `value`.
template <typename T>
inline void KeepAlive(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

// splitmix64: fast, deterministic, good enough for benchmark inputs.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In [0, n); the modulo bias is negligible for the small n used here. REQUIRES: n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// A figure with a bootstrap 95% confidence interval over `n` pairs.
struct Interval {
  double value = 0, lo = 0, hi = 0;
  size_t n = 0;
};
// Paired comparison of two conditions measured on the same items (a[i] and b[i]
// are one turn served both ways): the median of the per-pair ratios a[i]/b[i],
// and the ratio of their p-th percentiles, each with a percentile-bootstrap 95%
// interval from `resamples` resamplings of the pairs. Deterministic in `seed`.
// REQUIRES: a.size() == b.size() > 0, every b[i] > 0.
Interval PairedMedianRatio(const std::vector<double>& a, const std::vector<double>& b, uint64_t seed,
                           int resamples = 2000);
Interval PairedPercentileRatio(const std::vector<double>& a, const std::vector<double>& b, double p,
                               uint64_t seed, int resamples = 2000);

struct MachineInfo {
  std::string cpu_model;  // "model name" of /proc/cpuinfo; "unknown" if absent.
  unsigned cores = 0;     // Online logical CPUs.
};
MachineInfo ReadMachineInfo();

// printf to stdout, flushed at once, so progress shows while a long step runs.
void Progress(const char* format, ...) __attribute__((format(printf, 1, 2)));

// A JSON object written on one line, keys in insertion order.
class JsonObject {
 public:
  JsonObject& Add(std::string_view key, double value, int decimals = 3);
  JsonObject& Add(std::string_view key, uint64_t value);
  JsonObject& Add(std::string_view key, std::string_view value);
  JsonObject& Add(std::string_view key, const JsonObject& value);
  // `key` = i.value, `key`_lo and `key`_hi = its interval.
  JsonObject& Add(std::string_view key, const Interval& i, int decimals);
  // `json` must be one valid JSON value (an array, say); it is written as is.
  JsonObject& AddRaw(std::string_view key, std::string json);
  std::string ToString() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // key, encoded value
};

std::string JsonQuote(std::string_view s);

// The flags of a subcommand that takes only --quick and --help: sets *quick,
// prints help or an error. Returns -1 to go on, else the exit code.
int ParseQuickFlags(int argc, char** argv, const char* subcommand, void (*print_help)(), bool* quick);

}  // namespace kvtier::bench
