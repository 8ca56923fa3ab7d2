#!/usr/bin/env bash
# Runs one command inside a qemu VM (TCG) that has a working Soft-RoCE device (rdma_rxe), with the
# host's root file system shared read-only, so that the command runs the binaries built on the host
# against real verbs.
#
#   tests/rxe/vm.sh [--timeout SECONDS] [--cwd DIR] [--out DIR] [--verbose] -- COMMAND [ARGS...]
#   tests/rxe/vm.sh --prepare          only build the cached kernel + initramfs, boot nothing
#
# Exit status: the command's own exit status, or 125 when the harness itself failed (could not
# prepare the image, the VM did not boot, 9p/veth/rxe setup failed, the rxe port never became
# active, or no exit status came back before the timeout), or 130/143 when interrupted/terminated.
# See tests/rxe/README.md.
set -euo pipefail

readonly HARNESS_FAIL=125
# Bump when the image layout or the guest init changes incompatibly (part of the cache key).
readonly IMAGE_FORMAT=1
readonly GUEST_DEV=rxe0 GUEST_NETDEV=rdma0 GUEST_PEER=rdma1 GUEST_ADDR=192.168.77.1
# Modules the guest loads, in this order (their dependencies come along via depmod).
# crc32_generic: without it rdma_rxe fails with "failed to init crc32 algorithm err:-2".
readonly GUEST_MODULES="virtio_pci 9pnet_virtio 9p veth crc32_generic rdma_rxe rdma_ucm"

CACHE=${RDKV_VM_CACHE:-/var/cache/rdkv-rxe}
BOOT_TIMEOUT=${RDKV_VM_BOOT_TIMEOUT:-300}
VM_SMP=${RDKV_VM_SMP:-2}
VM_MEM=${RDKV_VM_MEM:-4096}
VERBOSE=${RDKV_VM_VERBOSE:-0}
KEEP=${RDKV_VM_KEEP:-0}
TIMEOUT=1200
CWD=$PWD
OUT=""
PREPARE_ONLY=0

note() { printf 'rdkv-vm: %s\n' "$*" >&2; }
fail() {
  printf 'rdkv-vm: FAILED: %s\n' "$*" >&2
  exit "$HARNESS_FAIL"
}
usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-$HARNESS_FAIL}"
}

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
while (($# > 0)); do
  case $1 in
    --timeout) TIMEOUT=${2:?--timeout needs SECONDS}; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; shift ;;
    --cwd) CWD=${2:?--cwd needs DIR}; shift 2 ;;
    --cwd=*) CWD=${1#*=}; shift ;;
    --out) OUT=${2:?--out needs DIR}; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    --verbose | -v) VERBOSE=1; shift ;;
    --keep) KEEP=1; shift ;;
    --prepare) PREPARE_ONLY=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    -*) note "unknown option: $1"; usage ;;
    *) break ;;
  esac
done
if ((PREPARE_ONLY == 0 && $# == 0)); then
  note "no command given"
  usage
fi
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || fail "--timeout must be a positive number of seconds, got '$TIMEOUT'"
[[ $BOOT_TIMEOUT =~ ^[1-9][0-9]*$ ]] || fail "RDKV_VM_BOOT_TIMEOUT must be a positive integer"

for tool in qemu-system-x86_64 cpio depmod modprobe dpkg-deb apt-get apt-cache gzip flock sha256sum; do
  command -v "$tool" >/dev/null ||
    fail "'$tool' not found; run deploy/install-deps.sh (needs qemu-system-x86 busybox-static cpio kmod)"
done

# Paths the guest sees differently: /tmp and /run are fresh tmpfs there (the shared root is read-only).
hidden_in_guest() {
  local p=$1
  if [[ -n $OUT && ($p == "$OUT" || $p == "$OUT"/*) ]]; then return 1; fi
  [[ $p == /tmp || $p == /tmp/* || $p == /run || $p == /run/* || $p == /var/run || $p == /var/run/* ]]
}

mkdir -p "$CACHE" || fail "cannot create the cache directory $CACHE (set RDKV_VM_CACHE)"
CACHE=$(realpath "$CACHE")
if hidden_in_guest "$CACHE"; then
  fail "the cache $CACHE must be outside /tmp and /run: the guest reads its run script from there"
fi
[[ $CACHE != *[[:space:]]* ]] || fail "the cache path must not contain white space: $CACHE"

# ---------------------------------------------------------------------------------------------
# Preparation (cached): the Debian kernel package and an initramfs with busybox + the modules.
# ---------------------------------------------------------------------------------------------
apt_quiet() { # apt-get as root warns about the _apt sandbox user; keep the output to errors
  local sandbox=()
  if [[ $(id -u) -eq 0 ]]; then sandbox=(-o APT::Sandbox::User=root); fi
  apt-get -q "${sandbox[@]}" "$@"
}

apt_update_once_done=0
apt_update_once() {
  ((apt_update_once_done == 0)) || return 1
  apt_update_once_done=1
  if [[ $(id -u) -ne 0 ]]; then
    note "apt lists seem missing and we are not root: run 'sudo apt-get update'"
    return 1
  fi
  note "running apt-get update (package lists missing or stale)"
  apt_quiet update >&2
}

kernel_pkg_candidate() { # prints "PKG VERSION" of the kernel image linux-image-amd64 depends on
  local pkg ver
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }') || true
  [[ -n $pkg ]] || return 1
  ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '$1 == "Version:" { print $2; exit }') || true
  [[ -n $ver ]] || return 1
  printf '%s %s\n' "$pkg" "$ver"
}

# Sets KERNEL_DEB to a cached .deb of the current Debian kernel image, downloading it if needed.
fetch_kernel_deb() {
  local debs=$CACHE/debs pkg ver cand f
  mkdir -p "$debs"
  if ! cand=$(kernel_pkg_candidate); then
    apt_update_once || true
    cand=$(kernel_pkg_candidate) || cand=""
  fi
  if [[ -z $cand ]]; then
    # Offline and no package lists: fall back to whatever kernel was fetched before.
    f=$(find "$debs" -maxdepth 1 -name 'linux-image-*.deb' -printf '%T@ %p\n' | sort -rn | awk 'NR == 1 { print $2 }')
    [[ -n $f ]] || fail "cannot find the kernel package: 'apt-cache depends linux-image-amd64' gives nothing (run apt-get update)"
    note "apt lists unavailable; using the cached $(basename "$f")"
    KERNEL_DEB=$f
    return
  fi
  read -r pkg ver <<<"$cand"
  f=$debs/${pkg}_${ver//:/%3a}_amd64.deb
  if [[ ! -s $f ]]; then
    note "downloading the Debian kernel $pkg $ver (once; cached in $debs)"
    if ! (cd "$debs" && apt_quiet download "$pkg=$ver" >&2); then
      apt_update_once || true
      (cd "$debs" && apt_quiet download "$pkg=$ver" >&2) || fail "apt-get download $pkg=$ver failed"
    fi
    [[ -s $f ]] || fail "apt-get download $pkg=$ver did not produce $f"
    # Older kernels are no longer needed (built images are self-contained).
    find "$debs" -maxdepth 1 -name 'linux-image-*.deb' ! -path "$f" -delete
  fi
  KERNEL_DEB=$f
}

# The guest's /init (busybox ash). @MODULES@ is filled in when the image is built.
guest_init() {
  cat <<'EOF'
#!/bin/busybox sh
# rdkv Soft-RoCE guest init, generated by tests/rxe/vm.sh. Prints RDKV_VM_* lines on the console.
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /host
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

param() { for w in $(cat /proc/cmdline); do case $w in "$1"=*) echo "${w#*=}" ;; esac; done; }
RUNDIR=$(param rdkv.rundir)
NONCE=${RUNDIR##*/}
stage() { echo "RDKV_VM_STAGE=$1"; }
die() {
  echo "RDKV_VM_ERROR=$* $NONCE"
  dmesg | grep -v -i 'command line' | grep -iE 'rxe|rdma|infiniband|9p|crc32|veth' | tail -n 25 |
    sed 's/^/guest dmesg: /'
  sleep 1
  poweroff -f
  sleep 10
}
echo
echo "RDKV_VM_INIT"

stage modules
for m in @MODULES@; do
  modprobe "$m" || die "modprobe $m failed"
done

stage 9p
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host ||
  die "9p mount of the host root (mount_tag host) failed"
for d in proc sys dev; do mount --bind /$d /host/$d || die "bind mount of /$d into /host failed"; done
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || die "tmpfs on /host/tmp failed"
mount -t tmpfs -o mode=755 tmpfs /host/run || die "tmpfs on /host/run failed"
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts || true
mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm || die "tmpfs on /dev/shm failed"
[ -f "/host$RUNDIR/run.sh" ] || die "run script /host$RUNDIR/run.sh not visible through 9p"
OUT=$(cat "/host$RUNDIR/out" 2>/dev/null || true)
if [ -n "$OUT" ]; then
  mkdir -p "/host$OUT" 2>/dev/null || true
  mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 out "/host$OUT" ||
    die "9p mount of the --out directory $OUT (mount_tag out) failed"
fi

# Host tools, run in the host root. Through /usr/bin/env because busybox's chroot would
# otherwise prefer its own applets (busybox ip cannot make a veth pair).
host() { chroot /host /usr/bin/env "$@"; }

stage net
host ip link set lo up || die "ip link set lo up failed"
host ip link add @NETDEV@ type veth peer name @PEER@ || die "creating the veth pair @NETDEV@/@PEER@ failed"
host ip addr add @ADDR@/24 dev @NETDEV@ || die "ip addr add @ADDR@/24 dev @NETDEV@ failed"
host ip link set @PEER@ up || die "ip link set @PEER@ up failed"
host ip link set @NETDEV@ up || die "ip link set @NETDEV@ up failed"

stage rxe
host rdma link add @DEV@ type rxe netdev @NETDEV@ || die "rdma link add @DEV@ type rxe netdev @NETDEV@ failed"

stage port
i=0
until host ibv_devinfo -d @DEV@ 2>/dev/null | grep -q PORT_ACTIVE; do
  i=$((i + 1))
  if [ "$i" -ge 120 ]; then
    host ibv_devinfo -d @DEV@ 2>&1 | sed 's/^/guest ibv_devinfo: /'
    die "@DEV@ port never became PORT_ACTIVE (waited 60 s)"
  fi
  sleep 0.5
done
echo "RDKV_VM_READY"

ulimit -l unlimited
chroot /host /bin/bash "$RUNDIR/run.sh"
rc=$?
echo "RDKV_VM_EXIT=$rc $NONCE"
if [ -n "$OUT" ]; then umount "/host$OUT" 2>/dev/null || true; fi
sync
sleep 0.5 # let the console drain before the power goes
poweroff -f
sleep 10
EOF
}

render_init() {
  local text
  text=$(guest_init)
  text=${text//@MODULES@/$GUEST_MODULES}
  text=${text//@DEV@/$GUEST_DEV}
  text=${text//@NETDEV@/$GUEST_NETDEV}
  text=${text//@PEER@/$GUEST_PEER}
  text=${text//@ADDR@/$GUEST_ADDR}
  printf '%s\n' "$text"
}

find_busybox() {
  local b info
  for b in /bin/busybox /usr/bin/busybox; do
    [[ -x $b ]] || continue
    info=$(LC_ALL=C ldd "$b" 2>&1 || true) # ldd exits 1 for a static binary
    if [[ $info == *"not a dynamic"* || $info == *"statically linked"* ]]; then
      printf '%s\n' "$b"
      return
    fi
  done
  fail "no statically linked busybox found; install busybox-static (deploy/install-deps.sh)"
}

# Sets VMLINUZ and INITRD, building them into $CACHE/images/<key>/ when the inputs changed.
prepare_image() {
  local busybox key img tmp kroot kver m dep
  fetch_kernel_deb
  busybox=$(find_busybox)
  key=$({
    echo "format=$IMAGE_FORMAT"
    basename "$KERNEL_DEB"
    stat -c '%s' "$KERNEL_DEB"
    sha256sum <"$busybox"
    echo "$GUEST_MODULES"
    render_init
  } | sha256sum | cut -c1-16)
  img=$CACHE/images/$key
  VMLINUZ=$img/vmlinuz
  INITRD=$img/initramfs.cpio.gz
  if [[ -s $VMLINUZ && -s $INITRD ]]; then return; fi

  note "building the VM image $img (kernel $(basename "$KERNEL_DEB"))"
  mkdir -p "$CACHE/images"
  tmp=$(mktemp -d "$CACHE/images/.build.XXXXXX")
  # shellcheck disable=SC2064 # expand $tmp now
  trap "rm -rf '$tmp'" EXIT
  kroot=$tmp/kernel
  dpkg-deb -x "$KERNEL_DEB" "$kroot" || fail "dpkg-deb -x $KERNEL_DEB failed"
  kver=$(find "$kroot/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -n1)
  [[ -n $kver && -f $kroot/boot/vmlinuz-$kver ]] || fail "no vmlinuz/modules in $KERNEL_DEB"
  depmod -b "$kroot" "$kver" || fail "depmod on the extracted kernel failed"

  local root=$tmp/root
  mkdir -p "$root"/{bin,sbin,dev,proc,sys,host,etc,tmp,usr/bin,usr/sbin} "$root/lib/modules/$kver"
  cp "$busybox" "$root/bin/busybox"
  ln -s busybox "$root/bin/sh"
  render_init >"$root/init"
  chmod 755 "$root/init"
  if [[ $(id -u) -eq 0 ]]; then
    mknod -m 600 "$root/dev/console" c 5 1
    mknod -m 666 "$root/dev/null" c 1 3
  fi
  # Copy every module with its dependencies, keeping the kernel's tree layout.
  for m in $GUEST_MODULES; do
    modprobe -d "$kroot" -S "$kver" --show-depends "$m" >"$tmp/deps" ||
      fail "module $m not found in $kver"
    while read -r kind dep _; do
      [[ $kind == insmod ]] || continue
      install -D -m 644 "$dep" "$root/${dep#"$kroot"/}"
    done <"$tmp/deps"
  done
  cp "$kroot/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null || true
  depmod -b "$root" "$kver" || fail "depmod -b on the initramfs tree failed"

  mkdir -p "$tmp/out"
  cp "$kroot/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -1 >"$tmp/out/initramfs.cpio.gz" || fail "building the initramfs failed"
  echo "$kver" >"$tmp/out/kernel-release"
  rm -rf "$img"
  mv "$tmp/out" "$img"
  rm -rf "$tmp"
  trap - EXIT
  note "image ready: $(du -sh "$img" | cut -f1) in $img"
}

exec {lockfd}>"$CACHE/.lock"
flock "$lockfd"
prepare_image
flock -u "$lockfd"
exec {lockfd}>&-

if ((PREPARE_ONLY)); then
  note "prepared: $VMLINUZ $INITRD"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The run: a script in $CACHE/runs/ (the guest sees it through the read-only 9p share).
# ---------------------------------------------------------------------------------------------
if [[ -n $OUT ]]; then
  mkdir -p "$OUT" || fail "cannot create --out $OUT"
  OUT=$(realpath "$OUT")
  [[ $OUT != / ]] || fail "--out / is not allowed"
fi
[[ -d $CWD ]] || fail "--cwd $CWD is not a directory"
CWD=$(realpath "$CWD")
if hidden_in_guest "$CWD"; then
  fail "--cwd $CWD is under /tmp or /run, which the guest replaces with an empty tmpfs (use --out for it, or another directory)"
fi
if [[ $1 == /* ]] && hidden_in_guest "$1"; then
  fail "the command $1 is under /tmp or /run, which the guest does not see"
fi

stop_qemu() {
  if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill -TERM "$QEMU_PID" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$QEMU_PID" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$QEMU_PID" 2>/dev/null || true
  fi
  if [[ -n $QEMU_PID ]]; then wait "$QEMU_PID" 2>/dev/null || true; fi
  QEMU_PID=""
  if [[ -n $FILTER_PID ]]; then wait "$FILTER_PID" 2>/dev/null || true; fi
  FILTER_PID=""
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
  stop_qemu
  if ((RESULT_KEEP)); then
    note "run directory kept: $RUNDIR (console.log, qemu.err, run.sh)"
  else
    rm -rf "$RUNDIR"
  fi
}

mkdir -p "$CACHE/runs"
RUNDIR=$(mktemp -d "$CACHE/runs/run.XXXXXX")
chmod 755 "$RUNDIR"
NONCE=${RUNDIR##*/}
LOG=$RUNDIR/console.log
QEMU_PID=""
FILTER_PID=""
RESULT_KEEP=$KEEP
trap cleanup EXIT
trap 'note "interrupted; stopping the VM"; exit 130' INT
trap 'note "terminated; stopping the VM"; exit 143' TERM HUP

{
  echo '#!/bin/bash'
  echo '# generated by tests/rxe/vm.sh; runs inside the guest, chrooted into the host root'
  echo 'exec </dev/null'
  echo 'ulimit -l unlimited'
  echo "export RDKV_RXE_DEVICE=$GUEST_DEV RDKV_RXE_ADDR=$GUEST_ADDR RDKV_IN_VM=1"
  echo 'export HOME=/root LANG=C.UTF-8 TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  [[ -z $OUT ]] || printf 'export RDKV_VM_OUT=%q\n' "$OUT"
  # Opt-in steps of the verbs suite (tests/rxe/verbs-suite.sh) pass through.
  [[ -z ${RDKV_VM_FAILOVER:-} ]] || printf 'export RDKV_VM_FAILOVER=%q\n' "$RDKV_VM_FAILOVER"
  printf 'cd -- %q || { echo "RDKV_VM_ERROR=cannot cd to %q inside the guest %s"; exit %d; }\n' \
    "$CWD" "$CWD" "$NONCE" "$HARNESS_FAIL"
  echo "echo RDKV_VM_CMD_BEGIN $NONCE"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} >"$RUNDIR/run.sh"
printf '%s\n' "$OUT" >"$RUNDIR/out"

usec_now() { local t=$EPOCHREALTIME; echo "${t//[.,]/}"; }
since_t0() { # seconds since the VM started, with one decimal
  local d=$(($(usec_now) - t0))
  printf '%d.%d' $((d / 1000000)) $((d / 100000 % 10))
}
elapsed() { echo $((($(usec_now) - t0) / 1000000)); } # whole seconds since the VM started

virtfs_path() { printf '%s' "${1//,/,,}"; } # qemu option values double their commas

# tsc=reliable: the guest kernel finds TCG's TSCs "unsynchronized" and falls back to the HPET, an
# emulated device that each clock_gettime reaches through a system call: 0.9 us a read, against
# 0.1 us from the TSC. rdkv reads the clock on its datapath (deadlines, spin budgets) and
# perftest does not (rdtsc), so the HPET made every ratio to perftest look worse than the code
# is. TCG's TSC is one clock shared by every vCPU, which is what the option asserts.
QEMU=(qemu-system-x86_64 -accel "tcg,thread=multi" -cpu max -smp "$VM_SMP" -m "$VM_MEM"
  -nic none -nographic -no-reboot
  -kernel "$VMLINUZ" -initrd "$INITRD"
  -append "console=ttyS0 loglevel=4 edd=off panic=-1 tsc=reliable rdkv.rundir=$RUNDIR"
  -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap")
if [[ -n $OUT ]]; then
  QEMU+=(-virtfs "local,path=$(virtfs_path "$OUT"),mount_tag=out,security_model=none,multidevs=remap")
fi

# Reads the console: everything goes to console.log; the command's output (between the
# RDKV_VM_CMD_BEGIN and RDKV_VM_EXIT lines of this run) goes to our stdout.
console_filter() {
  local line phase=boot
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line%$'\r'}
    printf '%s\n' "$line" >>"$LOG"
    case $line in
      "RDKV_VM_CMD_BEGIN $NONCE")
        phase=cmd
        : >"$RUNDIR/started"
        continue
        ;;
      *"RDKV_VM_EXIT="*" $NONCE")
        # The command's last line may lack its newline: keep what precedes the marker.
        if [[ $phase == cmd && $line != RDKV_VM_EXIT=* ]]; then printf '%s\n' "${line%RDKV_VM_EXIT=*}"; fi
        phase=finished
        line=${line##*RDKV_VM_EXIT=}
        printf '%s\n' "${line%% *}" >"$RUNDIR/exit"
        continue
        ;;
      *"RDKV_VM_ERROR="*" $NONCE")
        line=${line#*RDKV_VM_ERROR=}
        printf '%s\n' "${line% "$NONCE"}" >"$RUNDIR/error"
        continue
        ;;
      *RDKV_VM_STAGE=*) printf '%s\n' "${line##*RDKV_VM_STAGE=}" >"$RUNDIR/stage" ;;
      *RDKV_VM_INIT) : >"$RUNDIR/init" ;;
      *RDKV_VM_READY) : >"$RUNDIR/ready" ;;
    esac
    if [[ $phase == cmd ]]; then
      printf '%s\n' "$line"
    elif ((VERBOSE)); then
      printf 'guest: %s\n' "$line" >&2
    fi
  done
}

show_failure_context() {
  if [[ -s $RUNDIR/qemu.err ]]; then
    note "qemu stderr:"
    sed 's/^/  qemu: /' "$RUNDIR/qemu.err" | tail -n 20 >&2
  fi
  if [[ -s $LOG ]]; then
    note "last console lines:"
    tail -n 30 "$LOG" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g; s/^/  console: /' >&2
  fi
  note "full console log: $LOG"
}

guest_fail() {
  stop_qemu
  RESULT_KEEP=1
  show_failure_context
  fail "$*"
}

mkfifo "$RUNDIR/console"
console_filter <"$RUNDIR/console" &
FILTER_PID=$!
t0=$(usec_now)
"${QEMU[@]}" </dev/null >"$RUNDIR/console" 2>"$RUNDIR/qemu.err" &
QEMU_PID=$!

ready_reported=0
while kill -0 "$QEMU_PID" 2>/dev/null; do
  el=$(elapsed)
  if ((ready_reported == 0)) && [[ -e $RUNDIR/ready ]]; then
    ready_reported=1
    note "guest ready in $(since_t0) s ($GUEST_DEV PORT_ACTIVE); running: $*"
  fi
  if ((el >= TIMEOUT)); then
    if [[ -e $RUNDIR/started ]]; then
      guest_fail "timed out after ${TIMEOUT} s: the command did not finish (no RDKV_VM_EXIT line); VM killed"
    fi
    guest_fail "timed out after ${TIMEOUT} s before the command started (stage: $(cat "$RUNDIR/stage" 2>/dev/null || echo boot))"
  fi
  if ((el >= BOOT_TIMEOUT)) && [[ ! -e $RUNDIR/ready && ! -e $RUNDIR/error ]]; then
    if [[ ! -e $RUNDIR/init ]]; then
      guest_fail "the VM did not boot within ${BOOT_TIMEOUT} s (the kernel never started the rdkv init)"
    fi
    guest_fail "guest setup stuck at stage '$(cat "$RUNDIR/stage" 2>/dev/null || echo '?')' for ${BOOT_TIMEOUT} s (RDKV_VM_BOOT_TIMEOUT)"
  fi
  sleep 0.25
done
wait "$QEMU_PID" && qemu_rc=0 || qemu_rc=$?
QEMU_PID=""
wait "$FILTER_PID" || true
FILTER_PID=""

if [[ -s $RUNDIR/error ]]; then
  guest_fail "guest: $(cat "$RUNDIR/error")"
fi
if [[ -s $RUNDIR/exit ]]; then
  rc=$(cat "$RUNDIR/exit")
  [[ $rc =~ ^[0-9]+$ ]] || guest_fail "malformed exit status '$rc' from the guest"
  note "command exited with status $rc; VM ran $(since_t0) s"
  exit "$rc"
fi
if [[ ! -e $RUNDIR/init ]]; then
  guest_fail "the VM did not boot (qemu exited with status $qemu_rc before the rdkv init ran)"
fi
if [[ -e $RUNDIR/started ]]; then
  guest_fail "the VM stopped while the command ran, without reporting its exit status (guest crash? qemu status $qemu_rc)"
fi
guest_fail "the VM stopped during setup stage '$(cat "$RUNDIR/stage" 2>/dev/null || echo '?')' (qemu status $qemu_rc)"
