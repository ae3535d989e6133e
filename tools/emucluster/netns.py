"""Network namespaces, veth pairs, a bridge and ``tc`` rate limits: one emulated cluster.

Layout of cluster ``<id>`` with H hosts (all names carry the prefix ``tcemu-<id>-``)::

      tcemu-<id>-h0            tcemu-<id>-sw              tcemu-<id>-h1
    +---------------+     +----------------------+     +---------------+
    | lo            |     |        br0           |     | lo            |
    | emu0 198.18.0.1 ====== p0   (bridge)   p1 ====== emu0 198.18.0.2 |
    | to-h1 (opt.) ================================================ to-h0 |
    +---------------+     +----------------------+     +---------------+

* every host is a namespace ``tcemu-<id>-h<i>``; its uplink ``emu0`` is one end
  of a veth pair whose other end ``p<i>`` sits in the switch namespace
  ``tcemu-<id>-sw`` and is enslaved to the bridge ``br0``. Veths are created
  directly inside the namespaces, so the root namespace never sees them and
  nothing outside the cluster is touched.
* addresses come from 198.18.0.0/15, the range RFC 2544 reserves for network
  benchmark tests: host i is ``198.18.0.<i+1>/24`` on ``emu0`` only.
* shaping: ``tc qdisc ... tbf`` at the configured rate on the egress of both
  ends of every uplink (``emu0`` in the host, ``p<i>`` in the switch), so both
  directions of the host-switch link are limited.
* ``--host-rate H=RATE`` shapes host H's uplink (both ends) at RATE instead
  of the cluster's rate: one slow NIC or cable.
* ``--pair-rate A-B=RATE`` adds a direct veth ``to-h<B>`` / ``to-h<A>`` between
  the two hosts, shaped at RATE on both ends, with a /32 route to the peer's
  address through it: traffic between A and B then bypasses the switch.
* ranks inside one namespace talk to each other through that namespace's own
  address, which Linux delivers over loopback: not shaped (fast), as inside a
  real host.

State of each cluster is a JSON file ``<state dir>/<id>.json`` (state dir
``/run/treecoll-emu``, or ``$TREECOLL_EMU_STATE_DIR``), written *before*
anything is created, so a crash half-way leaves a file that names its dead
owner pid and the next :func:`create` or :func:`destroy` sweeps it.
All functions here shell out to ``ip`` and ``tc`` (iproute2) and raise
:class:`EmuClusterError` with the failing command and its stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treecoll.topo.errors import TreecollError

__all__ = [
    "EmuClusterError",
    "PREFIX",
    "UPLINK",
    "SUBNET",
    "ClusterSpec",
    "parse_rate",
    "format_rate",
    "parse_pair_rate",
    "parse_host_rate",
    "check_prerequisites",
    "namespaces_available",
    "create",
    "destroy",
    "destroy_all",
    "sweep_stale",
    "load_state",
    "list_states",
    "status",
    "ns_name",
    "host_addr",
    "state_dir",
]

#: every namespace, state file and veth of this tool starts with this
PREFIX = "tcemu"
#: name of each host's uplink interface (inside its namespace): GLOO_SOCKET_IFNAME
UPLINK = "emu0"
#: RFC 2544 benchmark range; hosts get SUBNET.<i+1>/24
SUBNET = "198.18.0"
BRIDGE = "br0"
MAX_HOSTS = 64
_ID_RE = re.compile(r"^[a-z0-9]{1,8}$")
_NS_RE = re.compile(rf"^{PREFIX}-([a-z0-9]{{1,8}})-(?:h[0-9]+|sw)$")
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?bit)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


class EmuClusterError(TreecollError, RuntimeError):
    """An emulated-cluster operation failed (missing tool or privilege, bad spec, ip/tc error)."""


# ----------------------------------------------------------------------------- spec and parsing
def parse_rate(text: str | int | float, what: str = "rate") -> int:
    """``"1gbit"`` -> 1_000_000_000 (bits/s). Units as tc: bit, kbit, mbit, gbit, tbit (SI).

    >>> parse_rate("1gbit"), parse_rate("2.5Mbit"), parse_rate(64000)
    (1000000000, 2500000, 64000)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _RATE_RE.match(str(text))
        if not m:
            raise EmuClusterError(
                f"{what}: expected a number with a unit in {list(_RATE_UNITS)} (e.g. 1gbit), got {text!r}"
            )
        value = int(float(m.group(1)) * _RATE_UNITS[(m.group(2) or "bit").lower()])
    if value < 8000:
        raise EmuClusterError(f"{what}: expected at least 8kbit, got {text!r}")
    return value


def format_rate(bps: int) -> str:
    """1_000_000_000 -> ``"1gbit"`` (the largest unit that divides evenly)."""
    for unit, f in sorted(_RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bps % f == 0:
            return f"{bps // f}{unit}"
    return f"{bps}bit"  # pragma: no cover  (bit divides everything)


def parse_pair_rate(text: str, hosts: int) -> tuple[tuple[int, int], int]:
    """``"0-1=100mbit"`` or ``"h0-h1=100mbit"`` -> ((0, 1), 100_000_000)."""
    m = re.match(r"^\s*h?(\d+)\s*-\s*h?(\d+)\s*=\s*(.+)$", text)
    if not m:
        raise EmuClusterError(f"--pair-rate: expected A-B=RATE (e.g. 0-1=100mbit), got {text!r}")
    a, b = int(m.group(1)), int(m.group(2))
    if a == b or not (0 <= a < hosts and 0 <= b < hosts):
        raise EmuClusterError(f"--pair-rate {text!r}: expected two different hosts in 0..{hosts - 1}")
    return (min(a, b), max(a, b)), parse_rate(m.group(3), f"--pair-rate {text!r}")


def parse_host_rate(text: str, hosts: int) -> tuple[int, int]:
    """``"2=100mbit"`` or ``"h2=100mbit"`` -> (2, 100_000_000).

    >>> parse_host_rate("h2=100mbit", 4)
    (2, 100000000)
    """
    m = re.match(r"^\s*h?(\d+)\s*=\s*(.+)$", text)
    if not m:
        raise EmuClusterError(f"--host-rate: expected H=RATE (e.g. 2=100mbit), got {text!r}")
    h = int(m.group(1))
    if not 0 <= h < hosts:
        raise EmuClusterError(f"--host-rate {text!r}: expected a host in 0..{hosts - 1}, got {h}")
    return h, parse_rate(m.group(2), f"--host-rate {text!r}")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """What to build: ``hosts`` namespaces, uplinks shaped at ``rate_bps`` (bits/s),
    optional direct host pairs ``pair_rates`` {(a, b): bits/s} with a < b, optional
    uplinks at their own rate ``host_rates`` {host: bits/s}."""

    cid: str
    hosts: int
    rate_bps: int = 10**9
    pair_rates: Mapping[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    host_rates: Mapping[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.cid, str) or not _ID_RE.match(self.cid):
            raise EmuClusterError(f"cluster id: expected 1-8 characters [a-z0-9], got {self.cid!r}")
        if not isinstance(self.hosts, int) or not 1 <= self.hosts <= MAX_HOSTS:
            raise EmuClusterError(f"--hosts: expected an integer in 1..{MAX_HOSTS}, got {self.hosts!r}")
        parse_rate(self.rate_bps, "--rate")
        for (a, b), r in self.pair_rates.items():
            if not (0 <= a < b < self.hosts):
                raise EmuClusterError(f"--pair-rate {a}-{b}: expected hosts a < b in 0..{self.hosts - 1}")
            parse_rate(r, f"--pair-rate {a}-{b}")
        for h, r in self.host_rates.items():
            if not (isinstance(h, int) and 0 <= h < self.hosts):
                raise EmuClusterError(f"--host-rate {h}: expected a host in 0..{self.hosts - 1}")
            parse_rate(r, f"--host-rate {h}")
        object.__setattr__(self, "pair_rates", dict(sorted(self.pair_rates.items())))
        object.__setattr__(self, "host_rates", dict(sorted(self.host_rates.items())))

    def uplink_rate(self, host: int) -> int:
        """Bits/s of host ``host``'s uplink: its ``host_rates`` entry, else ``rate_bps``."""
        return self.host_rates.get(host, self.rate_bps)


def ns_name(cid: str, host: int | str) -> str:
    """Namespace of host ``i`` (or ``"sw"``) of cluster ``cid``: ``tcemu-<cid>-h<i>``."""
    return f"{PREFIX}-{cid}-{host if isinstance(host, str) else f'h{host}'}"


def host_addr(i: int) -> str:
    """The uplink address of host i (no prefix length)."""
    return f"{SUBNET}.{i + 1}"


def state_dir() -> Path:
    return Path(os.environ.get("TREECOLL_EMU_STATE_DIR", "/run/treecoll-emu"))


# ----------------------------------------------------------------------------- shelling out
def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EmuClusterError(f"{argv[0]}: not found; install iproute2 (apt-get install -y iproute2)") from None
    except subprocess.TimeoutExpired:
        raise EmuClusterError(f"{' '.join(argv)}: timed out after {timeout}s") from None
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().replace("\n", "; ")
        raise EmuClusterError(f"{' '.join(argv)}: failed with exit {p.returncode}: {err}")
    return p


def check_prerequisites() -> None:
    """Raise EmuClusterError (one line) unless ``ip``/``tc`` exist and we hold CAP_NET_ADMIN."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmuClusterError(
                f"emulated cluster: needs `{tool}` (iproute2) on PATH; install it with `apt-get install -y iproute2`"
            )
    if not _has_cap_net_admin():
        raise EmuClusterError(
            "emulated cluster: needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to manage "
            "network namespaces; run as root, e.g. with sudo"
        )


def _has_cap_net_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << 12)) and bool(caps & (1 << 21))  # NET_ADMIN, SYS_ADMIN
    except OSError:
        pass
    return os.geteuid() == 0


def namespaces_available() -> tuple[bool, str]:
    """(True, "") when a probe namespace with a shaped veth can be made here, else (False, why)."""
    try:
        check_prerequisites()
    except EmuClusterError as e:
        return False, str(e)
    probe = f"{PREFIX}-probe{os.getpid() % 100000}"
    try:
        _run(["ip", "netns", "add", probe])
        try:
            _run(["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
            _run(
                [
                    "tc",
                    "-n",
                    probe,
                    "qdisc",
                    "add",
                    "dev",
                    "pa",
                    "root",
                    "tbf",
                    "rate",
                    "1gbit",
                    "burst",
                    "128kb",
                    "latency",
                    "50ms",
                ]
            )
        finally:
            _run(["ip", "netns", "del", probe], check=False)
    except EmuClusterError as e:
        return False, f"network namespaces or tc tbf unavailable: {e}"
    return True, ""


# ----------------------------------------------------------------------------- state files
def _state_path(cid: str) -> Path:
    return state_dir() / f"{cid}.json"


def _write_state(state: dict) -> None:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{state['id']}.json.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(_state_path(state["id"]))


def load_state(cid: str) -> dict | None:
    """The state dict of cluster ``cid``, or None when there is no (readable) state file."""
    try:
        return json.loads(_state_path(cid).read_text())
    except (OSError, ValueError):
        return None


def list_states() -> list[dict]:
    """Every readable state file, by id."""
    d = state_dir()
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        s = load_state(p.stem)
        if s is not None:
            out.append(s)
    return out


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_stale(state: dict) -> bool:
    """A cluster is stale when its owner (a `run`, or an `up` still creating) has died."""
    owner = state.get("owner_pid")
    return owner is not None and not _pid_alive(owner)


# ----------------------------------------------------------------------------- create / destroy
def _tbf(ns: str, dev: str, rate_bps: int) -> list[str]:
    # bucket: at least one 64 KiB GSO segment and one timer tick (1 ms) of tokens at the rate;
    # latency bounds the queue (tbf's `limit`) at 50 ms worth of bytes.
    burst = max(64 * 1024, rate_bps // 8 // 1000)
    return [
        "tc",
        "-n",
        ns,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{rate_bps}bit",
        "burst",
        str(burst),
        "latency",
        "50ms",
    ]


def _ns_sysctl(ns: str, key: str, value: str) -> None:
    _run(["ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > /proc/sys/{key.replace('.', '/')}"])


def create(spec: ClusterSpec, *, owner_pid: int | None = None, extra: Mapping[str, Any] | None = None) -> dict:
    """Build the cluster of ``spec`` and return its state dict (also written to the state file).

    ``owner_pid``: the process that will tear the cluster down (``run``); None
    for a cluster that stays up until ``down``. Raises EmuClusterError when the
    id is in use; on any failure half-way, everything created is removed again.
    """
    check_prerequisites()
    sweep_stale()
    existing = load_state(spec.cid)
    if existing is not None or _namespaces(spec.cid):
        raise EmuClusterError(
            f"cluster {spec.cid!r}: already exists; use it with --id {spec.cid}, "
            f"or remove it with `treecoll emu down --id {spec.cid}`"
        )
    hosts = [ns_name(spec.cid, i) for i in range(spec.hosts)]
    sw = ns_name(spec.cid, "sw")
    state = {
        "id": spec.cid,
        "hosts": spec.hosts,
        "rate_bps": spec.rate_bps,
        "rate": format_rate(spec.rate_bps),
        "pair_rates": {f"{a}-{b}": r for (a, b), r in spec.pair_rates.items()},
        "host_rates": {str(h): r for h, r in spec.host_rates.items()},
        "namespaces": hosts + [sw],
        "switch": sw,
        "uplink": UPLINK,
        "addresses": [host_addr(i) for i in range(spec.hosts)],
        "owner_pid": os.getpid(),
        "status": "creating",
        "created": time.time(),
        **dict(extra or {}),
    }
    _write_state(state)  # first, so that a crash half-way is swept later
    try:
        for ns in hosts + [sw]:
            _run(["ip", "netns", "add", ns])
            _ns_sysctl(ns, "net.ipv6.conf.all.disable_ipv6", "1")
            _ns_sysctl(ns, "net.ipv6.conf.default.disable_ipv6", "1")
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", BRIDGE, "up"])
        for i, ns in enumerate(hosts):
            port = f"p{i}"
            _run(["ip", "link", "add", "name", UPLINK, "netns", ns, "type", "veth", "peer", "name", port, "netns", sw])
            _run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE])
            _run(["ip", "-n", sw, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{host_addr(i)}/24", "dev", UPLINK])
            _run(["ip", "-n", ns, "link", "set", UPLINK, "up"])
            _run(_tbf(ns, UPLINK, spec.uplink_rate(i)))
            _run(_tbf(sw, port, spec.uplink_rate(i)))
        for (a, b), rate in spec.pair_rates.items():
            da, db = f"to-h{b}", f"to-h{a}"
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    "name",
                    da,
                    "netns",
                    hosts[a],
                    "type",
                    "veth",
                    "peer",
                    "name",
                    db,
                    "netns",
                    hosts[b],
                ]
            )
            for ns, dev, me, peer in ((hosts[a], da, a, b), (hosts[b], db, b, a)):
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
                _run(_tbf(ns, dev, rate))
                _run(["ip", "-n", ns, "route", "add", f"{host_addr(peer)}/32", "dev", dev, "src", host_addr(me)])
    except BaseException:
        _teardown(spec.cid, [*hosts, sw])
        raise
    state["status"] = "up"
    state["owner_pid"] = owner_pid
    _write_state(state)
    return state


def _namespaces(cid: str | None = None) -> list[str]:
    """Namespaces of cluster ``cid`` (or of every cluster) that exist now."""
    p = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    want = f"{PREFIX}-{cid}-" if cid else f"{PREFIX}-"
    return sorted(n for n in names if n.startswith(want))


def _delete_namespace(ns: str) -> bool:
    """SIGKILL the processes left inside ``ns`` (ranks of a crashed run; they were started here), then
    delete ``ns`` (its veths and qdiscs go with it); whether it was deleted."""
    p = _run(["ip", "netns", "pids", ns], check=False)
    for tok in p.stdout.split():
        if tok.isdigit() and int(tok) != os.getpid():
            try:
                os.kill(int(tok), signal.SIGKILL)
            except ProcessLookupError:
                pass
    return _run(["ip", "netns", "del", ns], check=False).returncode == 0


def _teardown(cid: str, namespaces: Sequence[str]) -> list[str]:
    """Delete namespaces (their veths and qdiscs go with them) and the state file; return removed."""
    removed = []
    for ns in sorted(set(namespaces) | set(_namespaces(cid))):
        if _delete_namespace(ns):
            removed.append(ns)
    _sweep_root_links()
    for f in [_state_path(cid), *state_dir().glob(f"{cid}.run*.yaml")]:
        try:
            f.unlink()
        except FileNotFoundError:
            pass
    return removed


def _sweep_root_links() -> list[str]:
    """Delete links named ``tcemu*`` in the calling (root) namespace. None are made there;
    this only catches leftovers of older versions or hand-made experiments."""
    p = _run(["ip", "-o", "link", "show"], check=False)
    gone = []
    for line in p.stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                _run(["ip", "link", "del", name], check=False)
                gone.append(name)
    return gone


def destroy(cid: str) -> list[str]:
    """Remove cluster ``cid`` (namespaces, veths, qdiscs, state file); return the removed namespaces.

    Works without a state file (finds namespaces by prefix)."""
    if not _ID_RE.match(cid or ""):
        raise EmuClusterError(f"cluster id: expected 1-8 characters [a-z0-9], got {cid!r}")
    check_prerequisites()
    state = load_state(cid) or {}
    return _teardown(cid, state.get("namespaces", []))


def destroy_all() -> list[str]:
    """Remove every cluster of this tool: all state files and every ``tcemu-*`` namespace."""
    check_prerequisites()
    removed = []
    for s in list_states():
        removed += _teardown(s["id"], s.get("namespaces", []))
    for ns in _namespaces():
        if _delete_namespace(ns):
            removed.append(ns)
    _sweep_root_links()
    return removed


def sweep_stale() -> list[str]:
    """Remove clusters whose owner died and namespaces with the prefix but no state file."""
    removed = []
    known = set()
    for s in list_states():
        if _is_stale(s):
            removed += _teardown(s["id"], s.get("namespaces", []))
        else:
            known.add(s["id"])
    for ns in _namespaces():
        m = _NS_RE.match(ns)
        if m is None:  # e.g. a probe of namespaces_available() in progress elsewhere
            continue
        cid = m.group(1)
        if cid not in known and load_state(cid) is None:
            if _delete_namespace(ns):
                removed.append(ns)
    return removed


def status() -> dict:
    """Plain data: every ``tcemu-*`` namespace with its links, addresses and qdiscs, and the states."""
    out: dict[str, Any] = {"clusters": list_states(), "namespaces": {}, "root_links": []}
    if shutil.which("ip") is None:
        out["error"] = "ip (iproute2) not found"
        return out
    for ns in _namespaces():
        links = _run(["ip", "-n", ns, "-br", "link"], check=False).stdout.split("\n")
        addrs = _run(["ip", "-n", ns, "-br", "-4", "addr"], check=False).stdout.split("\n")
        qd = _run(["tc", "-n", ns, "qdisc", "show"], check=False).stdout.split("\n")
        out["namespaces"][ns] = {
            "links": [" ".join(x.split()) for x in links if x.strip()],
            "addresses": [" ".join(x.split()) for x in addrs if x.strip()],
            "qdiscs": [x.strip() for x in qd if x.strip() and "noqueue" not in x],
        }
    p = _run(["ip", "-o", "link", "show"], check=False)
    out["root_links"] = [
        ln.split(":")[1].strip()
        for ln in p.stdout.splitlines()
        if len(ln.split(":")) > 1 and ln.split(":")[1].strip().startswith(PREFIX)
    ]
    return out
