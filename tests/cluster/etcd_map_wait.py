#!/usr/bin/env python3
"""Waits until a condition over the cluster map in etcd holds; one process per wait.

    etcd_map_wait.py ENDPOINT KEY SECONDS POLL_S CONDITION

Reads KEY through etcd's JSON gateway (POST /v3/kv/range) every POLL_S seconds and evaluates
CONDITION (a Python expression) over the map: `m` the parsed map, `sh` its shard count, `reps`
its replica sets (primary first), `joining` the number of joining replicas. Exit 0 when it held
(printing time.monotonic_ns() of the read that showed it), 1 when SECONDS passed first.

The failover tests wait on the map while a failover runs; one poll used to start etcdctl and
python3 (tens of milliseconds of CPU on a 2-core host, twenty times a second), which took CPU
from the cluster exactly in the window bench/failover_analysis.py measures. A poll here is one
HTTP request on a kept-alive connection.
"""
import base64
import http.client
import json
import sys
import time


def read_map(conn, key):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()})
    conn.request("POST", "/v3/kv/range", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        return None
    kvs = json.loads(data).get("kvs") or []
    if not kvs:
        return None
    return json.loads(base64.b64decode(kvs[0]["value"]))


def holds(m, condition):
    sh = m["shards"]
    reps = m.get("replicas") or [[o] for o in m["owners"]]
    joining = sum(len(v) for v in (m.get("joining") or {}).values())
    return bool(eval(condition, {}, {"m": m, "sh": sh, "reps": reps, "joining": joining}))


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: etcd_map_wait.py ENDPOINT KEY SECONDS POLL_S CONDITION")
    endpoint, key, seconds, poll_s, condition = sys.argv[1:]
    host, port = endpoint.rsplit(":", 1)
    condition = compile(condition, "<condition>", "eval")  # a typo fails here, not by timeout
    deadline = time.monotonic() + float(seconds)
    conn = None
    while time.monotonic() < deadline:
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, int(port), timeout=2)
            m = read_map(conn, key)
            if m is not None and holds(m, condition):
                print(time.monotonic_ns())
                return 0
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError):
            # etcd restarting, a map being written for the first time: poll again.
            if conn is not None:
                conn.close()
            conn = None
        time.sleep(float(poll_s))
    return 1


if __name__ == "__main__":
    sys.exit(main())
