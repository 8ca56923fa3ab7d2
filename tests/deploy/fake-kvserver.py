#!/usr/bin/env python3
"""A stand-in for kvserver that tests of deploy/local-cluster.sh install under the name
`kvserver`, so the script's own logic (flag detection, readiness, stop escalation, errors) is
tested whatever state the real server is in.

It behaves like kvserver where the script can tell: gflags-style --helpfull (exit 1), rejects
flags it does not advertise, listens on --host:--port (TCP), writes --port_file once listening,
supports --tryfromenv, logs to stderr, exits 0 on SIGTERM/SIGINT. Knobs (environment):
  FAKE_KVSERVER_FLAGS        comma list of optional flags to advertise (default: all of
                             cluster_map,server_id,data_dir,durability)
  FAKE_KVSERVER_FAIL         if set: print it as the start error and exit 2
  FAKE_KVSERVER_IGNORE_TERM  if 1: ignore SIGTERM (only SIGKILL ends it)
"""
import os
import signal
import socket
import sys

BASE = ["host", "port", "port_file", "transport", "device", "memory", "auth_token",
        "worker_threads", "index_fraction", "huge_pages"]
OPTIONAL = ["cluster_map", "server_id", "data_dir", "durability"]


def main():
    optional = os.environ.get("FAKE_KVSERVER_FLAGS", ",".join(OPTIONAL))
    known = BASE + [f for f in optional.split(",") if f]
    args = {}
    for a in sys.argv[1:]:
        if a in ("--help", "--helpfull", "-help", "-helpfull"):
            print("kvserver (fake): test stand-in\n\n  Flags from kvserver_main.cc:")
            for f in known:
                print(f"    -{f} (fake flag) type: string default: \"\"")
            return 1
        if not a.startswith("--") or "=" not in a:
            print(f"ERROR: bad argument '{a}'", file=sys.stderr)
            return 1
        k, v = a[2:].split("=", 1)
        if k == "tryfromenv":  # gflags: set each listed flag from FLAGS_<name> when that is set
            for name in filter(None, v.split(",")):
                if name not in known:
                    print(f"ERROR: unknown command line flag '{name}' (via --fromenv or --tryfromenv)",
                          file=sys.stderr)
                    return 1
                if "FLAGS_" + name in os.environ:
                    args[name] = os.environ["FLAGS_" + name]
            continue
        if k not in known:
            print(f"ERROR: unknown command line flag '{k}'", file=sys.stderr)
            return 1
        args[k] = v
    print("fake kvserver args: " + " ".join(sys.argv[1:]), file=sys.stderr, flush=True)
    fail = os.environ.get("FAKE_KVSERVER_FAIL")
    if fail:
        print(f"kvserver: cannot start: {fail}", file=sys.stderr, flush=True)
        return 2

    stop = {"now": False}

    def on_term(signum, frame):
        stop["now"] = True

    if os.environ.get("FAKE_KVSERVER_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((args.get("host", "127.0.0.1"), int(args.get("port", "7400"))))
    except OSError as e:
        print(f"kvserver: cannot start: bind: {e}", file=sys.stderr, flush=True)
        return 2
    s.listen(16)
    s.settimeout(0.1)
    if "port_file" in args:
        tmp = args["port_file"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{s.getsockname()[1]}\n")
        os.rename(tmp, args["port_file"])
    print(f"fake kvserver serving on {s.getsockname()} over tcp", file=sys.stderr, flush=True)
    while not stop["now"]:
        try:
            c, _ = s.accept()
            c.close()
        except socket.timeout:
            pass
        except InterruptedError:
            pass
    print("fake kvserver shutting down", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
