#!/usr/bin/env bash
# Secrets end to end with a real kvserver and kvcli (docs/security.md): token files keep the
# secrets out of `ps`; the wrong data secret is refused; admin commands need the admin secret
# (this server has one, so loopback gets no upgrade); a secret on the command line
# (--auth_token) is refused by both programs; SIGHUP re-reads the token files (the old data secret refused, the new one admitted, a broken file
# changes nothing).
#
#   session_kvserver_test.sh KVCLI KVSERVER
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/wait_for_port.sh"
kvcli=$1 kvserver=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rdkv-session.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

data_secret=data-$RANDOM$RANDOM$RANDOM
admin_secret=admin-$RANDOM$RANDOM$RANDOM
(umask 077 && printf '%s\n' "$data_secret" >"$work/data" && printf '%s' "$admin_secret" >"$work/admin")
printf 'x' >"$work/wrong"

"$kvserver" --port=0 --port_file="$work/port" --transport=tcp --memory=64MiB --huge_pages=false \
  --auth_token_file="$work/data" --admin_token_file="$work/admin" --metrics_port=0 \
  >"$work/server.log" 2>&1 &
server_pid=$!
server=127.0.0.1:$(wait_for_port "$work/port" "$server_pid" "$work/server.log") || exit 1

# The secrets are on no command line.
if ps -eo args | grep -F -e "$data_secret" -e "$admin_secret" | grep -v grep >/dev/null; then
  fail "a secret is visible in ps"
fi

kv() { "$kvcli" --server="$server" --transport=tcp --json "$@" 2>"$work/err"; }

out=$(kv --auth_token_file="$work/data" put k v) || fail "put with the data secret: $out $(cat "$work/err")"
out=$(kv --auth_token_file="$work/wrong" get k)
[[ $out == *PermissionDenied* ]] || fail "a wrong data secret was not refused: $out"
out=$(RDKV_AUTH_TOKEN=$data_secret kv get k) || fail "the secret from the environment: $out"
# Admin: refused to the data role, accepted with the admin secret (durability none: the
# snapshot itself is NotSupported, but not denied).
out=$(kv --auth_token_file="$work/data" snapshot s1)
[[ $out == *PermissionDenied* && $out == *admin_token_file* ]] ||
  fail "snapshot with the data role was not denied naming --admin_token_file: $out"
out=$(kv --admin_token_file="$work/admin" snapshot s1)
[[ $out != *PermissionDenied* ]] || fail "snapshot with the admin secret was denied: $out"
# A secret on the command line is refused (visible in ps), by kvcli and by kvserver, with exit 2
# and a message naming the file flag; it is never used.
rc=0
out=$(kv --auth_token="$data_secret" get k) || rc=$?
out="$out $(cat "$work/err")"
[[ $rc == 2 && $out == *"--auth_token is refused"* && $out == *auth_token_file* ]] ||
  fail "kvcli --auth_token was not refused with exit 2: rc=$rc $out"
rc=0
out=$("$kvserver" --port=0 --memory=8MiB --auth_token="$data_secret" 2>&1) || rc=$?
[[ $rc == 2 && $out == *"--auth_token is refused"* ]] ||
  fail "kvserver --auth_token was not refused with exit 2: rc=$rc $out"
# The server log never holds a secret.
if grep -F -e "$data_secret" -e "$admin_secret" "$work/server.log" >/dev/null; then
  fail "a secret is in the server log"
fi

# Clients that never read their answers (issue #15 point 4: 250 of them took a 64 MiB server to
# 2.8 GB): the server cuts each off after its stall timeout (10 s) and stays bounded.
if command -v python3 >/dev/null; then
  line=$(python3 "$(dirname "$0")/session_slow_readers.py" 127.0.0.1 "${server##*:}" "$server_pid" \
    "$data_secret" 250 13) || fail "slow readers: the raw client failed"
  echo "slow readers against kvserver: $line"
  per_client=$(sed -n 's/.*growth_per_client_mib=\([0-9.]*\).*/\1/p' <<<"$line")
  # Every one of them is gone from the server: cut off at the stall timeout, or (under load)
  # aborted earlier by the kernel's TCP_USER_TIMEOUT on the zero window.
  url=$(grep -o 'http://[^ ]*/metrics' "$work/server.log" | head -1)
  metric() { python3 -c "import urllib.request,sys
for l in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines():
    if l.startswith(sys.argv[2] + ' '): print(int(float(l.split()[1])))" "$url" "$1"; }
  # A sanitizer build on a loaded host may take a few seconds longer than the 13 s the client
  # waited: poll up to 20 s more (a session that is never cut stays open and fails).
  for _ in $(seq 1 40); do
    open_now=$(metric rdkv_connections)
    [[ $open_now == 0 ]] && break
    sleep 0.5
  done
  echo "after: rdkv_connections=$open_now rdkv_slow_readers_cut_total=$(metric rdkv_slow_readers_cut_total)"
  [[ $open_now == 0 ]] || fail "slow readers: $open_now session(s) still open on the server"
  # ASan and TSan keep shadow memory for every byte the server touches (TSan several times it):
  # RSS is no measure of the server's buffers there, so the bound holds in plain builds only
  # (the `test` stage); the sessions must be gone in every build.
  if ldd "$kvserver" 2>/dev/null | grep -E "lib(asan|tsan)" >/dev/null; then  # no -q: an early exit SIGPIPEs ldd, and pipefail fails the test
    echo "SKIPPED: the RSS bound per slow reader (a sanitizer build; measured $per_client MiB)"
  else
    awk -v x="$per_client" 'BEGIN { exit !(x < 3.0) }' || fail "slow readers: $per_client MiB per client"
  fi
  out=$(kv --auth_token_file="$work/data" get k) || fail "the server does not serve after the slow readers: $out"
else
  echo "SKIPPED: slow readers: python3 is not installed"
fi

# Rotation: a new data secret in the file, SIGHUP. Then an empty file: refused, nothing changes.
new_secret=new-$RANDOM$RANDOM$RANDOM
(umask 077 && printf '%s\n' "$new_secret" >"$work/data.new" && mv "$work/data.new" "$work/data")
printf '%s\n' "$data_secret" >"$work/old"
# hup PATTERN: SIGHUP the server and wait up to 5 s for a log line matching PATTERN.
hup() {
  kill -HUP "$server_pid"
  for _ in $(seq 1 50); do
    grep -q "$1" "$work/server.log" && return 0
    sleep 0.1
  done
  return 1
}
hup "SIGHUP: secrets replaced (data secret changed, admin secret unchanged)" ||
  fail "SIGHUP did not replace the data secret: $(grep SIGHUP "$work/server.log")"
out=$(kv --auth_token_file="$work/old" get k)
[[ $out == *PermissionDenied* ]] || fail "the old data secret still works after SIGHUP: $out"
out=$(kv --auth_token_file="$work/data" get k) || fail "the new data secret is refused after SIGHUP: $out"
: >"$work/data"
hup "SIGHUP: --auth_token_file.*the secrets are unchanged" ||
  fail "an empty token file at SIGHUP was not reported: $(grep SIGHUP "$work/server.log")"
printf '%s\n' "$new_secret" >"$work/data"
out=$(kv --auth_token_file="$work/data" get k) || fail "an empty token file at SIGHUP changed the secret: $out"
kill -0 "$server_pid" 2>/dev/null || fail "kvserver died on SIGHUP"
if grep -F -e "$new_secret" "$work/server.log" >/dev/null; then fail "the new secret is in the server log"; fi

if ((failures > 0)); then
  echo "--- server log"; tail -20 "$work/server.log"
  echo "$failures failure(s)"
  exit 1
fi
echo "session_kvserver_test: OK"
