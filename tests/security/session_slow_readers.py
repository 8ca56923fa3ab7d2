#!/usr/bin/env python3
"""N raw tcp-transport clients that authenticate, ask a kvserver for many 64 KiB READs and never
read the answers (issue #15 point 4). Prints the server's peak VmRSS growth and how many of the
clients the server cut off. Usage: session_slow_readers.py HOST PORT SERVER_PID SECRET N SECONDS
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

MAGIC = 0x544B4452
VERSION = 3


def frame(ftype, body):
    return struct.pack("<IBBHI", MAGIC, ftype, 0, 0, len(body)) + body


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError("server closed")
        out += chunk
    return out


def recv_frame(s):
    magic, ftype, _, _, length = struct.unpack("<IBBHI", recv_exact(s, 12))
    assert magic == MAGIC
    return ftype, recv_exact(s, length)


def handshake(s, secret):
    nc = os.urandom(32)
    hello = struct.pack("<HHIB3x", VERSION, 0, 1 << 20, 1) + nc
    s.sendall(frame(1, hello))
    ftype, body = recv_frame(s)
    assert ftype == 9, f"expected CHALLENGE, got {ftype}"
    ns = body[:32]
    mac = lambda side: hmac.new(secret, b"rdkv-auth-v1" + bytes([side, 1]) + nc + ns +
                                struct.pack("<I", len(hello)) + hello, hashlib.sha256).digest()
    assert hmac.compare_digest(body[32:], mac(1)), "server proof wrong"
    s.sendall(frame(10, mac(2)))
    ftype, body = recv_frame(s)
    assert ftype == 2, f"expected WELCOME, got {ftype}"
    count = struct.unpack_from("<I", body, 16)[0]
    assert count >= 1
    addr, length, rkey, _ = struct.unpack_from("<QQII", body, 24)
    return addr, length, rkey


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    host, port, pid, secret, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4].encode(), int(sys.argv[5]), float(sys.argv[6])
    before = rss(pid)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        addr, length, rkey = handshake(s, secret)
        socks.append(s)
    want = min(64 << 10, length)
    batch = b"".join(frame(4, struct.pack("<QQII", i, addr, rkey, want)) for i in range(1000))
    for s in socks:
        s.setblocking(False)
        try:
            s.send(batch)
        except BlockingIOError:
            pass
    peak = before
    cut = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    for s in socks:  # a cut-off client sees a reset (or EOF) on its socket
        try:
            s.setblocking(True)
            s.settimeout(0.01)
            for _ in range(64):  # not cut: the data keeps coming (and the loop ends)
                if not s.recv(1 << 20):
                    cut += 1  # EOF
                    break
        except (ConnectionResetError, BrokenPipeError):
            cut += 1
        except (socket.timeout, BlockingIOError):
            pass
    print(f"clients={n} rss_before_mib={before / 2**20:.1f} rss_peak_mib={peak / 2**20:.1f} "
          f"growth_per_client_mib={(peak - before) / 2**20 / n:.2f} cut={cut}")


if __name__ == "__main__":
    main()
