// The small kvtierd configuration the multi-process tests run with.
#pragma once

namespace kvtier::testing {

// One profile of 8 KiB blocks; 256 GPU and 1024 host slots. DaemonProcess adds
// the instance name and socket.
inline constexpr const char* kSmallDaemonConfig = R"(backend: host
log_level: info
profiles:
  - name: it
    layers: 2
    kv_heads: 2
    head_dim: 32
    dtype: fp16
    block_tokens: 16
    gpu_blocks: 256
    host_blocks: 1024
)";

}  // namespace kvtier::testing
