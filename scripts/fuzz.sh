#!/usr/bin/env bash
# Builds kvtier's libFuzzer targets with Clang (build-fuzz/, -fsanitize=fuzzer,address,undefined)
# and runs each for N seconds on a scratch copy of its checked-in corpus.
#   scripts/fuzz.sh                       every target, 60 s each
#   scripts/fuzz.sh --seconds 300 config  one target, 5 minutes
# Targets: frame (wire decoder), config (kvtierd's YAML parser), index (the client's
# shared-memory index reader). Prints the executions per target; a crash stops the run
# with the reproducer under build-fuzz/artifacts/ and exit status 1. To keep an input
# that found a bug, fix the bug and copy the reproducer into tests/fuzz/corpus/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    frame|config|index) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (targets: frame config index)" >&2; exit 2 ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ ]] && ((seconds > 0)) || { echo "fuzz.sh: --seconds must be a positive integer" >&2; exit 2; }
((${#targets[@]})) || targets=(frame config index)

[ -n "${KVTIER_SKIP_SETUP:-}" ] || scripts/setup.sh
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (scripts/setup.sh installs it)" >&2; exit 1; }

dir=build-fuzz
launcher=()
command -v ccache >/dev/null && [ -z "${CI:-}" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DKVTIER_BUILD_FUZZ=ON -DKVTIER_SANITIZE= -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_MODEL_WORKER=OFF \
  -DKVTIER_WITH_CUDA=OFF >/dev/null
cmake --build "$dir" --target "${targets[@]/#/kvtier-fuzz-}"

mkdir -p "$dir/artifacts"
summary=()
status=0
for t in "${targets[@]}"; do
  work="$dir/fuzz-corpus/$t"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$t"/* "$work"/
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$dir/artifacts/$t-")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  [ "$t" = index ] && args+=(-max_len=65536)
  log="$dir/fuzz-$t.log"
  echo "fuzz.sh: $t for ${seconds}s (log: $log)"
  rc=0
  "$dir/tests/fuzz/kvtier-fuzz-$t" "${args[@]}" "$work" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  line="$t: ${execs:-?} executions in ${seconds}s, ${cov:-cov: ?}, corpus $(ls "$work" | wc -l) inputs"
  if ((rc != 0)); then
    line+=" -- FAILED (exit $rc), see $log and $dir/artifacts/"
    tail -n 40 "$log" >&2
    status=1
  fi
  summary+=("$line")
  echo "fuzz.sh: $line"
done
echo "fuzz.sh: summary"
printf '  %s\n' "${summary[@]}"
exit "$status"
