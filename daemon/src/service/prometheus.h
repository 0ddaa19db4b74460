// Metrics: a latency histogram and a writer of the Prometheus text exposition
// format (version 0.0.4), for kvtierd's /metrics endpoint and its Stats reply.
//
// Nothing here is thread-safe: the daemon's event-loop thread owns every
// histogram and renders every scrape, so no sample ever races engine state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier::daemon {

// Counts of observations per bucket with fixed upper bounds, as a Prometheus
// histogram: bucket i holds values <= bounds[i] (and > bounds[i-1]); a last,
// implicit bucket holds everything above the largest bound.
class Histogram {
 public:
  // REQUIRES: `bounds` strictly increasing and positive.
  explicit Histogram(std::span<const double> bounds);

  void Observe(double value);
  // Adds another histogram's counts. REQUIRES: the same bounds.
  void Merge(const Histogram& other);

  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket, not cumulative; one more entry than bounds() (the overflow bucket).
  const std::vector<uint64_t>& counts() const { return counts_; }

  // The q-quantile (0 <= q <= 1) estimated as Prometheus' histogram_quantile()
  // does: linear within the bucket that holds the rank, the largest bound when
  // the rank is in the overflow bucket, 0 when empty.
  double Quantile(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Upper bounds in seconds for request latencies: 1 us to 2.5 s, 1-2.5-5 steps.
std::span<const double> LatencyBuckets();

using Labels = std::vector<std::pair<std::string, std::string>>;

// Builds one exposition: for each metric family a HELP and a TYPE line, then its
// samples. Label values and help text are escaped as the format requires.
class Exposition {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // Starts a family. `name` follows the Prometheus conventions: [a-zA-Z_:][a-zA-Z0-9_:]*,
  // counters end in _total; a family's samples follow before the next Family.
  void Family(std::string_view name, Type type, std::string_view help);
  // One sample of the current counter or gauge family.
  void Sample(const Labels& labels, double value);
  // The _bucket (cumulative, with le="+Inf"), _sum and _count samples of one
  // histogram of the current histogram family.
  void Histogram(const Labels& labels, const daemon::Histogram& h);

  const std::string& text() const { return out_; }

 private:
  void Line(std::string_view suffix, const Labels& labels, std::string_view extra_label, double value);

  std::string out_;
  std::string family_;
};

// A sample value as the format writes it: integers without a fraction, +Inf, -Inf, NaN.
std::string FormatValue(double v);

}  // namespace kvtier::daemon
