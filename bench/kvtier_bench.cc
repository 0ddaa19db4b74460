// kvtier-bench: the benchmark driver. `kvtier-bench <subcommand> [options]`;
// each subcommand prints progress lines, then one JSON object as its last line.
#include <cstdio>
#include <cstring>

#include "bench_commands.h"

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

constexpr Subcommand kSubcommands[] = {
    {"engine", "key hashing, block-index lookups, 2k-token prompt match, host mover vs memcpy",
     kvtier::bench::RunEngineBench},
    {"ipc", "probe, acquire, commit through kvtierd (1 and 4 clients) vs a bare socket; 2 MiB read vs redis",
     kvtier::bench::RunIpcBench},
    {"e2e", "chat workload through kvtier-worker processes: TTFT with kvtier vs in-process cache vs recompute",
     kvtier::bench::RunE2eBench},
    {"stores", "2 MiB blocks fetched from the disk and Redis stores vs plain O_DIRECT reads and pipelined GETs",
     kvtier::bench::RunStoreBench},
    {"events", "a workload against kvtierd with KV events on (and a subscriber) vs off, rounds interleaved",
     kvtier::bench::RunEventsBench},
#ifdef KVTIER_BENCH_GPU
    {"gpu", "CUDA backend: batch copies of 2 MiB and 32 KiB blocks, peak memcpy, 2k-token promotion",
     kvtier::bench::RunGpuBench},
#endif
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "usage: kvtier-bench <subcommand> [options]\n"
               "       kvtier-bench <subcommand> --help\n\n"
               "Runs one benchmark. Progress goes to stdout; the last line is one JSON object\n"
               "with the measured figures.\n\n"
               "subcommands:\n");
  for (const Subcommand& s : kSubcommands) std::fprintf(out, "  %-8s %s\n", s.name, s.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    PrintUsage(stdout);
    return 0;
  }
  for (const Subcommand& s : kSubcommands) {
    if (!std::strcmp(argv[1], s.name)) return s.run(argc - 2, argv + 2);
  }
  if (!std::strcmp(argv[1], "ipc-client")) return kvtier::bench::RunIpcClient(argc - 2, argv + 2);
  std::fprintf(stderr, "kvtier-bench: unknown subcommand '%s' (try --help)\n", argv[1]);
  return 2;
}
