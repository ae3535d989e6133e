"""iperf-like measurements between hosts of an emulated cluster (plain Python sockets).

A server process runs inside the destination namespace, a client inside the
source namespace (``ip netns exec``); the client streams ``nbytes`` over one
TCP connection, and the server reports the time from first byte to last.
Round trip time is the median of 200 one-byte ping-pongs (TCP_NODELAY).

Used to check that the shaped rate is what was configured, and to measure the
intra-host (loopback) link written into the Topology YAML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from .netns import EmuClusterError, host_addr, ns_name

__all__ = ["measure_pair", "measure_link", "rates"]

_SERVER = r"""
import json, socket, sys, time
addr = sys.argv[1]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[2])):
    b = c.recv(1); c.sendall(b)
got, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    got += len(b)
dt = time.perf_counter() - t0
print(json.dumps({"bytes": got, "seconds": dt}), flush=True)
c.sendall(b"k"); c.close()
"""

_CLIENT = r"""
import json, socket, statistics, sys, time
addr, port, n, pings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = socket.create_connection((addr, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(pings):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
buf = bytes(1 << 20); sent = 0
while sent < n:
    c.sendall(buf); sent += len(buf)
c.shutdown(socket.SHUT_WR); c.recv(1)
print(json.dumps({"rtt_median_s": statistics.median(rtts) if rtts else None}), flush=True)
"""


def _py(ns: str, code: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-c", code, *map(str, args)]


def measure_pair(
    cid: str, src: int, dst: int, nbytes: int = 64 << 20, pings: int = 200, timeout: float = 60
) -> dict[str, Any]:
    """Stream ``nbytes`` from host ``src`` to host ``dst`` of cluster ``cid`` (src == dst: loopback
    through the host's own address) and return {bytes, seconds, gbit_s, gb_s, rtt_us}.

    ``gb_s`` is GB/s (1e9 B/s) of payload; ``rtt_us`` the median round trip in µs."""
    sns, dns = ns_name(cid, src), ns_name(cid, dst)
    addr = host_addr(dst)
    srv = subprocess.Popen(
        _py(dns, _SERVER, addr, pings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        port = srv.stdout.readline().strip()
        if not port.isdigit():
            raise EmuClusterError(f"measure {src}->{dst}: server did not start: {srv.stderr.read().strip()}")
        try:
            cli = subprocess.run(
                _py(sns, _CLIENT, addr, port, nbytes, pings), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise EmuClusterError(f"measure {src}->{dst}: no result within {timeout}s") from None
        if cli.returncode != 0:
            raise EmuClusterError(f"measure {src}->{dst}: client failed: {cli.stderr.strip()[-300:]}")
        out, _ = srv.communicate(timeout=timeout)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    res = json.loads(out.strip().splitlines()[-1])
    rtt = json.loads(cli.stdout.strip().splitlines()[-1])["rtt_median_s"]
    return rates(src, dst, res["bytes"], res["seconds"], rtt)


def rates(src: int, dst: int, nbytes: int, seconds: float, rtt_s: float | None) -> dict[str, Any]:
    """One measurement as plain data: payload rate in Gbit/s (1e9 bit/s) and GB/s (1e9 B/s),
    round trip in microseconds.

    >>> rates(0, 1, 125_000_000, 1.0, 250e-6)
    {'src': 0, 'dst': 1, 'bytes': 125000000, 'seconds': 1.0, 'gbit_s': 1.0, 'gb_s': 0.125, 'rtt_us': 250.0}
    """
    bps = nbytes / seconds
    return {
        "src": src,
        "dst": dst,
        "bytes": nbytes,
        "seconds": seconds,
        "gbit_s": bps * 8 / 1e9,
        "gb_s": bps / 1e9,
        "rtt_us": None if rtt_s is None else rtt_s * 1e6,
    }


def measure_link(cid: str, hosts: int, nbytes: int = 64 << 20) -> dict[str, Any]:
    """Loopback inside host 0 and the link host 0 -> host 1 (when there are two hosts)."""
    out = {"loopback": measure_pair(cid, 0, 0, nbytes * 4)}
    if hosts > 1:
        out["inter_host"] = measure_pair(cid, 0, 1, nbytes)
    return out
