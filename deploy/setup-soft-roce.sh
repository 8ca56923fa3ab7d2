#!/usr/bin/env bash
# Sets up Soft-RoCE (the kernel's rdma_rxe driver: RDMA over an ordinary Ethernet interface), so
# kvserver --transport=verbs and the verbs tests run on a host without an RDMA NIC.
#
#   deploy/setup-soft-roce.sh [--netdev IF] [--name rxe0] [--timeout 15]
#   deploy/setup-soft-roce.sh --remove [--name rxe0] [--unload]
#
#   --netdev IF   Ethernet interface to run RDMA over (default: the one of the default route)
#   --name NAME   RDMA device name (default rxe0)
#   --timeout S   seconds to wait for the port to become PORT_ACTIVE (default 15)
#   --remove      delete the device NAME (idempotent); --unload also unloads rdma_rxe when no
#                 other rxe device is left
#
# What it does: loads rdma_rxe (modprobe), `rdma link add NAME type rxe netdev IF` unless an rxe
# device already sits on IF, waits until `ibv_devinfo -d NAME` shows PORT_ACTIVE, and prints the
# device, the interface and its addresses (kvserver --host) with the command to start kvserver.
# Needs root, and the Debian packages iproute2 (rdma), kmod (modprobe) and ibverbs-utils
# (ibv_devinfo); the kernel must have rdma_rxe (Debian's stock kernels do; many cloud, container
# and minimal kernels do not, and in a container the host must load it).
#
# Exit status: 0 done; 2 bad usage or a missing tool; 3 this kernel has no rdma_rxe or it cannot
# be loaded; 4 the interface is unusable; 5 the device did not come up.
set -euo pipefail
PROG=setup-soft-roce.sh

die() { local rc=$1; shift; echo "$PROG: error: $*" >&2; exit "$rc"; }
say() { echo "$PROG: $*"; }

netdev="" name=rxe0 timeout_s=15 remove=0 unload=0
while (($# > 0)); do
  case $1 in
    --netdev) netdev=${2:?--netdev needs an interface name}; shift ;;
    --netdev=*) netdev=${1#*=} ;;
    --name) name=${2:?--name needs a device name}; shift ;;
    --name=*) name=${1#*=} ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift ;;
    --timeout=*) timeout_s=${1#*=} ;;
    --remove) remove=1 ;;
    --unload) unload=1 ;;
    -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die 2 "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ $name =~ ^[A-Za-z0-9_]+$ ]] || die 2 "--name '$name': letters, digits and _ only"
[[ $timeout_s =~ ^[0-9]+$ ]] || die 2 "--timeout '$timeout_s' is not a number of seconds"

need() {  # need TOOL PACKAGE
  command -v "$1" >/dev/null || die 2 "'$1' is not installed (Debian package $2: apt-get install $2)"
}
need rdma iproute2
need modprobe kmod
need ip iproute2
((remove)) || need ibv_devinfo ibverbs-utils
[[ $(id -u) == 0 ]] || die 2 "must run as root (it loads a kernel module and adds an RDMA link): sudo $0 $*"

# rxe_links: "NAME NETDEV STATE" for each rxe link (from `rdma link show`).
rxe_links() {
  rdma link show 2>/dev/null | awk '{
      dev = $2; sub(/\/.*/, "", dev); nd = ""; st = "";
      for (i = 1; i <= NF; i++) { if ($i == "netdev") nd = $(i + 1); if ($i == "state") st = $(i + 1) }
      if (nd != "") print dev, nd, st }'
}

module_loaded() { [[ -d /sys/module/rdma_rxe ]] || grep -qw '^rdma_rxe' /proc/modules 2>/dev/null; }

# --- remove ----------------------------------------------------------------------------------
if ((remove)); then
  if rxe_links | awk -v n="$name" '$1 == n { found = 1 } END { exit !found }'; then
    rdma link delete "$name" || die 5 "rdma link delete $name failed"
    say "removed $name"
  else
    say "no rxe device named $name; nothing to remove"
  fi
  if ((unload)) && module_loaded; then
    if [[ -n $(rxe_links) ]]; then
      say "rdma_rxe stays loaded: other rxe devices remain ($(rxe_links | awk '{print $1}' | tr '\n' ' '))"
    else
      modprobe -r rdma_rxe || die 3 "modprobe -r rdma_rxe failed"
      say "unloaded rdma_rxe"
    fi
  fi
  exit 0
fi

# --- the interface ---------------------------------------------------------------------------
if [[ -z $netdev ]]; then
  netdev=$(ip -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')
  [[ -n $netdev ]] || die 4 "no default route to pick an interface from; name one: --netdev IF (ip -br link lists them)"
  say "using $netdev (the default route's interface; choose another with --netdev)"
fi
[[ -e /sys/class/net/$netdev ]] || die 4 "no network interface '$netdev' (ip -br link lists them)"
[[ $netdev != lo ]] || die 4 "rxe cannot run over the loopback interface; choose an Ethernet interface"
if [[ $(cat "/sys/class/net/$netdev/type" 2>/dev/null) != 1 ]]; then
  die 4 "$netdev is not an Ethernet interface (Soft-RoCE needs one)"
fi
if [[ $(cat "/sys/class/net/$netdev/operstate" 2>/dev/null) == down ]]; then
  die 4 "$netdev is down: bring it up first (ip link set $netdev up)"
fi

# --- the module ------------------------------------------------------------------------------
if module_loaded; then
  say "rdma_rxe already loaded"
else
  if ! err=$(modprobe rdma_rxe 2>&1); then
    kernel=$(uname -r)
    if ! modinfo rdma_rxe >/dev/null 2>&1; then
      cfg=""
      for f in "/boot/config-$kernel" /proc/config.gz; do
        [[ -r $f ]] || continue
        cfg=$( (zgrep -h '^CONFIG_RDMA_RXE=\|^# CONFIG_RDMA_RXE ' "$f" 2>/dev/null || true) | head -n1)
        [[ -n $cfg ]] && break
      done
      die 3 "this kernel ($kernel) has no rdma_rxe module${cfg:+ ($cfg)}, so Soft-RoCE cannot run here.
  modprobe said: ${err:-nothing}
  Use a kernel built with CONFIG_RDMA_RXE (Debian's linux-image-amd64 is), or, inside a container
  or VM, load it on the host (modprobe rdma_rxe). Without RDMA, kvserver runs with --transport=tcp;
  tests/rxe/vm.sh runs the verbs tests in a VM with Debian's kernel."
    fi
    die 3 "modprobe rdma_rxe failed although the module exists: ${err}
  (in a container, load it on the host; with Secure Boot, module signing may refuse it)"
  fi
  say "loaded rdma_rxe"
fi

# --- the link --------------------------------------------------------------------------------
if ! rdma link show >/dev/null 2>&1; then
  die 3 "'rdma link show' fails: $(rdma link show 2>&1 | head -n1) (the kernel's RDMA netlink interface is missing)"
fi
existing=$(rxe_links | awk -v nd="$netdev" '$2 == nd { print $1; exit }')
if [[ -n $existing ]]; then
  say "$netdev already carries rxe device $existing; leaving it as it is"
  name=$existing
elif taken=$(rxe_links | awk -v n="$name" '$1 == n { print $2; exit }') && [[ -n $taken ]]; then
  die 4 "an rxe device named $name already runs over $taken; pick another --name or --remove it first"
else
  rdma link add "$name" type rxe netdev "$netdev" || die 5 "rdma link add $name type rxe netdev $netdev failed"
  say "added $name over $netdev"
fi

# --- wait for the port -----------------------------------------------------------------------
deadline=$((SECONDS + timeout_s))
state=""
while :; do
  state=$(ibv_devinfo -d "$name" 2>/dev/null | awk '/state:/ { print $2; exit }') || true
  [[ $state == PORT_ACTIVE ]] && break
  if ((SECONDS >= deadline)); then
    die 5 "$name did not become PORT_ACTIVE within ${timeout_s}s (ibv_devinfo: ${state:-no such device}); is $netdev up with a carrier?"
  fi
  sleep 0.5
done

addrs=$(ip -o addr show dev "$netdev" 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }' | tr '\n' ' ')
ipv4=$(ip -o -4 addr show dev "$netdev" 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
say "$name is PORT_ACTIVE over $netdev (addresses: ${addrs:-none})"
echo "device: $name"
echo "netdev: $netdev"
echo "start kvserver on it:  kvserver --transport=verbs --device=$name --host=${ipv4:-<an address of $netdev>} --port=7400"
echo "undo:                  $0 --remove --name $name"
