// Backend creation: the backend kvtierd runs, built from its configuration.
//
// `backend:` names the kind (tiering::ChooseBackend decides what auto means
// here); the instance name, the access settings and the pinning-progress report
// come from the rest of the configuration. This lives in the daemon rather than
// beside ChooseBackend because it reads DaemonConfig, reports to the log and to
// systemd, and links the CUDA backend, which itself depends on kvtier::tiering.
#pragma once

#include <memory>

#include "config/config.h"
#include "kvtier/status.h"
#include "kvtier/tiering/backend.h"
#include "kvtier/wire.h"

namespace kvtier::daemon {

// The backend named by `config.backend` (auto|host|cuda), logging which and
// why, or why it cannot run here: ChooseBackend's errors, kFailedPrecondition
// for cuda in a build without the CUDA backend, the backend's own failure.
Result<std::unique_ptr<tiering::Backend>> CreateBackend(const DaemonConfig& config);

}  // namespace kvtier::daemon
