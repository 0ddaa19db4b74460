#!/usr/bin/env bash
# podman_shim.sh: `podman` for the README's image block (<!-- install: image -->),
# which image_test.sh runs as written on a machine that cannot run containers
# (docs/container.md, "The test"). buildah does what the block asks, in the
# test's storage, offline:
#   podman build ARGS...            buildah bud --isolation chroot ARGS..., on the
#                                   test's base, pip offline (PIP_ARGS=--no-index)
#   podman run --rm IMAGE [ARGS]    the image's entry point with ARGS, in a container
#                                   of IMAGE (chroot isolation), removed after
# Anything else fails. KVTIER_TEST_BUILDAH: buildah's global options (the
# storage); KVTIER_TEST_BASE: the base image, in place of debian:bookworm-slim.
set -euo pipefail
read -ra global <<<"$KVTIER_TEST_BUILDAH"
bud() { buildah "${global[@]}" "$@"; }
case "${1:-}" in
  build)
    shift
    exec buildah "${global[@]}" bud --isolation chroot --pull=never --quiet \
      --build-arg "BASE=$KVTIER_TEST_BASE" --build-arg PIP_ARGS=--no-index "$@"
    ;;
  run)
    if [ $# -lt 3 ] || [ "$2" != --rm ]; then echo "podman (test): only 'run --rm IMAGE [ARGS...]'" >&2; exit 2; fi
    image=$3
    shift 3
    read -ra entrypoint <<<"$(bud inspect --type image --format '{{range .Docker.Config.Entrypoint}}{{.}} {{end}}' "$image")"
    ctr=$(bud from --pull=never --quiet "$image")
    trap 'bud rm "$ctr" >/dev/null' EXIT
    bud run --isolation chroot "$ctr" -- "${entrypoint[@]}" "$@"
    ;;
  *)
    echo "podman (test): only build and run --rm" >&2
    exit 2
    ;;
esac
