#!/bin/sh
# Fails when the config fuzzer's dictionary lacks a key kvtierd knows:
#   check_config_dict.sh KVTIERD DICT
# Every row of `kvtierd --config-keys` ("limits.lease_timeout_ms  (default ...")
# must appear in DICT as "lease_timeout_ms:".
set -eu
kvtierd=$1
dict=$2
keys=$("$kvtierd" --config-keys | awk '/^[^ ]/ { print $1 }' | sed 's/.*\.//')
[ -n "$keys" ] || { echo "kvtierd --config-keys listed no keys" >&2; exit 1; }
missing=
for k in $keys; do
  grep -qF "\"$k:\"" "$dict" || missing="$missing $k"
done
if [ -n "$missing" ]; then
  echo "$dict lacks these keys of kvtierd --config-keys (add a line \"KEY:\" for each):$missing" >&2
  exit 1
fi
echo "$(echo "$keys" | wc -l) keys, all in $dict"
