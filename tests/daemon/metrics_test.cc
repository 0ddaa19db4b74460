// The metrics kvtierd keeps and renders: histogram quantiles, the Prometheus
// text exposition format (0.0.4) and the table of every figure.
#include "service/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "service/stats.h"

namespace kvtier::daemon {
namespace {

TEST(HistogramTest, CountsLandInTheFirstBucketWhoseBoundHoldsThem) {
  const std::vector<double> bounds = {1, 2, 4};
  Histogram h(bounds);
  for (double v : {0.5, 1.0, 1.5, 4.0, 4.5, 100.0}) h.Observe(v);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 1, 1, 2}));  // le=1: 0.5 and 1.0 (bounds are inclusive).
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 111.5);
}

TEST(HistogramTest, QuantilesInterpolateAsPrometheusDoes) {
  const std::vector<double> bounds = {1, 2, 4};
  Histogram h(bounds);
  EXPECT_EQ(h.Quantile(0.5), 0.0) << "empty";
  for (int i = 0; i < 10; ++i) h.Observe(0.5);  // Bucket (0, 1].
  for (int i = 0; i < 10; ++i) h.Observe(3);    // Bucket (2, 4].
  EXPECT_DOUBLE_EQ(h.Quantile(0.25), 0.5);      // Rank 5 of the 10 in (0, 1].
  EXPECT_DOUBLE_EQ(h.Quantile(0.5), 1.0);       // Rank 10: the top of the first bucket.
  EXPECT_DOUBLE_EQ(h.Quantile(0.75), 3.0);      // Rank 15: half way through (2, 4].
  EXPECT_DOUBLE_EQ(h.Quantile(1.0), 4.0);
  h.Observe(1000);  // In the overflow bucket: the largest bound is the estimate.
  EXPECT_DOUBLE_EQ(h.Quantile(1.0), 4.0);

  Histogram other(bounds);
  other.Observe(1.5);
  h.Merge(other);
  EXPECT_EQ(h.count(), 22u);
  EXPECT_EQ(h.counts()[1], 1u);
}

TEST(HistogramTest, LatencyBucketsIncreaseFromAMicrosecond) {
  const auto b = LatencyBuckets();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 1e-6);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

TEST(ExpositionTest, FamiliesSamplesAndEscaping) {
  Exposition x;
  x.Family("kvtier_things_total", Exposition::Type::kCounter, "Things\nwith a \\ in the help");
  x.Sample({}, 3);
  x.Sample({{"profile", "a\"b\\c\nd"}, {"tier", "gpu"}}, 0.25);
  x.Family("kvtier_up", Exposition::Type::kGauge, "Up");
  x.Sample({{"x", "y"}}, std::nan(""));
  EXPECT_EQ(x.text(),
            "# HELP kvtier_things_total Things\\nwith a \\\\ in the help\n"
            "# TYPE kvtier_things_total counter\n"
            "kvtier_things_total 3\n"
            "kvtier_things_total{profile=\"a\\\"b\\\\c\\nd\",tier=\"gpu\"} 0.25\n"
            "# HELP kvtier_up Up\n"
            "# TYPE kvtier_up gauge\n"
            "kvtier_up{x=\"y\"} NaN\n");
}

TEST(ExpositionTest, HistogramsHaveCumulativeBucketsSumAndCount) {
  const std::vector<double> bounds = {0.001, 0.5};
  Histogram h(bounds);
  h.Observe(0.0005);
  h.Observe(0.2);
  h.Observe(7);
  Exposition x;
  x.Family("kvtier_rpc_duration_seconds", Exposition::Type::kHistogram, "Latency");
  x.Histogram({{"type", "Ping"}}, h);
  EXPECT_EQ(x.text(),
            "# HELP kvtier_rpc_duration_seconds Latency\n"
            "# TYPE kvtier_rpc_duration_seconds histogram\n"
            "kvtier_rpc_duration_seconds_bucket{type=\"Ping\",le=\"0.001\"} 1\n"
            "kvtier_rpc_duration_seconds_bucket{type=\"Ping\",le=\"0.5\"} 2\n"
            "kvtier_rpc_duration_seconds_bucket{type=\"Ping\",le=\"+Inf\"} 3\n"
            "kvtier_rpc_duration_seconds_sum{type=\"Ping\"} 7.2005\n"
            "kvtier_rpc_duration_seconds_count{type=\"Ping\"} 3\n");
}

TEST(ExpositionTest, ValuesUseTheShortestExactForm) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(12345678901234), "12345678901234");
  EXPECT_EQ(FormatValue(-2), "-2");
  EXPECT_EQ(FormatValue(0.001), "0.001");
  EXPECT_EQ(FormatValue(2.5e-6), "2.5e-06");
  EXPECT_EQ(FormatValue(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(FormatValue(INFINITY), "+Inf");
  EXPECT_EQ(FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(FormatValue(NAN), "NaN");
}

// One row per figure: each cachectl name once, and each Prometheus family's rows
// alike in type and scope, told apart by their labels, with the help on the first.
TEST(StatsTableTest, EveryFigureIsNamedOnceAndFamiliesAreConsistent) {
  std::set<std::string> names;
  std::map<std::string, const StatRow*> first_of_family;
  for (const StatRow& row : StatsTable()) {
    const std::string what = row.name != nullptr ? row.name : row.family != nullptr ? row.family : "(unnamed)";
    SCOPED_TRACE(what);
    EXPECT_TRUE(row.name != nullptr || row.family != nullptr) << "a row no output shows";
    EXPECT_EQ(row.histogram != nullptr, row.type == Exposition::Type::kHistogram);
    EXPECT_EQ(row.value != nullptr, row.histogram == nullptr);
    if (row.name != nullptr) {
      EXPECT_TRUE(names.insert(row.name).second) << "two rows named " << row.name;
    }
    if (row.family == nullptr) continue;
    const std::string family = row.family;
    EXPECT_EQ(family.rfind("kvtier_", 0), 0u);
    if (row.type == Exposition::Type::kCounter) {
      EXPECT_EQ(family.substr(family.size() - 6), "_total");
    }
    auto [first, inserted] = first_of_family.emplace(family, &row);
    if (inserted) {
      EXPECT_NE(row.help, nullptr) << "a family's first row carries its help";
      continue;
    }
    EXPECT_EQ(row.help, nullptr) << "only a family's first row carries its help";
    EXPECT_EQ(row.type, first->second->type);
    EXPECT_EQ(row.scope, first->second->scope);
    EXPECT_NE(row.label.first, nullptr) << "rows of one family differ by a label";
    EXPECT_NE(first->second->label.first, nullptr) << "rows of one family differ by a label";
  }
}

}  // namespace
}  // namespace kvtier::daemon
