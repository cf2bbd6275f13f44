#!/usr/bin/env bash
# Mounts (or unmounts) the XFS volume with reflink=1 that the tests fork on.
# Usage: scripts/test-volume.sh up|down [DIR]   (prints DIR on `up`; needs root)
set -euo pipefail
action=${1:?up or down}
dir=${2:-/var/lib/airlock-test-xfs}
image="$dir.img"
case "$action" in
  up)
    if [ "$(id -u)" -ne 0 ]; then
      echo "not root: tests will run on the copy fallback only" >&2
      exit 0
    fi
    mkdir -p "$dir"
    if ! mountpoint -q "$dir"; then
      rm -f "$image"
      install -m 600 /dev/null "$image"
      truncate -s 16G "$image"
      mkfs.xfs -q -m reflink=1 "$image"
      mount -o loop,noatime "$image" "$dir"
    fi
    chmod 0755 "$dir"
    echo "$dir"
    ;;
  down)
    if mountpoint -q "$dir"; then umount -l "$dir"; fi
    rm -f "$image"
    ;;
  *) echo "usage: $0 up|down [DIR]" >&2; exit 2 ;;
esac
