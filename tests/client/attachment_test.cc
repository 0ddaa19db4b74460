// Attachment: a Welcome's segments as a client maps them (host backend) — each
// checked against what the Welcome announced, mapped with the access the
// client may have, and the fences read from the mapped segment.
#include "attachment.h"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "scripted_server.h"

namespace kvtier::client_internal {
namespace {

using std::chrono::milliseconds;

// The permissions ("r--s", "rw-s") of the mapping that holds `p` in this process.
std::string MappingPermissions(const void* p) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return "";
  const auto addr = reinterpret_cast<uintptr_t>(p);
  char line[512];
  std::string perms;
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    uintptr_t lo = 0, hi = 0;
    char prm[5] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, prm) == 3 && addr >= lo && addr < hi) {
      perms = prm;
      break;
    }
  }
  std::fclose(maps);
  return perms;
}

Result<std::shared_ptr<const Attachment>> MapAll(const WelcomeSegments& segs, bool open_gpu = true) {
  const std::vector<int> fds = segs.fds();
  return Attachment::Map(segs.welcome, fds, open_gpu);
}

TEST(AttachmentTest, MapsTheSegmentsAWelcomeDescribes) {
  WelcomeSegments segs(/*instance_id=*/42);
  std::memset(segs.host.data() + 2 * 512, 0x5A, 512);  // Host slot 2, as the daemon wrote it.
  auto att = MapAll(segs);
  ASSERT_TRUE(att.ok()) << att.status().ToString();
  const Attachment& a = **att;
  EXPECT_TRUE(a.gpu_open);
  EXPECT_EQ(a.welcome, segs.welcome);
  EXPECT_EQ(a.pool(Tier::kHost).slots, WelcomeSegments::kHostSlots);
  EXPECT_EQ(a.index.header().instance_id, 42u);
  EXPECT_EQ(a.index.block_tokens(), 4u);
  EXPECT_EQ(a.SlotData(Tier::kHost, 2)[0], std::byte{0x5A});
  EXPECT_EQ(a.SlotData(Tier::kHost, 2)[511], std::byte{0x5A});
  // Workers write their write leases' blocks into the GPU tier: the daemon sees them.
  std::memset(a.SlotData(Tier::kGpu, 3), 0x33, 512);
  EXPECT_EQ(segs.gpu.data()[3 * 512], std::byte{0x33});
  EXPECT_EQ(segs.gpu.data()[3 * 512 + 511], std::byte{0x33});
  EXPECT_EQ(segs.gpu.data()[2 * 512 + 511], std::byte{0}) << "slot 3, not 2";
}

// Only the GPU pool of the host backend is writable: the host tier, the index
// and the fences are kvtierd's to write.
TEST(AttachmentTest, OnlyTheGpuPoolIsMappedWritable) {
  WelcomeSegments segs;
  auto att = MapAll(segs);
  ASSERT_TRUE(att.ok()) << att.status().ToString();
  const Attachment& a = **att;
  EXPECT_EQ(MappingPermissions(a.pools[Tier::kGpu].data()).substr(0, 2), "rw");
  EXPECT_EQ(MappingPermissions(a.pools[Tier::kHost].data()).substr(0, 2), "r-");
  EXPECT_EQ(MappingPermissions(a.index_segment.data()).substr(0, 2), "r-");
  EXPECT_EQ(MappingPermissions(a.fence_segment.data()).substr(0, 2), "r-");
}

// A client that never touches KV bytes leaves the GPU tier unmapped; its
// descriptor is still taken, so the others line up.
TEST(AttachmentTest, WithoutOpenGpuTheGpuTierIsLeftUnmapped) {
  WelcomeSegments segs;
  auto att = MapAll(segs, /*open_gpu=*/false);
  ASSERT_TRUE(att.ok()) << att.status().ToString();
  const Attachment& a = **att;
  EXPECT_FALSE(a.gpu_open);
  EXPECT_FALSE(a.pools[Tier::kGpu].valid());
  EXPECT_EQ(a.SlotData(Tier::kGpu, 0), nullptr);
  EXPECT_NE(a.SlotData(Tier::kHost, 0), nullptr);
  EXPECT_EQ(a.fences->magic, kFenceMagic);
}

// Fences are read from the segment kvtierd publishes, per stream.
TEST(AttachmentTest, FencesCompleteAsTheDaemonPublishesThem) {
  WelcomeSegments segs;
  auto att = MapAll(segs);
  ASSERT_TRUE(att.ok()) << att.status().ToString();
  const Attachment& a = **att;
  const Fence up{2, CopyDirection::kHostToGpu};
  EXPECT_TRUE(a.WaitCompleted(Fence{}, milliseconds(0)).ok()) << "the null fence";
  EXPECT_EQ(a.Completed(CopyDirection::kHostToGpu), 0u);
  const Status pending = a.WaitCompleted(up, milliseconds(0));
  EXPECT_EQ(pending.code(), StatusCode::kTimeout);
  EXPECT_NE(pending.message().find("copy fence 2 still pending"), std::string::npos) << pending.message();
  segs.fence_state()->completed[static_cast<int>(CopyDirection::kGpuToHost)] = 9;
  EXPECT_EQ(a.WaitCompleted(up, milliseconds(0)).code(), StatusCode::kTimeout) << "the other stream";
  segs.fence_state()->completed[static_cast<int>(CopyDirection::kHostToGpu)] = 1;
  EXPECT_EQ(a.WaitCompleted(up, milliseconds(0)).code(), StatusCode::kTimeout) << "batch 1 is not batch 2";
  segs.fence_state()->completed[static_cast<int>(CopyDirection::kHostToGpu)] = 2;
  EXPECT_EQ(a.Completed(CopyDirection::kHostToGpu), 2u);
  EXPECT_TRUE(a.WaitCompleted(up, milliseconds(0)).ok());
  EXPECT_TRUE(a.WaitCompleted(Fence{1, CopyDirection::kHostToGpu}, milliseconds(0)).ok());
}

// A Welcome, or the descriptors with it, that does not match what it announces.
struct BadWelcome {
  const char* name;
  std::function<void(WelcomeSegments&, wire::Welcome&, std::vector<int>&)> spoil;
  StatusCode code;
  const char* message;  // A part of the error's message.
};

void PrintTo(const BadWelcome& b, std::ostream* os) { *os << b.name; }

class AttachmentRefusesTest : public ::testing::TestWithParam<BadWelcome> {};

TEST_P(AttachmentRefusesTest, AndSaysWhy) {
  WelcomeSegments segs;
  wire::Welcome welcome = segs.welcome;
  std::vector<int> fds = segs.fds();
  GetParam().spoil(segs, welcome, fds);
  auto att = Attachment::Map(welcome, fds);
  ASSERT_FALSE(att.ok());
  EXPECT_EQ(att.status().code(), GetParam().code) << att.status().ToString();
  EXPECT_NE(att.status().message().find(GetParam().message), std::string::npos) << att.status().message();
}

using W = wire::Welcome;
using Fds = std::vector<int>;

INSTANTIATE_TEST_SUITE_P(
    Welcomes, AttachmentRefusesTest,
    ::testing::Values(
        BadWelcome{"FenceEventsFromAHostBackend",
                   [](WelcomeSegments&, W& w, Fds&) { w.fence_events.resize(1); }, StatusCode::kProtocolError,
                   "fence events from a host backend"},
        BadWelcome{"OnePool", [](WelcomeSegments&, W& w, Fds&) { w.pools.pop_back(); }, StatusCode::kProtocolError,
                   "must describe 2 pools"},
        BadWelcome{"PoolsOutOfOrder", [](WelcomeSegments&, W& w, Fds&) { std::swap(w.pools[0], w.pools[1]); },
                   StatusCode::kProtocolError, "out of order"},
        BadWelcome{"SlotsOfAnotherSize", [](WelcomeSegments&, W& w, Fds&) { w.pools[1].slot_bytes = 256; },
                   StatusCode::kProtocolError, "slot size does not match the profile"},
        BadWelcome{"AnIpcHandleOnTheHostBackend", [](WelcomeSegments&, W& w, Fds&) { w.pools[1].ipc_handle = {1}; },
                   StatusCode::kProtocolError, "an IPC handle for a pool of the host backend"},
        BadWelcome{"MoreSlotsThanTheSegmentHolds", [](WelcomeSegments&, W& w, Fds&) { w.pools[1].slots *= 2; },
                   StatusCode::kCorrupt, "mapping pool"},
        BadWelcome{"NoDescriptorForTheFences", [](WelcomeSegments&, W&, Fds& f) { f.pop_back(); },
                   StatusCode::kProtocolError, "without a descriptor for the fences"},
        BadWelcome{"NoDescriptorAtAll", [](WelcomeSegments&, W&, Fds& f) { f.clear(); }, StatusCode::kProtocolError,
                   "without a descriptor for pool gpu"},
        BadWelcome{"ADescriptorTooMany", [](WelcomeSegments& s, W&, Fds& f) { f.push_back(s.fences.share_fd()); },
                   StatusCode::kProtocolError, "more segment descriptors than it describes"},
        BadWelcome{"TheFencesWhereTheIndexBelongs", [](WelcomeSegments&, W&, Fds& f) { std::swap(f[2], f[3]); },
                   StatusCode::kCorrupt, "index segment smaller than its header"},
        BadWelcome{"AnIndexOfAnotherProfile",
                   [](WelcomeSegments& s, W&, Fds&) {
                     reinterpret_cast<IndexHeader*>(s.index.data())->profile_fingerprint ^= 1;
                   },
                   StatusCode::kCorrupt, "does not belong to the announced profile"},
        BadWelcome{"AnIndexOfAnotherAbi",
                   [](WelcomeSegments& s, W&, Fds&) { reinterpret_cast<IndexHeader*>(s.index.data())->abi_version = 99; },
                   StatusCode::kVersionMismatch, "index ABI version 99"},
        BadWelcome{"FencesWithABadMagic", [](WelcomeSegments& s, W&, Fds&) { s.fence_state()->magic = 0; },
                   StatusCode::kCorrupt, "fence segment has a bad magic number"}),
    [](const ::testing::TestParamInfo<BadWelcome>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace kvtier::client_internal
