// Leases as the worker holds them: ending one, and waiting for or recording the
// GPU work around its blocks.
#include <utility>

#include "connection.h"
#include "kvtier/client.h"

namespace kvtier {
namespace client_internal {
namespace {

const GpuAttachment* GpuOf(const std::shared_ptr<const Attachment>& attachment) {
  return attachment ? attachment->gpu.get() : nullptr;
}

}  // namespace

LeaseHandle& LeaseHandle::operator=(LeaseHandle&& other) noexcept {
  if (this != &other) {
    (void)ReleaseHandle();
    connection_ = std::move(other.connection_);
    attachment_ = std::move(other.attachment_);
    generation_ = other.generation_;
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

Status LeaseHandle::ReleaseHandle(const WriterEvent* after) {
  if (id_ == 0) return Status::Ok();
  const uint64_t id = std::exchange(id_, 0);
  auto connection = connection_.lock();
  if (!connection) return Unavailable("the client that made the lease is gone");
  wire::ReleaseRequest req{id, std::nullopt};
  if (after != nullptr) {
    req.after_event = after->handle;
  } else if (const GpuAttachment* gpu = GpuOf(attachment_); gpu != nullptr && connection->Current(attachment_)) {
    // No event says when this process's GPU is done with the lease: wait for
    // all of it. A failed context runs no kernel any more either.
    (void)gpu->SynchronizeContext();
  }
  auto reply = connection->CallOn<wire::OkResponse>(generation_, "lease", req);
  return reply.ok() ? Status::Ok() : reply.status();
}

Status LeaseHandle::ReleaseAfterStream(void* stream) {
  if (id_ == 0) return Status::Ok();
  const GpuAttachment* gpu = GpuOf(attachment_);
  if (gpu == nullptr || !CheckConnection().ok()) return ReleaseHandle();
  auto event = gpu->TakeWriterEvent(attachment_);
  if (!event.ok()) return event.status();
  KVTIER_RETURN_IF_ERROR(gpu->RecordWriterEvent(**event, static_cast<CUstream>(stream)));
  return ReleaseHandle(event->get());
}

Status LeaseHandle::CheckConnection() const {
  auto connection = connection_.lock();
  if (!connection) return Unavailable("the client that made the lease is gone");
  if (!connection->Current(attachment_)) {
    return Unavailable(
        "the lease ended with its connection to kvtierd (the client reconnected since): its fence "
        "and blocks are the old daemon's");
  }
  return Status::Ok();
}

}  // namespace client_internal

Status Lease::Wait(std::chrono::milliseconds timeout) const {
  if (!attachment_) return Status::Ok();
  KVTIER_RETURN_IF_ERROR(CheckConnection());
  return attachment_->WaitCompleted(fence_, timeout);
}

Status Lease::WaitOnStream(void* stream, std::chrono::milliseconds host_timeout) const {
  if (!attachment_) return Status::Ok();
  // Never a wait on a dead exporter's event, or on blocks of a pool another daemon freed.
  KVTIER_RETURN_IF_ERROR(CheckConnection());
  if (fence_.IsNull() || attachment_->Completed(fence_.stream) >= fence_.seq) return Status::Ok();
  const client_internal::GpuAttachment* gpu = attachment_->gpu.get();
  if (gpu == nullptr || !gpu->HasFenceEvent(fence_)) return attachment_->WaitCompleted(fence_, host_timeout);
  return gpu->StreamWait(fence_, static_cast<client_internal::CUstream>(stream));
}

Status WriteLease::RecordWritten(void* stream) {
  if (!attachment_ || id_ == 0) return FailedPrecondition("RecordWritten on a released write lease");
  const client_internal::GpuAttachment* gpu = attachment_->gpu.get();
  if (gpu == nullptr) {
    return FailedPrecondition(std::string("RecordWritten: kvtierd runs the ") +
                              wire::BackendKindName(attachment_->welcome.backend) +
                              " backend, whose blocks the CPU writes; there is no GPU work to record");
  }
  if (!writer_event_) {
    auto e = gpu->TakeWriterEvent(attachment_);
    if (!e.ok()) return e.status();
    writer_event_ = std::move(e).value();
  }
  return gpu->RecordWriterEvent(*writer_event_, static_cast<client_internal::CUstream>(stream));
}

}  // namespace kvtier
