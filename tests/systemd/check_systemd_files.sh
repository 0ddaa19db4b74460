#!/bin/sh
# check_systemd_files.sh unit VERIFY_COPY INSTALL_UNIT "EXPECTED_EXEC_START"
#   systemd-analyze verify accepts VERIFY_COPY (the unit with build-tree paths)
#   without printing a word about it, and INSTALL_UNIT starts EXPECTED_EXEC_START.
# check_systemd_files.sh sysusers FILE
#   systemd-sysusers, in a dry run on an empty root, would create user and group kvtier.
# Exits 77 (skipped) when the systemd tool it needs is not installed.
set -u

case "$1" in
unit)
  verify_copy=$2 install_unit=$3 exec_start=$4
  grep -qxF "ExecStart=$exec_start" "$install_unit" || {
    echo "FAIL: $install_unit does not say ExecStart=$exec_start:"; grep '^ExecStart=' "$install_unit"; exit 1; }
  # Both come from one template and differ in ExecStart only.
  if [ "$(grep -v '^ExecStart=' "$install_unit")" != "$(grep -v '^ExecStart=' "$verify_copy")" ]; then
    echo "FAIL: $verify_copy differs from $install_unit in more than ExecStart"; exit 1
  fi
  command -v systemd-analyze >/dev/null 2>&1 || { echo "SKIP: systemd-analyze is not installed"; exit 77; }
  # --man=no: no man page is looked up (a Documentation=man: page need not be
  # installed here). A unit's problems (an unknown key, a bad value) are
  # warnings with exit code 0, so any line naming the unit fails the check too.
  out=$(systemd-analyze verify --man=no "$verify_copy" 2>&1)
  rc=$?
  [ -n "$out" ] && echo "$out"
  if [ $rc -ne 0 ] || echo "$out" | grep -q 'kvtierd\.service'; then
    echo "FAIL: systemd-analyze verify $verify_copy (exit $rc)"; exit 1
  fi
  echo "ok: systemd-analyze verify $verify_copy"
  ;;
sysusers)
  file=$2
  command -v systemd-sysusers >/dev/null 2>&1 || { echo "SKIP: systemd-sysusers is not installed"; exit 77; }
  root=$(mktemp -d) || exit 1
  out=$(systemd-sysusers --dry-run --root="$root" "$file" 2>&1)
  rc=$?
  rm -rf "$root"
  echo "$out"
  [ $rc -eq 0 ] || { echo "FAIL: systemd-sysusers exited $rc"; exit 1; }
  echo "$out" | grep -q "Creating group 'kvtier'" || { echo "FAIL: no group kvtier"; exit 1; }
  echo "$out" | grep -q "Creating user 'kvtier'" || { echo "FAIL: no user kvtier"; exit 1; }
  ;;
*)
  echo "usage: $0 unit VERIFY_COPY INSTALL_UNIT EXEC_START | sysusers FILE"; exit 2
  ;;
esac
