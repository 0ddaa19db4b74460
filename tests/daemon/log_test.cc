// kvtierd's log: LogLimited keeps what a peer can repeat to a line per key per second.
#include "log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace kvtier::daemon {
namespace {

// What `body` writes to stderr.
template <typename Body>
std::string Stderr(Body body) {
  const std::string path = ::testing::TempDir() + "kvtier-log-test.txt";
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  std::FILE* f = std::fopen(path.c_str(), "w");
  ::dup2(::fileno(f), STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::fclose(f);
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::remove(path.c_str());
  return s.str();
}

TEST(LogTest, LogLimitedWritesOneLinePerKeyPerSecondAndCountsTheRest) {
  SetLogLevel("info");
  const std::string burst = Stderr([] {
    for (int i = 0; i < 100; ++i) LogLimited(LogLevel::kWarn, "test a", "event a " + std::to_string(i));
    LogLimited(LogLevel::kWarn, "test b", "event b");  // Another key has its own second.
    LogLimited(LogLevel::kDebug, "test c", "not shown at info");
  });
  EXPECT_EQ(burst, "kvtierd: warn: event a 0\nkvtierd: warn: event b\n");

  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  const std::string later = Stderr([] {
    LogLimited(LogLevel::kWarn, "test a", "event a again");
    LogLimited(LogLevel::kWarn, "test a", "dropped");
  });
  EXPECT_EQ(later, "kvtierd: warn: event a again (99 similar suppressed)\n");
}

TEST(LogTest, AFloodThatStopsIsReportedWithItsCountASecondLater) {
  SetLogLevel("info");
  const std::string burst = Stderr([] {
    for (int i = 0; i < 50; ++i) LogLimited(LogLevel::kWarn, "test flush", "refused peer " + std::to_string(i));
    FlushLimitedLogs();  // Within the second: nothing yet.
  });
  EXPECT_EQ(burst, "kvtierd: warn: refused peer 0\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1050));
  const std::string flushed = Stderr([] {
    FlushLimitedLogs();
    FlushLimitedLogs();  // Once.
  });
  // (Other tests' keys may flush here too.)
  const std::string line =
      "kvtierd: warn: refused peer 49 (48 similar suppressed) (the last of a flood that stopped)\n";
  EXPECT_NE(flushed.find(line), std::string::npos) << flushed;
  EXPECT_EQ(flushed.find("refused peer"), flushed.rfind("refused peer")) << "once: " << flushed;
  const std::string next = Stderr([] { LogLimited(LogLevel::kWarn, "test flush", "refused peer again"); });
  EXPECT_EQ(next, "") << "the flushed line counts as the key's line of this second";
}

TEST(LogTest, PrintableKeepsPeerTextToOneShortPrintableLine) {
  EXPECT_EQ(Printable("worker-3"), "worker-3");
  EXPECT_EQ(Printable("a\nkvtierd: error: forged\x1b[2J"), "a?kvtierd: error: forged?[2J");
  EXPECT_EQ(Printable(std::string(4096, 'x')), std::string(64, 'x') + "...");
  EXPECT_EQ(Printable("\xc3\xa9t\xc3\xa9", 3), "??t...");
}

}  // namespace
}  // namespace kvtier::daemon
