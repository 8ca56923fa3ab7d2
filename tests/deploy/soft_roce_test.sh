#!/usr/bin/env bash
# Tests deploy/setup-soft-roce.sh.
#
#   tests/deploy/soft_roce_test.sh
#
# 1. On this host's kernel: when it has no rdma_rxe (the usual case in containers and on CI),
#    the script fails with exit 3 and says so clearly. (SKIPPED where the kernel has rdma_rxe:
#    the test never adds a real RDMA device to the host.)
# 2. Its logic against stand-in modprobe, modinfo, rdma and ibv_devinfo commands (PATH): the
#    missing-module and load-failure errors, adding a device and waiting for PORT_ACTIVE, reusing
#    an existing device, a port that never comes up, --remove (idempotent), bad interfaces and
#    arguments, and running as non-root.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ROOT=$DEPLOY_TEST_ROOT
SR=$ROOT/deploy/setup-soft-roce.sh

[[ $(id -u) == 0 ]] || skip "must run as root (the script refuses non-root before doing anything)"
for t in rdma ip; do command -v $t >/dev/null || skip "'$t' is not installed (Debian package iproute2)"; done

WORK=$(mktemp -d /tmp/rdkv-softroce-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"

module_loaded() { [[ -d /sys/module/rdma_rxe ]] || grep -qw '^rdma_rxe' /proc/modules 2>/dev/null; }

dev=$(ip -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')

# --- 1. the real kernel --------------------------------------------------------------------------
if ! command -v modprobe >/dev/null || ! command -v ibv_devinfo >/dev/null; then
  echo "SKIPPED: the real-kernel check: modprobe (kmod) or ibv_devinfo (ibverbs-utils) is not installed"
elif module_loaded || modinfo rdma_rxe >/dev/null 2>&1; then
  echo "SKIPPED: the missing-module error on this kernel: $(uname -r) has rdma_rxe (the test adds no real device)"
else
  expect_rc 3 "on this kernel ($(uname -r)), which lacks rdma_rxe, the script fails with exit 3" "$SR" ${dev:+--netdev "$dev"}
  contains "  ... saying the kernel has no rdma_rxe" "this kernel ($(uname -r)) has no rdma_rxe module"
  contains "  ... and what to do instead" "--transport=tcp"
fi

# --- 2. stand-in tools ---------------------------------------------------------------------------
fake=$WORK/bin
mkdir -p "$fake"
STATE=$WORK/links LOG=$WORK/calls
: >"$STATE"
: >"$LOG"
# FAKE_MODPROBE: ok | missing | refused.  FAKE_PORT: PORT_ACTIVE or another state.
cat >"$fake/modprobe" <<EOF
#!/bin/bash
echo "modprobe \$*" >>"$LOG"
case \${FAKE_MODPROBE:-ok} in
  ok) exit 0 ;;
  missing) echo "modprobe: FATAL: Module rdma_rxe not found in directory /lib/modules/\$(uname -r)" >&2; exit 1 ;;
  refused) echo "modprobe: ERROR: could not insert 'rdma_rxe': Operation not permitted" >&2; exit 1 ;;
esac
EOF
cat >"$fake/modinfo" <<EOF
#!/bin/bash
[[ \${FAKE_MODPROBE:-ok} != missing ]] || { echo "modinfo: ERROR: Module rdma_rxe not found." >&2; exit 1; }
echo "filename: /lib/modules/x/rdma_rxe.ko"
EOF
cat >"$fake/rdma" <<EOF
#!/bin/bash
echo "rdma \$*" >>"$LOG"
case "\$1 \$2" in
  "link show") awk '{ printf "link %s/1 state ACTIVE physical_state LINK_UP netdev %s\n", \$1, \$2 }' "$STATE" ;;
  "link add") echo "\$3 \$7" >>"$STATE" ;;
  "link delete") grep -v "^\$3 " "$STATE" >"$STATE.tmp" || true; mv "$STATE.tmp" "$STATE" ;;
  *) exit 1 ;;
esac
EOF
cat >"$fake/ibv_devinfo" <<EOF
#!/bin/bash
[[ \$1 == -d ]] && grep -q "^\$2 " "$STATE" || { echo "Device \$2 not found" >&2; exit 255; }
printf 'hca_id:\t%s\n\t\tport:\t1\n\t\t\tstate:\t\t\t%s (4)\n' "\$2" "\${FAKE_PORT:-PORT_ACTIVE}"
EOF
chmod +x "$fake"/*
export PATH=$fake:$PATH

if module_loaded; then
  echo "SKIPPED: the module-error cases with stand-ins: rdma_rxe is loaded on this host"
else
  FAKE_MODPROBE=missing expect_rc 3 "stand-ins, module missing: exit 3" "$SR" ${dev:+--netdev "$dev"}
  contains "  ... saying the kernel has no rdma_rxe" "has no rdma_rxe module"
  contains "  ... quoting modprobe" "Module rdma_rxe not found"
  FAKE_MODPROBE=refused expect_rc 3 "stand-ins, module present but not loadable: exit 3" "$SR" ${dev:+--netdev "$dev"}
  contains "  ... saying why" "modprobe rdma_rxe failed although the module exists: modprobe: ERROR: could not insert"
fi

netdev=""
for c in ${dev:-} $(ls /sys/class/net); do
  [[ $c != lo && $(cat "/sys/class/net/$c/type" 2>/dev/null) == 1 && $(cat "/sys/class/net/$c/operstate" 2>/dev/null) != down ]] &&
    { netdev=$c; break; }
done
if [[ -z $netdev ]]; then
  echo "SKIPPED: adding a device with stand-ins: no Ethernet interface that is up on this host"
else
  expect_rc 0 "stand-ins: set up rxe0 over $netdev" "$SR" --netdev "$netdev"
  contains "  ... prints the device" "device: rxe0"
  contains "  ... prints the interface" "netdev: $netdev"
  contains "  ... and how to start kvserver on it" "kvserver --transport=verbs --device=rxe0"
  check "  ... ran 'rdma link add rxe0 type rxe netdev $netdev'" grep -qx "rdma link add rxe0 type rxe netdev $netdev" "$LOG"
  module_loaded || check "  ... after 'modprobe rdma_rxe'" grep -qx "modprobe rdma_rxe" "$LOG"
  : >"$LOG"
  expect_rc 0 "stand-ins: a second run reuses the device" "$SR" --netdev "$netdev"
  contains "  ... saying so" "already carries rxe device rxe0"
  check "  ... without adding another" bash -c "! grep -q 'link add' '$LOG'"
  expect_rc 0 "stand-ins: --remove" "$SR" --remove
  contains "  ... removes rxe0" "removed rxe0"
  check "  ... and it is gone" test ! -s "$STATE"
  expect_rc 0 "stand-ins: --remove again (idempotent)" "$SR" --remove
  contains "  ... nothing to remove" "nothing to remove"
  echo "rxe9 otherif0" >>"$STATE"
  expect_rc 4 "stand-ins: a device name already used over another interface: exit 4" "$SR" --netdev "$netdev" --name rxe9
  contains "  ... naming that interface" "an rxe device named rxe9 already runs over otherif0"
  : >"$STATE"
  FAKE_PORT=PORT_DOWN expect_rc 5 "stand-ins: a port that never becomes active: exit 5" "$SR" --netdev "$netdev" --timeout 1
  contains "  ... saying which state it is in" "did not become PORT_ACTIVE within 1s (ibv_devinfo: PORT_DOWN)"
  "$SR" --remove >/dev/null
fi

expect_rc 4 "an interface that does not exist: exit 4" "$SR" --netdev nosuch0
contains "  ... named in the error" "no network interface 'nosuch0'"
expect_rc 4 "the loopback interface: exit 4" "$SR" --netdev lo
contains "  ... refused" "cannot run over the loopback interface"
expect_rc 2 "an unknown argument: exit 2" "$SR" --bogus
expect_rc 0 "--help" "$SR" --help
contains "  ... shows the usage" "--remove"
if command -v setpriv >/dev/null; then
  # The unprivileged user runs a copy in $WORK (mode 755), from $WORK: the clone itself may live
  # under a home directory it cannot enter (0700).
  install -m 755 "$SR" "$WORK/setup-soft-roce.sh"
  expect_rc 2 "as non-root: exit 2" setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -C "$WORK" "$WORK/setup-soft-roce.sh" --netdev nosuch0
  contains "  ... saying it needs root" "must run as root"
else
  echo "SKIPPED: the non-root check: setpriv (util-linux) is not installed"
fi

finish
