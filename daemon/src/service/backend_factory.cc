// Building the configured backend (backend_factory.h).
#include "service/backend_factory.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "kvtier/tiering/backend_select.h"
#include "kvtier/tiering/host_backend.h"
#ifdef KVTIER_HAVE_CUDA_BACKEND
#include "kvtier/tiering/cuda_backend.h"
#endif
#include "log.h"
#include "notify.h"

namespace kvtier::daemon {

Result<std::unique_ptr<tiering::Backend>> CreateBackend(const DaemonConfig& config) {
  auto choice = tiering::ChooseBackend(config.backend);
  if (!choice.ok()) return choice.status();
  LogInfo(choice->reason);
  if (choice->kind == tiering::BackendKind::kCuda) {
#ifdef KVTIER_HAVE_CUDA_BACKEND
    tiering::CudaBackendOptions co;
    co.name_prefix = config.instance;
    // Pinning a large host tier takes seconds to minutes (288 GiB in the H200
    // example): say how far it got, in the log and to systemd, and keep
    // systemd's start timeout from running out while each chunk makes progress:
    // each pinned chunk (256 MiB, tens of milliseconds) extends it 60 s, so a
    // stalled pin still fails the start and a slow one does not.
    co.pin_progress = [last_percent = -1](const std::string& pool, size_t pinned, size_t total) mutable {
      notify::ExtendStartTimeout(std::chrono::seconds(60));
      const int percent = total == 0 ? 100 : static_cast<int>(pinned * 100 / total);
      if (percent / 10 == last_percent / 10 && pinned != total) return;
      last_percent = percent;
      const std::string line = "pinning host pool '" + pool + "': " + std::to_string(pinned >> 20) + " of " +
                               std::to_string(total >> 20) + " MiB (" + std::to_string(percent) + "%)";
      LogInfo(line);
      notify::SetStatus(line);
      if (pinned == total) last_percent = -1;
    };
    co.warn = [](const std::string& line) { LogWarn(line); };
    auto cuda = tiering::CreateCudaBackend(co);
    if (!cuda.ok()) return Status(cuda.status().code(), "backend cuda: " + cuda.status().message());
    LogInfo((*cuda)->Describe());
    return std::unique_ptr<tiering::Backend>(std::move(cuda).value());
#else
    return FailedPrecondition("backend: cuda: this kvtierd was built without the CUDA backend");
#endif
  }
  tiering::HostBackendOptions bo;
  bo.name_prefix = config.instance;
  bo.populate = config.prefault;
  auto host = tiering::CreateHostBackend(bo);
  if (!host.ok()) return host.status();
  return std::unique_ptr<tiering::Backend>(std::move(host).value());
}


}  // namespace kvtier::daemon
