// Metrics: histograms and the Prometheus text exposition writer (prometheus.h).
#include "service/prometheus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvtier::daemon {

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()), counts_(bounds.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // The first bucket whose bound is >= value; past the end is the overflow bucket.
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[static_cast<size_t>(at - bounds_.begin())];
  ++count_;
  sum_ += value;
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < counts_.size() && i < other.counts_.size(); ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
}

double Histogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(count_);
  uint64_t below = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    const uint64_t in = counts_[i];
    if (in > 0 && static_cast<double>(below + in) >= rank) {
      const double lo = i == 0 ? 0.0 : bounds_[i - 1];
      return lo + (bounds_[i] - lo) * (rank - static_cast<double>(below)) / static_cast<double>(in);
    }
    below += in;
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

std::span<const double> LatencyBuckets() {
  static constexpr std::array<double, 20> kBounds = {1e-6,   2.5e-6, 5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4,
                                                     2.5e-4, 5e-4,   1e-3, 2.5e-3, 5e-3,   1e-2, 2.5e-2,
                                                     5e-2,   0.1,    0.25, 0.5,    1,      2.5};
  return kBounds;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  // The shortest form that reads back as the same double ("0.001", not "0.0010000000000000000208").
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

namespace {

const char* TypeName(Exposition::Type t) {
  switch (t) {
    case Exposition::Type::kCounter:
      return "counter";
    case Exposition::Type::kGauge:
      return "gauge";
    case Exposition::Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Label values escape backslash, double quote and newline; help text only
// backslash and newline.
void Escape(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

void Exposition::Family(std::string_view name, Type type, std::string_view help) {
  family_ = std::string(name);
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  Escape(out_, help, false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += TypeName(type);
  out_ += '\n';
}

void Exposition::Line(std::string_view suffix, const Labels& labels, std::string_view extra_label, double value) {
  out_ += family_;
  out_ += suffix;
  if (!labels.empty() || !extra_label.empty()) {
    out_ += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      Escape(out_, v, true);
      out_ += '"';
    }
    if (!extra_label.empty()) {
      if (!first) out_ += ',';
      out_ += extra_label;
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += FormatValue(value);
  out_ += '\n';
}

void Exposition::Sample(const Labels& labels, double value) { Line("", labels, "", value); }

void Exposition::Histogram(const Labels& labels, const daemon::Histogram& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    Line("_bucket", labels, "le=\"" + FormatValue(h.bounds()[i]) + "\"", static_cast<double>(cumulative));
  }
  Line("_bucket", labels, "le=\"+Inf\"", static_cast<double>(h.count()));
  Line("_sum", labels, "", h.sum());
  Line("_count", labels, "", static_cast<double>(h.count()));
}

}  // namespace kvtier::daemon
