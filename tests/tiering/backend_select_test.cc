// Backend choice from the `backend:` configuration value, and the GPU pool
// handle's encoding (both pure C++; this runs with or without a GPU).
#include "kvtier/tiering/backend_select.h"

#include <gtest/gtest.h>


namespace kvtier::tiering {
namespace {

GpuInfo WithDevice() {
  GpuInfo g;
  g.built_with_cuda = true;
  g.devices = 1;
  g.device_name = "NVIDIA H200";
  g.ipc_events = true;
  return g;
}

GpuInfo NoDevice() {
  GpuInfo g;
  g.built_with_cuda = true;
  g.error = "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected";
  return g;
}

TEST(BackendSelectTest, AutoPicksCudaOnlyWithADevice) {
  auto with = ChooseBackend("auto", WithDevice());
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->kind, BackendKind::kCuda);
  EXPECT_NE(with->reason.find("NVIDIA H200"), std::string::npos) << with->reason;

  auto without = ChooseBackend("auto", NoDevice());
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->kind, BackendKind::kHost);
  EXPECT_NE(without->reason.find("cudaErrorNoDevice"), std::string::npos) << without->reason;

  auto not_built = ChooseBackend("auto", GpuInfo{});
  ASSERT_TRUE(not_built.ok());
  EXPECT_EQ(not_built->kind, BackendKind::kHost);
}

TEST(BackendSelectTest, CudaWithoutADeviceIsAClearError) {
  auto r = ChooseBackend("cuda", NoDevice());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message().rfind("backend: cuda: no CUDA device found (cudaGetDeviceCount: ", 0), 0u)
      << r.status().message();

  auto not_built = ChooseBackend("cuda", GpuInfo{});
  ASSERT_FALSE(not_built.ok());
  EXPECT_NE(not_built.status().message().find("KVTIER_WITH_CUDA"), std::string::npos);

  auto ok = ChooseBackend("cuda", WithDevice());
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->kind, BackendKind::kCuda);
}

// A device without interprocess events (WSL, some virtualized GPUs) cannot
// serve other processes through the cuda backend: auto falls back to host and
// says why; cuda is refused with the reason.
TEST(BackendSelectTest, ADeviceWithoutIpcEventsFallsBackToHost) {
  GpuInfo g = WithDevice();
  g.ipc_events = false;
  auto a = ChooseBackend("auto", g);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, BackendKind::kHost);
  EXPECT_NE(a->reason.find("NVIDIA H200 does not support interprocess events"), std::string::npos) << a->reason;
  auto c = ChooseBackend("cuda", g);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("cudaDevAttrIpcEventSupport"), std::string::npos) << c.status().message();
}

TEST(BackendSelectTest, HostIsAlwaysHostAndOtherValuesAreRejected) {
  auto r = ChooseBackend("host", WithDevice());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, BackendKind::kHost);
  EXPECT_EQ(ChooseBackend("gpu", WithDevice()).status().code(), StatusCode::kInvalidArgument);
}

// On this machine: whatever DetectGpu finds, auto and cuda agree with it.
TEST(BackendSelectTest, RealDetectionIsConsistent) {
  const GpuInfo gpu = DetectGpu();
  auto a = ChooseBackend("auto");
  ASSERT_TRUE(a.ok());
  auto c = ChooseBackend("cuda");
  if (gpu.built_with_cuda && gpu.devices > 0 && gpu.ipc_events) {
    EXPECT_EQ(a->kind, BackendKind::kCuda);
    EXPECT_TRUE(c.ok());
  } else {
    EXPECT_EQ(a->kind, BackendKind::kHost) << a->reason;
    ASSERT_FALSE(c.ok());
    EXPECT_TRUE(!gpu.error.empty() || (gpu.devices > 0 && !gpu.ipc_events));
    std::printf("no GPU here: auto -> %s; cuda -> %s\n", a->reason.c_str(), c.status().ToString().c_str());
  }
}

}  // namespace
}  // namespace kvtier::tiering
