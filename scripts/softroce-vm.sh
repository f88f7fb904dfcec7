#!/usr/bin/env bash
# softroce-vm.sh - run a command inside a throw-away qemu VM that boots
# Debian's stock kernel with two soft-RoCE devices, rxe0 <-> rxe1.
#
#   scripts/softroce-vm.sh [--] COMMAND [ARGS...]  run COMMAND in the VM; exit with its code
#   scripts/softroce-vm.sh --prepare               install qemu, build the guest image (cached)
#
# Why a VM: the machines strata is developed and tested on run kernels
# without RDMA (ibv_get_device_list: ENOSYS). Debian's kernel ships rdma_rxe
# (soft-RoCE), which does real verbs, RDMA READ included, over an Ethernet
# device. The guest is an initramfs of Debian packages (no disk image, no
# debootstrap) and has no network at all (-nic none): only two 9p shares.
#
# In the VM: rxe0 on veth0 10.11.0.1, rxe1 on veth1 10.11.0.2, exported as
# SOFTROCE_DEV0/1, SOFTROCE_IP0/1 and SOFTROCE_GID0/1 (RoCEv2 GID index).
# The repository is mounted read-write at the same path as on the host and
# COMMAND runs in the current directory.
#
# Settings (environment):
#   STRATA_SOFTROCE_DIR      cache          (~/.cache/strata-softroce)
#   STRATA_SOFTROCE_SMP      vCPUs          (nproc)
#   STRATA_SOFTROCE_MEM      guest MiB      (2048)
#   STRATA_SOFTROCE_TIMEOUT  seconds before qemu is killed (900)
#   STRATA_SOFTROCE_VERBOSE  1 = print the serial console too
# Variables named RUST_*, CARGO*, STRATA_* and SOFTROCE_* are passed in.
#
# Exit codes besides COMMAND's: 124 timeout, 125 VM or setup failure,
# 97 rxe setup failed in the guest, 98 the repository share did not mount.
#
# Facts this is built on (measured on the project's CI machines):
# - /dev/kvm there is kvm_pvm, which cannot boot a stock kernel: use TCG.
# - qemu-system-x86 from stable conflicts with a qemu-utils from backports:
#   install with --no-remove, from backports when stable is refused.
# - rxe (Linux 6.1) works only in the init network namespace, so both ends
#   of the veth pair stay there; policy routing makes traffic between the
#   two local addresses cross the wire (via lo, rxe would drop it).
# - veth drops RDMA READ bursts at the default netdev_max_backlog.
# - busybox's shell prefers its own applets over PATH: dash is /bin/sh.
set -euo pipefail

DIR=${STRATA_SOFTROCE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata-softroce}
SMP=${STRATA_SOFTROCE_SMP:-$(nproc)}
MEM=${STRATA_SOFTROCE_MEM:-2048}
TIMEOUT=${STRATA_SOFTROCE_TIMEOUT:-900}
VERBOSE=${STRATA_SOFTROCE_VERBOSE:-0}
IMAGE_REV=1
# python3: the Python SDK's RDMA test (python/tests/rdma/vm_sdk.py).
GUEST_PKGS="ibverbs-utils ibverbs-providers perftest iproute2 dash bash procps python3"
# needed only to manage packages or log in, never at run time
SKIP='adduser|cdebconf|debconf|dpkg|install-info|passwd|libdebian-installer4|libnewt0.52|libslang2|libtextwrap1|tar|libpam-modules|libpam-modules-bin|libpam0g|libsemanage2|libsemanage-common|libsepol2|libaudit1|libaudit-common|libcap2-bin|perl-base'
MODULES="crc32_generic crc32c_generic rdma_rxe ib_uverbs veth virtio_pci 9pnet_virtio 9p"
APT=(apt-get -q -o APT::Sandbox::User=root)
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

T0=$(date +%s)
log() { printf '[softroce-vm %3ds] %s\n' $(( $(date +%s) - T0 )) "$*" >&2; }
die() { log "ERROR: $*"; exit 125; }
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

apt_updated=0
apt_update() { [ $apt_updated = 1 ] || { $SUDO "${APT[@]}" update >/dev/null; apt_updated=1; }; }

# --- host tools ---------------------------------------------------------------
install_host_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  command -v depmod >/dev/null || need+=(kmod)
  command -v cpio >/dev/null || need+=(cpio)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v readelf >/dev/null || need+=(binutils)
  [ ${#need[@]} -gt 0 ] || return 0
  apt_update
  log "installing ${need[*]}"
  # --no-remove: apt would otherwise resolve qemu-utils' Breaks by REMOVING it
  if $SUDO "${APT[@]}" install -y --no-install-recommends --no-remove "${need[@]}" >"$DIR/apt.log" 2>&1; then
    return 0
  fi
  log "stable refused ($(grep -m1 '^E:' "$DIR/apt.log" || true)); trying $(codename)-backports"
  local list=/etc/apt/sources.list.d/strata-softroce-backports.list
  if ! apt-cache policy 2>/dev/null | grep -q -- "$(codename)-backports"; then
    echo "deb http://deb.debian.org/debian $(codename)-backports main" | $SUDO tee "$list" >/dev/null
    $SUDO "${APT[@]}" update >/dev/null
  fi
  $SUDO "${APT[@]}" install -y --no-install-recommends --no-remove -t "$(codename)-backports" "${need[@]}" \
    >>"$DIR/apt.log" 2>&1 || { tail -20 "$DIR/apt.log" >&2; die "cannot install ${need[*]}"; }
}
codename() { (. /etc/os-release; echo "$VERSION_CODENAME"); }

# --- guest image ----------------------------------------------------------------
write_guest_files() {   # $1 = rootfs
  local R=$1
  mkdir -p "$R"/{proc,sys,dev,tmp,run,root,job,etc/softroce,usr/local/sbin}
  echo "$MODULES" > "$R/etc/softroce/modules"
  cat > "$R/init" <<'INIT'
#!/bin/sh
# PID 1: mount, load modules, set up rxe0/rxe1, run /job/cmd.sh, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
say() { echo "[vm $(cut -d' ' -f1 /proc/uptime)s] $*"; }
finish() { echo "$1" > /job/rc; sync; say "exit code $1"; umount -a -t 9p 2>/dev/null; poweroff -f; }
for m in $(cat /etc/softroce/modules); do modprobe "$m" || say "modprobe $m failed"; done
O="trans=virtio,version=9p2000.L,msize=262144"
i=0; until mount -t 9p -o $O job /job 2>/dev/null; do
  i=$((i+1)); [ $i -lt 100 ] || { say "no job share"; poweroff -f; }; sleep 0.1; done
repo=$(cat /job/repo_path); mkdir -p "$repo"
mount -t 9p -o $O repo "$repo" || { say "cannot mount the repository at $repo"; finish 98; }
. /job/env
softroce-setup > /tmp/setup.log 2>&1 || { cat /tmp/setup.log; say "rxe setup failed"; finish 97; }
export SOFTROCE_DEV0=rxe0 SOFTROCE_DEV1=rxe1 SOFTROCE_IP0=10.11.0.1 SOFTROCE_IP1=10.11.0.2
export SOFTROCE_GID0=$(softroce-gid-index rxe0) SOFTROCE_GID1=$(softroce-gid-index rxe1)
ulimit -l unlimited
say "rxe0/rxe1 up (gid index $SOFTROCE_GID0/$SOFTROCE_GID1), running the command"
/bin/sh /job/cmd.sh > /job/output.log 2>&1 < /dev/null
finish $?
INIT
  cat > "$R/usr/local/sbin/softroce-setup" <<'SETUP'
#!/bin/sh
# rxe0 on veth0 (10.11.0.1) <-> rxe1 on veth1 (10.11.0.2), one namespace.
set -e
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.11.0.1/24 dev veth0
ip addr add 10.11.0.2/24 dev veth1
ip link set veth0 up; ip link set veth1 up
echo 65536 > /proc/sys/net/core/netdev_max_backlog
echo 1 > /proc/sys/net/ipv4/conf/all/accept_local
for d in all default veth0 veth1; do echo 0 > /proc/sys/net/ipv4/conf/$d/rp_filter; done
# Send to the other end out of the veth, not via lo: look up per-device
# tables before the local table.
ip route add 10.11.0.2/32 dev veth0 src 10.11.0.1 table 100
ip route add 10.11.0.1/32 dev veth1 src 10.11.0.2 table 101
ip rule add pref 100 oif veth0 lookup 100
ip rule add pref 101 oif veth1 lookup 101
ip rule add pref 1000 lookup local
ip rule del pref 0
ip neigh replace 10.11.0.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
ip neigh replace 10.11.0.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
rdma link add rxe0 type rxe netdev veth0
rdma link add rxe1 type rxe netdev veth1
i=0
until softroce-gid-index rxe0 >/dev/null && softroce-gid-index rxe1 >/dev/null; do
  i=$((i+1)); [ $i -lt 100 ] || { echo "no IPv4 GID on rxe0/rxe1" >&2; exit 1; }; sleep 0.1
done
SETUP
  cat > "$R/usr/local/sbin/softroce-gid-index" <<'GID'
#!/bin/sh
# index of the IPv4-mapped (RoCEv2) GID of device $1, port 1
for f in /sys/class/infiniband/$1/ports/1/gids/*; do
  case "$(cat "$f" 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) basename "$f"; exit 0;; esac
done
exit 1
GID
  chmod 755 "$R/init" "$R"/usr/local/sbin/*
}

# The uncompressed kernel boots through its PVH entry, skipping real mode
# and in-guest decompression (seconds under TCG). Payload offset and size
# come from the x86 boot header.
extract_vmlinux() {   # $1 = bzImage, $2 = output
  local sects off len magic
  sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$1" | tr -d ' '); [ "$sects" -gt 0 ] || sects=4
  off=$(( (sects + 1) * 512 + $(od -An -tu4 -j $((0x248)) -N4 "$1" | tr -d ' ') ))
  len=$(od -An -tu4 -j $((0x24c)) -N4 "$1" | tr -d ' ')
  magic=$(od -An -tx1 -j "$off" -N4 "$1" | tr -d ' ')
  payload() { dd if="$1" iflag=skip_bytes,count_bytes skip="$off" count="$len" bs=1M status=none; }
  case "$magic" in
    fd377a58) payload "$1" | xz -dc --single-stream > "$2" ;;
    28b52ffd) payload "$1" | zstd -dcq > "$2" ;;
    1f8b*) payload "$1" | gzip -dc > "$2" ;;
    *) return 1 ;;
  esac || return 1
  readelf -n "$2" 2>/dev/null | grep -q 'note type: (0x00000012)'   # XEN_ELFNOTE_PHYS32_ENTRY
}

build_image() {   # $1 = image dir
  local img=$1 b="$DIR/build" kpkg kv pkgs p m rel
  rm -rf "$b"; mkdir -p "$b/kernel" "$b/root" "$b/debs"
  apt_update
  kpkg=$(apt-cache depends linux-image-amd64 | awk '$1=="Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64"
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances --no-pre-depends $GUEST_PKGS | grep -E '^[a-z0-9]' | sort -u | grep -vxE "$SKIP")
  log "downloading $kpkg, busybox-static and $(echo $pkgs | wc -w) packages"
  (cd "$b/debs" && "${APT[@]}" download "$kpkg" busybox-static $pkgs >/dev/null)
  dpkg-deb -x "$(ls "$b/debs/${kpkg}"_*.deb)" "$b/kernel"
  kv=${kpkg#linux-image-}
  for p in busybox-static $pkgs; do dpkg-deb -x "$(ls "$b/debs/${p}"_*.deb)" "$b/root"; done
  # only the modules we load, and what they depend on
  depmod -b "$b/kernel" "$kv"
  for m in $MODULES; do
    modprobe -d "$b/kernel" -S "$kv" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | sort -u | while read -r m; do
    rel=${m#"$b/kernel/"}; mkdir -p "$b/root/$(dirname "$rel")"; cp "$m" "$b/root/$rel"
  done
  cp "$b/kernel/lib/modules/$kv"/modules.{order,builtin,builtin.modinfo} "$b/root/lib/modules/$kv/"
  depmod -b "$b/root" "$kv"
  ln -sf dash "$b/root/bin/sh"
  for p in $("$b/root/bin/busybox" --list-full); do
    [ -e "$b/root/$p" ] || [ -L "$b/root/$p" ] || { mkdir -p "$b/root/$(dirname "$p")"; ln -s /bin/busybox "$b/root/$p"; }
  done
  rm -rf "$b"/root/usr/share/{doc,man,info,locale,lintian,bug,bash-completion}
  write_guest_files "$b/root"
  rm -rf "$img.tmp"; mkdir -p "$img.tmp"
  (cd "$b/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$img.tmp/initrd.cpio"
  cp "$b/kernel/boot/vmlinuz-$kv" "$img.tmp/vmlinuz"
  extract_vmlinux "$img.tmp/vmlinuz" "$img.tmp/vmlinux" || rm -f "$img.tmp/vmlinux"
  rm -rf "$img"; mv "$img.tmp" "$img"; rm -rf "$b"
  log "image ready: $img ($(du -sh "$img/initrd.cpio" | cut -f1), kernel $kv)"
}

prepare() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"; flock 9
  install_host_tools
  IMG="$DIR/image-$( { echo "$IMAGE_REV $GUEST_PKGS $MODULES"; sed -n '/^write_guest_files()/,/^}/p' "$0"; } | sha256sum | cut -c1-12)"
  [ -s "$IMG/initrd.cpio" ] || build_image "$IMG"
  flock -u 9
}

# --- run ----------------------------------------------------------------------
QPID="" TPID="" JOB=""
cleanup() {
  [ -z "$QPID" ] || kill "$QPID" 2>/dev/null || true
  [ -z "$TPID" ] || kill "$TPID" 2>/dev/null || true
  [ -z "$JOB" ] || rm -rf "$JOB"
}

run_vm() {
  local repo cwd kernel accel=tcg v rc=125 deadline
  repo=$(git rev-parse --show-toplevel 2>/dev/null || pwd -P); repo=$(cd "$repo" && pwd -P)
  cwd=$(pwd -P); case "$cwd/" in "$repo"/*) ;; *) cwd=$repo;; esac
  JOB=$(mktemp -d "$DIR/job.XXXXXX"); chmod 755 "$JOB"
  trap cleanup EXIT; trap 'exit 130' INT TERM
  echo "$repo" > "$JOB/repo_path"
  for v in $(compgen -e | grep -E '^(RUST_|CARGO|STRATA_|SOFTROCE_)' || true); do
    printf 'export %s=%s\n' "$v" "$(quote "${!v}")"
  done > "$JOB/env"
  { printf 'cd %s || exit 126\nexec' "$(quote "$cwd")"; for a in "$@"; do printf ' %s' "$(quote "$a")"; done; echo; } > "$JOB/cmd.sh"
  # A KVM that can run a stock kernel would be much faster; kvm_pvm cannot.
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; fi
  kernel=$IMG/vmlinux; [ -s "$kernel" ] || kernel=$IMG/vmlinuz
  log "booting (accel=$accel, $SMP vCPU, ${MEM} MiB, $(basename "$kernel"))"
  qemu-system-x86_64 -name strata-softroce -machine q35 -accel "$accel" \
    -cpu "$([ $accel = kvm ] && echo host || echo max)" -smp "$SMP" -m "$MEM" \
    -nodefaults -display none -nic none -no-reboot \
    -chardev file,id=con,path="$JOB/console.log" -serial chardev:con \
    -kernel "$kernel" -initrd "$IMG/initrd.cpio" \
    -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 mitigations=off" \
    -fsdev local,id=j,path="$JOB",security_model=none -device virtio-9p-pci,fsdev=j,mount_tag=job \
    -fsdev local,id=r,path="$repo",security_model=none -device virtio-9p-pci,fsdev=r,mount_tag=repo \
    </dev/null >"$JOB/qemu.log" 2>&1 &
  QPID=$!
  if [ "$VERBOSE" = 1 ]; then tail -n +1 -F --pid="$QPID" "$JOB/console.log" 2>/dev/null >&2 & TPID=$!
  else tail -n +1 -F --pid="$QPID" "$JOB/output.log" 2>/dev/null & TPID=$!; fi
  deadline=$(( $(date +%s) + TIMEOUT ))
  # qemu pauses instead of exiting on some accelerator errors: watch it.
  while kill -0 "$QPID" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "timeout after ${TIMEOUT}s"; kill "$QPID"; rc=124; break; fi
    sleep 0.2
  done
  wait "$QPID" 2>/dev/null || true; QPID=""
  # tail exits by itself once it has printed the rest of the log (--pid)
  wait "$TPID" 2>/dev/null || true; TPID=""
  if [ $rc != 124 ] && [ -s "$JOB/rc" ]; then rc=$(cat "$JOB/rc"); fi
  if [ $rc = 125 ] || [ $rc = 97 ] || [ $rc = 98 ]; then
    log "VM failed; console tail:"; tr -d '\r' < "$JOB/console.log" | tail -30 >&2; cat "$JOB/qemu.log" >&2
  fi
  log "VM done, exit code $rc"
  return "$rc"
}

case "${1:-}" in
  --prepare) prepare; exit 0;;
  --) shift;;
  ""|-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2;;
esac
prepare
run_vm "$@"
