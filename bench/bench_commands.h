// The subcommands of kvtier-bench. Each takes the arguments after its name and
// returns the process exit code; each prints progress lines and, as its last
// line of stdout, one JSON object with its figures.
#pragma once

namespace kvtier::bench {

// kvtier-bench engine [--quick]: key hashing, index lookups, prompt match, mover.
int RunEngineBench(int argc, char** argv);

// kvtier-bench ipc [--quick]: probe/acquire/commit through a real kvtierd, a bare
// socket round trip, and a 2 MiB read from redis vs kvtier's host tier.
int RunIpcBench(int argc, char** argv);
// One client process of the ipc run (started by RunIpcBench itself).
int RunIpcClient(int argc, char** argv);

// kvtier-bench e2e [--quick] [...]: the chat workload through kvtier-worker
// processes in each cache mode (kvtier, local, none); TTFT, hit rate, zero-reuse cost.
int RunE2eBench(int argc, char** argv);
// Fetches from the disk and Redis stores vs plain reads of the same bytes (store_bench.cc).
int RunStoreBench(int argc, char** argv);
// The same client workload against kvtierd with KV events on and off (events_bench.cc).
int RunEventsBench(int argc, char** argv);

// kvtier-bench gpu [--quick]: the CUDA backend's batch copy speed (2 MiB and 32 KiB
// blocks), one large pinned memcpy each way, and a 2k-token session promotion.
// Built only with the CUDA backend; exits 1 without a CUDA device.
int RunGpuBench(int argc, char** argv);

}  // namespace kvtier::bench
