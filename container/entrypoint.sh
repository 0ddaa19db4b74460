#!/bin/sh
# kvtier-entrypoint: the container image's entry point (Containerfile), kvtierd
# without systemd. What kvtierd.service gets from systemd is the container
# runtime's job here: the socket's directory is a volume (/run/kvtier, where
# RuntimeDirectory= would put it), the user comes from the image's USER, the
# limits from --ulimit, restarts from --restart, the log is stderr.
#
#   kvtier-entrypoint                       kvtierd --config $KVTIER_CONFIG --socket $KVTIER_SOCKET
#   kvtier-entrypoint --log-level debug     the same, with these options added
#   kvtier-entrypoint cachectl status       any other command, as given
#
# kvtierd runs in the foreground as the container's main process (exec): the
# runtime's SIGTERM stops it cleanly, SIGHUP re-reads the configuration.
set -eu
config=${KVTIER_CONFIG:-/etc/kvtier/kvtierd.yaml}
socket=${KVTIER_SOCKET:-/run/kvtier/kvtierd.sock}

case "${1:-}" in
  "" | -*) set -- kvtierd --config "$config" --socket "$socket" "$@" ;;
  *) exec "$@" ;;
esac

# kvtierd would fail on these too; say what to do about them in a container.
dir=$(dirname "$socket")
if [ ! -d "$dir" ]; then
  echo "kvtier-entrypoint: the socket's directory $dir does not exist: mount the volume there (-v kvtier-run:$dir)" >&2
  exit 1
fi
if [ ! -w "$dir" ]; then
  echo "kvtier-entrypoint: uid $(id -u) cannot write the socket's directory $dir (owner $(stat -c %u:%g "$dir")," \
       "mode $(stat -c %a "$dir")): a bind-mounted directory must belong to the image's user" \
       "(chown $(id -u):$(id -g) it on the host), or use a named volume" >&2
  exit 1
fi
# libkvtier refuses a socket whose directory others may write, unless that
# directory is the socket owner's (anyone could have put the socket there).
case "$(stat -c %A "$dir")" in
  ?????w???? | ????????w?)
    if [ "$(stat -c %u "$dir")" != "$(id -u)" ]; then
      echo "kvtier-entrypoint: others may write $dir (owner $(stat -c %u "$dir"), mode $(stat -c %a "$dir")), so clients" \
           "would refuse its socket: use a directory of uid $(id -u), or one only it may write" >&2
      exit 1
    fi ;;
esac
if [ ! -r "$config" ]; then
  echo "kvtier-entrypoint: no configuration at $config (KVTIER_CONFIG names it; mount one with -v FILE:$config:ro)" >&2
  exit 1
fi
exec "$@"
