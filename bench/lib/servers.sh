# Shell helpers the benchmark scripts share for their kvservers (sourced, not run):
#   SRV_PID         the started servers' pids (the script appends to it)
#   stop_servers    SIGTERM each, SIGKILL after 10 s, reap; empties SRV_PID
#   pick_ports N    sets PORTS to N free loopback ports below the ephemeral range
# The caller defines die() (message, exit 2).
# shellcheck shell=bash

declare -a SRV_PID=()
stop_servers() {
  local p t
  for p in "${SRV_PID[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${SRV_PID[@]}"; do
    for ((t = 0; t < 100; t++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  SRV_PID=()
}

port_free() { [[ -z $(ss -Hltn "sport = :$1" 2>/dev/null) ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Listening ports come from below the kernel's ephemeral range: a port of that range may be
# taken between the check and the bind by any outgoing connection (kvbench's, the servers').
read -r EPH_LOW _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPH_LOW=32768
PORT_LOW=10000 PORT_SPAN=$((EPH_LOW - 10000))
((PORT_SPAN >= 1000)) || { PORT_LOW=20000; PORT_SPAN=40000; }
pick_ports() {
  local n=$1 p tries=0
  PORTS=()
  while ((${#PORTS[@]} < n)); do
    ((tries++ < 1000)) || die "found no $n free ports"
    p=$((PORT_LOW + RANDOM % PORT_SPAN))
    [[ " ${PORTS[*]} " == *" $p "* ]] && continue
    port_free "$p" && PORTS+=("$p")
  done
}
