#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a command on this source tree inside a fresh Debian root: a minimal
# system made with debootstrap from the same Debian release and mirror as
# this machine, with nothing in it but what tools/install_deps.sh installs.
# That proves the package list: a library, program or data file the build,
# the tests or the examples need but the list lacks fails here, even on a
# machine where earlier work installed it (libpmix-dev once slipped
# through that way).
#   usage: tools/fresh_root.sh COMMAND...   (as root; run from anywhere)
# The tree is copied to /src in the root (the files git knows, committed or
# not, and untracked ones it does not ignore); COMMAND runs there, after
# tools/install_deps.sh. The root is removed at the end. ZDIST_FRESH_KEEP=DIR
# keeps it in DIR instead, for a look.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "fresh_root: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
command -v debootstrap > /dev/null ||
  { echo "fresh_root: debootstrap is missing (tools/install_deps.sh installs it)" >&2; exit 1; }

# The release and mirror this machine installs from.
. /etc/os-release
suite=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*debian\/\{0,1\}\)$/\1/p' \
           /etc/apt/sources.list.d/*.sources 2> /dev/null | head -n 1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ { print $2; exit }' \
                               /etc/apt/sources.list 2> /dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

root=${ZDIST_FRESH_KEEP:-$(mktemp -d /tmp/zdist-root.XXXXXX)}
mkdir -p "$root"
# mktemp's 0700 would keep every user but root out of the whole root: the
# packages' own users (munge's postinst runs mungekey as munge) could not
# even run /bin/sh.
chmod 755 "$root"
mounted=()
cleanup() {
  local rc=$?
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R -l "${mounted[$i]}" 2> /dev/null || true
  done
  [ -n "${ZDIST_FRESH_KEEP:-}" ] || rm -rf --one-file-system "$root"
  exit $rc
}
trap cleanup EXIT

echo "fresh_root: debootstrap $suite from $mirror into $root"
start=$SECONDS
log=$(mktemp /tmp/zdist-debootstrap.XXXXXX)
if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$log" 2>&1; then
  tail -n 20 "$log" >&2
  rm -f "$log"
  echo "fresh_root: debootstrap failed (is $mirror reachable?)" >&2
  exit 1
fi
rm -f "$log"
echo "fresh_root: the root took $((SECONDS - start)) s"

# What a booted machine has: / a mount point (ip netns remounts it), /proc,
# /sys, /dev, a /run and a /tmp of its own; the host's name, its /etc/hosts
# (localhost, and the host's name, which Slurm's node list gives) and its
# resolver for apt. These are the machine's settings, not packages.
mount --bind "$root" "$root" && mounted+=("$root")
for m in proc sys dev; do
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount --rbind /sys "$root/sys"; mount --make-rslave "$root/sys" ;;
    dev) mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev" ;;
  esac
  mounted+=("$root/$m")
done
mount -t tmpfs tmpfs "$root/run" && mounted+=("$root/run")
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp" && mounted+=("$root/tmp")
cp /etc/resolv.conf /etc/hosts /etc/hostname "$root/etc/" 2> /dev/null || true
# The same sources as this machine (security updates included), so that
# package versions match what it would install.
if ls /etc/apt/sources.list.d/*.sources > /dev/null 2>&1; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
fi

mkdir -p "$root/src"
if git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
     xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
     tar --null -T - -cf -) | tar -C "$root/src" -xf -
else
  (cd "$src" && tar --exclude='./build*' -cf - .) | tar -C "$root/src" -xf -
fi

printf -v cmd '%q ' "$@"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c "cd /src && tools/install_deps.sh && $cmd"
