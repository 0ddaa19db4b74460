// The subcommands of kvtier-bench. Each takes the arguments after its name and
// returns the process exit code; each prints progress lines and, as its last
// line of stdout, one JSON object with its figures.
#pragma once

namespace kvtier::bench {

// kvtier-bench engine [--quick]: key hashing, index lookups, prompt match, mover.
int RunEngineBench(int argc, char** argv);

}  // namespace kvtier::bench
