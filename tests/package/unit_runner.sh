#!/bin/sh
# unit_runner.sh (installed as `systemctl` in the package test's Debian root,
# where systemd cannot run: no systemd is installed and the test's sandbox is
# not a booted system). It does what systemd would for the package's unit, from
# what the unit says, so that the README's commands run as written:
#   systemctl enable [--now] NAME   link it into the WantedBy= target, then start
#   systemctl start NAME            RuntimeDirectory= (RuntimeDirectoryMode=, owned
#                                   by User=/Group=), LimitNOFILE=, LimitMEMLOCK=,
#                                   then ExecStart= as User=/Group=; ready once
#                                   kvtierd logs that it listens (Type=notify's READY=1)
#   systemctl stop NAME             SIGTERM, wait (TimeoutStopSec=), remove the runtime directory
#   systemctl daemon-reload         nothing to do
# The daemon's log is /run/NAME.log, its pid /run/NAME.pid.
set -eu
key() { sed -n "s/^$1=//p" "$unit" | tail -1; }
now=0
cmd=$1; shift
[ "$cmd" = daemon-reload ] && exit 0
[ "${1:-}" = --now ] && { now=1; shift; }
name=${1%.service}
unit=/usr/lib/systemd/system/$name.service
[ -f "$unit" ] || { echo "systemctl (test): no unit $unit" >&2; exit 5; }
log=/run/$name.log pidfile=/run/$name.pid

start() {
  user=$(key User) group=$(key Group) dir=$(key RuntimeDirectory) mode=$(key RuntimeDirectoryMode)
  install -d -m "${mode:-0755}" -o "$user" -g "$group" "/run/$dir"
  nofile=$(key LimitNOFILE) memlock=$(key LimitMEMLOCK)
  [ "$memlock" = infinity ] && memlock=unlimited
  # ExecStart= as written (no quoting in kvtierd's), with the limits, as the unit's user.
  sh -c 'ulimit -n "$1"; ulimit -l "$2"; shift 2; exec setpriv --reuid "$1" --regid "$2" --init-groups -- $3' \
    start "$nofile" "$memlock" "$user" "$group" "$(key ExecStart)" >"$log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 300); do
    grep -q "ready: listening" "$log" && return 0
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { cat "$log" >&2; echo "systemctl (test): $name exited at start" >&2; exit 1; }
    sleep 0.1
  done
  echo "systemctl (test): $name not ready in 30 s" >&2
  exit 1
}

stop() {
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { echo "systemctl (test): $name did not stop in 30 s" >&2; exit 1; }
  rm -f "$pidfile"
  rm -rf "/run/$(key RuntimeDirectory)"
}

case "$cmd" in
  enable)
    target=$(key WantedBy)
    mkdir -p "/etc/systemd/system/$target.wants"
    ln -sf "$unit" "/etc/systemd/system/$target.wants/$name.service"
    [ "$now" = 1 ] && start ;;
  start) start ;;
  stop) stop ;;
  *) echo "systemctl (test): $cmd is not known here" >&2; exit 1 ;;
esac
exit 0
