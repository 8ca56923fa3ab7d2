#!/usr/bin/env python3
"""Answers a test's questions about the cluster map in etcd; one process for the whole test.

    etcd_map_wait.py ENDPOINT KEY POLL_S [TIMEOUT_S]   (a coprocess: requests on stdin,
                                                        answers on stdout)

Requests, one per line:
    now                      -> "NS": time.monotonic_ns()
    wait SECONDS CONDITION   -> "ok NS" once CONDITION held (NS: the monotonic time of the etcd
                                read that showed it), "timeout" when SECONDS passed first,
                                "error MESSAGE" when CONDITION does not compile
CONDITION is a Python expression over the map: `m` the parsed map, `sh` its shard count, `reps`
its replica sets (primary first), `joining` the number of joining replicas. KEY is read through
etcd's JSON gateway (POST /v3/kv/range) every POLL_S seconds on one kept-alive connection, each
read given TIMEOUT_S (default 2; the tests scale it for the emulated VM).

Why a coprocess: the failover tests wait on the map while a failover runs. One poll used to
start etcdctl and python3, and even one interpreter per wait costs about 100 ms of CPU on a
2-core host (the imports), right in the window bench/failover_analysis.py measures the
unaffected shards in. Started once before the first kill, this process costs a poll's HTTP
request and nothing else.
"""
import base64
import http.client
import json
import sys
import time


class MapReader:
    def __init__(self, endpoint, key, timeout_s):
        self.host, port = endpoint.rsplit(":", 1)
        self.port = int(port)
        self.body = json.dumps({"key": base64.b64encode(key.encode()).decode()})
        self.conn = None
        self.timeout_s = timeout_s

    def read(self):
        """The map, or None (no map yet, etcd unreachable for now)."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port,
                                                       timeout=self.timeout_s)
            self.conn.request("POST", "/v3/kv/range", self.body,
                              {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                return None
            kvs = json.loads(data).get("kvs") or []
            return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None


def holds(m, condition):
    try:
        reps = m.get("replicas") or [[o] for o in m["owners"]]
        joining = sum(len(v) for v in (m.get("joining") or {}).values())
        env = {"m": m, "sh": m["shards"], "reps": reps, "joining": joining}
        return bool(eval(condition, {}, env))
    except (KeyError, IndexError, TypeError, AttributeError):  # a partial map: not yet
        return False


def wait(reader, seconds, condition, poll_s):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = reader.read()
        if m is not None and holds(m, condition):
            return f"ok {time.monotonic_ns()}"
        time.sleep(poll_s)
    return "timeout"


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: etcd_map_wait.py ENDPOINT KEY POLL_S [TIMEOUT_S]  (requests on stdin)")
    reader = MapReader(sys.argv[1], sys.argv[2], float(sys.argv[4]) if len(sys.argv) == 5 else 2.0)
    poll_s = float(sys.argv[3])
    for line in sys.stdin:
        parts = line.rstrip("\n").split(" ", 2)
        if parts[0] == "now":
            answer = str(time.monotonic_ns())
        elif parts[0] == "wait" and len(parts) == 3:
            try:
                condition = compile(parts[2], "<condition>", "eval")
                answer = wait(reader, float(parts[1]), condition, poll_s)
            except Exception as e:  # a typo in the condition: said, not waited out
                answer = f"error {type(e).__name__}: {e}"
        else:
            answer = f"error unknown request {line.strip()!r}"
        print(answer, flush=True)


if __name__ == "__main__":
    main()
