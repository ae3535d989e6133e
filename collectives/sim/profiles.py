"""Cost profiles of the simulator: per-step latency floors, bandwidth efficiency, fixed overhead.

A :class:`Profile` turns the physical topology (link ``bw`` and ``lat``) into
what a communication library achieves on it:

* ``base_lat_us``: fixed cost of one collective call (kernel launch and
  setup), added once to the completion time.
* ``lat_floor_us``: per-transfer latency floor by route class (``nvlink``,
  ``pci``, ``net``); a transfer's latency is ``max(route latency, floor)``.
* ``bw_eff``: fraction of each link kind's bandwidth the protocol delivers
  as payload (link kinds ``nvlink``, ``c2c``, ``pcie``, ``smp``, ``net``).
* ``reduce_cost``: whether reduce steps cost ``3 × bytes / mem_bw``.
* ``nic_lat_mult``: how many times a route adds its sending NIC's ``lat``
  (the transport's own latency, what an NCCL net plugin reports as
  ``ncclNetProperties.latency``; NCCL adds it to every inter-node step, and
  twice with the Simple protocol for the receiver's flush: tuning.cc).
* ``tree_eff``: fraction of ``bw_eff`` a tree allreduce achieves (NCCL's
  tuner models tree allreduce at ``busBw × 0.92``, tuning.cc); applied by
  :meth:`Profile.for_tree_allreduce`.

Built-in profiles (:data:`PROFILES`): ``ideal`` (the topology as written,
no overheads: closed forms hold exactly) and NCCL's three protocols with
NCCL 2.30's own constants (src/graph/tuning.cc ``ncclTunerConstantsDefaults``,
https://github.com/NVIDIA/nccl):

==============  ==========  ==========================  ============================
profile         base (µs)   floor nvlink/pci/net (µs)   bandwidth efficiency
==============  ==========  ==========================  ============================
``nccl-ll``     6.6         0.6 / 1.0 / 2.7             0.5 (8-byte lines, 4 flag bytes)
``nccl-ll128``  14.0        1.9 / 2.5 / 4.0             0.92 (NCCL's ring LL128 factor)
``nccl-simple`` 8.4         3.4 / 5.7 / 14.0            1.0
==============  ==========  ==========================  ============================

A :class:`Calibration` (what ``treecoll simulate calibrate`` writes) is not one
more protocol: it keeps the simulator's defaults (NCCL's three protocols, the
fastest per size; NVLS with NCCL's NVLS constants) and corrects them with
factors measured on one machine, each standing for one piece of physics:

* ``link_scale``: per link class (``nvlink``: NVLink and NVLink-C2C; ``pcie``:
  PCIe and the CPU interconnect; ``net``: the NICs), a factor on the links'
  bandwidth shared by every algorithm and protocol (the links are what they
  are, whatever runs on them);
* ``hop_scale``: per route class (``nvlink``, ``pci``, ``net``), a factor on
  the latency of one hop over that class (the per-hop floor of every protocol
  and, for ``net``, the NIC latency count), shared by every algorithm family:
  a hop over the network costs what the fabric costs, whichever kernel sends;
* ``lat_scale``: per algorithm family (``ring``: NCCL's rings and chains,
  PAT included; ``tree``; ``nvls``: NVLS and NVLSTree; ``p2p``: alltoall and
  sendrecv), a factor on that family's latencies (base latency, per-hop floors,
  NIC latency count) on top of ``hop_scale``: each family is its own kernel
  with its own setup and synchronisation;
* ``bw_scale``: per family whose bandwidth is more than its links' (``tree``:
  NCCL's tree efficiency; ``nvls``: the switches' reduction efficiency and
  NVLSTree's per-channel cap), a factor on that family's bandwidth on top of
  the links': those are NCCL's estimates of its own kernels, not properties of
  the links a ring or a point-to-point transfer shows.

* ``hop_lat_us``: for the network (``net``), a latency in µs added to every
  hop over it, whichever family and protocol sends (once per hop with LL and
  LL128, twice with Simple and NVLS, as NCCL adds its net plugin's latency:
  tuning.cc, "Also add the flush extra latency"): the transport's own
  per-message cost (what ``ncclNetProperties.latency`` reports), which a
  TCP-based or offloaded transport (GPUDirect-TCPX/TCPXO, sockets) adds on
  top of NCCL's per-hop constants; it shows where the measured time stays
  flat as the message grows;
* ``proto_bw``: per protocol (``ll``, ``ll128``), a factor on the bandwidth
  that protocol delivers over every link (its payload per line, and the few
  channels NCCL runs small messages on), on top of the links': LL and LL128
  run the small and middle sizes, where a curve's slope is their bandwidth,
  not the links' a large message shows.

* ``proto_max``: per protocol (``ll``, ``ll128``), the largest message (bytes,
  as nccl-tests prints the size) that protocol runs at: NCCL's tuner switches
  from LL to LL128 to Simple as messages grow, and where it switches on a
  machine shows as a step in the measured curve. Absent: the simulator's
  defaults (LL up to 8 MiB, LL128 wherever NCCL enables it).

A factor absent from the file is 1 and an added latency 0 (the defaults). :meth:`Calibration.apply`
gives the profile one protocol of one family runs with; the simulator calls
it wherever it expands ``auto`` into NCCL's protocols, on NCCL's own
latencies of that family (tuning.cc: the tree's base and per-hop latencies
differ from the ring's; with one GPU per host a ring's network hop takes the
tree's), and asks :meth:`Calibration.runs` which protocols a size runs. Used where a single profile
is needed (e.g. :func:`~treecoll.collectives.sim.simulator.simulate` on a
schedule), a calibration is NCCL's Simple protocol with the ring's factors.

Profiles are plain data; :func:`save_profile` / :func:`load_profile` write and
read them as YAML (what the calibration command produces). A file with
``link_scale`` / ``lat_scale`` (``kind: calibration``) is a :class:`Calibration`,
any other a plain :class:`Profile` (the fields above); an unknown key is
refused with the file and the key.

>>> get_profile("nccl-ll").step_lat("net")
2.7e-06
>>> c = Calibration("mine", link_scale={"nvlink": 0.8}, lat_scale={"p2p": 2.0})
>>> simple = get_profile("nccl-simple")
>>> c.apply(simple, "p2p").efficiency("nvlink"), c.apply(simple, "p2p").base_lat_us
(0.8, 16.8)
>>> c.apply(simple, "ring").base_lat_us, c.apply(simple, "ring").efficiency("net")
(8.4, 1.0)
>>> c2 = Calibration("mine", hop_scale={"net": 2.0}, proto_max={"ll": 4096})
>>> c2.apply(get_profile("nccl-ll"), "tree").lat_floor_us   # LL's hops, the network's doubled
{'nvlink': 0.6, 'pci': 1.0, 'net': 5.4}
>>> c2.runs("nccl-ll", 4096), c2.runs("nccl-ll", 8192), c2.runs("nccl-ll128", 1 << 30)
(True, False, None)
>>> c3 = Calibration("mine", hop_lat_us={"net": 40.0}, proto_bw={"ll": 0.5})
>>> ll, sim = c3.apply(get_profile("nccl-ll"), "ring"), c3.apply(simple, "ring")
>>> ll.lat_floor_us["net"], sim.lat_floor_us["net"], ll.efficiency("net"), sim.efficiency("net")
(42.7, 94.0, 0.25, 1.0)
>>> get_profile("fast")
Traceback (most recent call last):
...
treecoll.topo.errors.CollectiveError: profile 'fast': expected one of [...], got an unknown name; or give a YAML file
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from treecoll.topo.errors import CollectiveError
from treecoll.topo.model import LINK_KINDS

__all__ = [
    "Profile",
    "Calibration",
    "PROFILES",
    "NCCL_PROTOCOLS",
    "NCCL_PROTO_NAMES",
    "NCCL_PROTO_PROFILES",
    "get_profile",
    "load_profile",
    "save_profile",
    "ROUTE_CLASSES",
    "LINK_CLASSES",
    "FAMILIES",
    "BW_FAMILIES",
    "SCALE_BOUNDS",
    "HOP_BOUNDS",
    "MAX_EFFICIENCY",
    "SWITCH_PROTOCOLS",
    "SWITCH_BOUNDS",
    "SCHEMA_VERSION",
    "LAT_US_BOUNDS",
    "LAT_CLASSES",
    "parameter_default",
]

ROUTE_CLASSES = ("nvlink", "pci", "net")
#: link classes a :class:`Calibration` scales, and the link kinds of each
LINK_CLASSES: dict[str, tuple[str, ...]] = {"nvlink": ("nvlink", "c2c"), "pcie": ("pcie", "smp"), "net": ("net",)}
#: algorithm families with their own latency factor in a :class:`Calibration`
FAMILIES = ("ring", "tree", "nvls", "p2p")
#: algorithm families with their own bandwidth factor in a :class:`Calibration`
BW_FAMILIES = ("tree", "nvls")
#: the range of a calibration factor: ``link_scale``, ``hop_scale``, ``lat_scale``, ``bw_scale``, ``proto_bw``
SCALE_BOUNDS: dict[str, tuple[float, float]] = {
    "link_scale": (0.1, 2.0),
    "hop_scale": (0.1, 20.0),
    "lat_scale": (0.1, 20.0),
    "bw_scale": (0.1, 2.0),
    # LL at small sizes: a few channels of 8-byte lines, a tenth of the links' bandwidth or less; never more
    # than its line format carries (LL: 4 data bytes of 8, LL128: 120 of 128)
    "proto_bw": (0.05, 1.0),
}
#: the range of a hop within a host (``hop_scale.nvlink``, ``.pci``): a fixed piece of silicon whose latency
#: differs little between machines, where the network's (``hop_scale.net``, :data:`SCALE_BOUNDS`) depends on
#: the fabric and its transport (a TCP-based one takes several times InfiniBand's). These are the ranges a
#: calibration file may say (a file an earlier fit wrote still loads); ``treecoll simulate calibrate``
#: searches narrower ones (a hop within a host half to twice NCCL's per-hop constants)
HOP_BOUNDS: dict[str, tuple[float, float]] = {"nvlink": (0.25, 4.0), "pci": (0.25, 4.0)}
#: protocols with a switch point (``proto_max``) in a :class:`Calibration`, and the NCCL profile of each
SWITCH_PROTOCOLS: dict[str, str] = {"ll": "nccl-ll", "ll128": "nccl-ll128"}
#: route classes with an added latency (``hop_lat_us``) in a :class:`Calibration`: the network's transport
LAT_CLASSES = ("net",)
#: the range of an added latency (``hop_lat_us``), µs: none to a millisecond per hop
LAT_US_BOUNDS = (0.0, 1000.0)
#: the range of a ``proto_max`` switch point, bytes
SWITCH_BOUNDS = (64, 1 << 40)
#: version of the calibration YAML :func:`save_profile` writes (1: link_scale, lat_scale, bw_scale; 2 adds
#: hop_scale and proto_max, and the tree's own NCCL latencies under lat_scale; 3 adds hop_lat_us and
#: proto_bw); :func:`load_profile` reads every version (an absent field is its default)
SCHEMA_VERSION = 3
#: the versions :func:`load_profile` reads
SCHEMA_VERSIONS = (1, 2, 3)
#: largest ``bw_eff``: above 1 only where a calibration found a link faster than the topology says
MAX_EFFICIENCY = 2.0


@dataclass(frozen=True)
class Profile:
    """How a library uses the links; see the module docstring. Times in µs, efficiencies in (0, 1]
    (up to :data:`MAX_EFFICIENCY` in a profile a :class:`Calibration` derives)."""

    name: str = "ideal"
    base_lat_us: float = 0.0
    lat_floor_us: Mapping[str, float] = field(default_factory=dict)
    bw_eff: Mapping[str, float] = field(default_factory=dict)
    reduce_cost: bool = True
    source: str = ""
    nic_lat_mult: float = 1.0
    tree_eff: float = 1.0

    def __post_init__(self) -> None:
        what = f"profile {self.name!r}"
        if not isinstance(self.base_lat_us, (int, float)) or self.base_lat_us < 0:
            raise CollectiveError(f"{what}: base_lat_us expected a non-negative number, got {self.base_lat_us!r}")
        for k, v in dict(self.lat_floor_us).items():
            if k not in ROUTE_CLASSES or not isinstance(v, (int, float)) or v < 0:
                raise CollectiveError(
                    f"{what}: lat_floor_us.{k} expected a class in {list(ROUTE_CLASSES)} "
                    f"with a non-negative µs value, got {v!r}"
                )
        for k, v in dict(self.bw_eff).items():
            if k not in LINK_KINDS or not _number(v) or not 0 < v <= MAX_EFFICIENCY:
                raise CollectiveError(
                    f"{what}: bw_eff.{k} expected a link kind in {list(LINK_KINDS)} with a value in "
                    f"(0, {MAX_EFFICIENCY:g}], got {v!r}"
                )
        if not (_number(self.nic_lat_mult) and self.nic_lat_mult >= 0):
            raise CollectiveError(f"{what}: nic_lat_mult expected a non-negative number, got {self.nic_lat_mult!r}")
        if not (_number(self.tree_eff) and 0 < self.tree_eff <= 1):
            raise CollectiveError(f"{what}: tree_eff expected a value in (0, 1], got {self.tree_eff!r}")
        object.__setattr__(self, "lat_floor_us", dict(self.lat_floor_us))
        object.__setattr__(self, "bw_eff", dict(self.bw_eff))

    def for_tree_allreduce(self) -> Profile:
        """This profile with every ``bw_eff`` scaled by ``tree_eff`` (and ``tree_eff`` 1)."""
        if self.tree_eff == 1.0:
            return self
        import dataclasses

        return dataclasses.replace(
            self, bw_eff={k: self.efficiency(k) * self.tree_eff for k in LINK_KINDS}, tree_eff=1.0
        )

    def step_lat(self, cls: str) -> float:
        """Latency floor of one transfer on a route of class ``cls``, seconds."""
        return float(self.lat_floor_us.get(cls, 0.0)) * 1e-6

    def efficiency(self, kind: str) -> float:
        """Payload fraction of a link of kind ``kind``."""
        return float(self.bw_eff.get(kind, 1.0))

    @property
    def base_lat(self) -> float:
        """Fixed cost of one collective call, seconds."""
        return self.base_lat_us * 1e-6

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "base_lat_us": self.base_lat_us,
            "lat_floor_us": dict(self.lat_floor_us),
            "bw_eff": dict(self.bw_eff),
            "reduce_cost": self.reduce_cost,
            "source": self.source,
            "nic_lat_mult": self.nic_lat_mult,
            "tree_eff": self.tree_eff,
        }


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _uniform(e: float) -> dict[str, float]:
    return {k: e for k in LINK_KINDS}


_TUNING = (
    "NCCL 2.30 src/graph/tuning.cc ncclTunerConstantsDefaults (ring baseLat, hwLat NVLINK/PCI/NET); "
    "tree allreduce busBw x 0.92 (ncclTopoTuneModel)"
)
#: NCCL's tree allreduce bandwidth factor (tuning.cc: busBw * .92)
NCCL_TREE_EFF = 0.92
PROFILES: dict[str, Profile] = {
    "ideal": Profile("ideal", source="the topology's link bw and lat, no protocol overhead"),
    # LL: 8-byte stores of 4 data bytes + 4 flag bytes -> half the bandwidth (NCCL: ring LL busBw * 0.5)
    "nccl-ll": Profile(
        "nccl-ll", 6.6, {"nvlink": 0.6, "pci": 1.0, "net": 2.7}, _uniform(0.5), source=_TUNING, tree_eff=NCCL_TREE_EFF
    ),
    # LL128: NCCL models ring LL128 busBw * 0.92
    "nccl-ll128": Profile(
        "nccl-ll128",
        14.0,
        {"nvlink": 1.9, "pci": 2.5, "net": 4.0},
        _uniform(0.92),
        source=_TUNING,
        tree_eff=NCCL_TREE_EFF,
    ),
    # Simple: NCCL adds the net plugin's latency twice ("Also add the flush extra latency", tuning.cc)
    "nccl-simple": Profile(
        "nccl-simple",
        8.4,
        {"nvlink": 3.4, "pci": 5.7, "net": 14.0},
        _uniform(1.0),
        source=_TUNING,
        nic_lat_mult=2.0,
        tree_eff=NCCL_TREE_EFF,
    ),
}
#: the protocols NCCL chooses among; "auto" in the simulator takes the fastest of these per size
NCCL_PROTOCOLS = ("nccl-ll", "nccl-ll128", "nccl-simple")
#: NCCL's own name of each protocol profile (NCCL_PROTO=LL, LL128, Simple; src/include/device.h)
NCCL_PROTO_NAMES = {"nccl-ll": "LL", "nccl-ll128": "LL128", "nccl-simple": "Simple"}
#: the protocol profile of each of NCCL's protocol names
NCCL_PROTO_PROFILES = {name: profile for profile, name in NCCL_PROTO_NAMES.items()}


@dataclass(frozen=True)
class Calibration(Profile):
    """The simulator's default physics corrected by measured factors (see the module docstring).

    ``link_scale``: link class (:data:`LINK_CLASSES`) -> factor on its links' bandwidth;
    ``hop_scale``: route class (:data:`ROUTE_CLASSES`) -> factor on one hop's latency, every family;
    ``lat_scale``: family (:data:`FAMILIES`) -> factor on that family's latencies; each factor in
    :data:`SCALE_BOUNDS`, absent ones 1; ``bw_scale``: family (:data:`BW_FAMILIES`) -> factor on that
    family's bandwidth over the links'; ``proto_max``: protocol (:data:`SWITCH_PROTOCOLS`) -> the
    largest message it runs at, bytes in :data:`SWITCH_BOUNDS` (absent: the simulator's rule);
    ``hop_lat_us``: route class (:data:`LAT_CLASSES`) -> µs added to every hop over it, within
    :data:`LAT_US_BOUNDS` (absent: 0); ``proto_bw``: protocol (``ll``, ``ll128``) -> factor on its
    bandwidth.
    ``fitted``: the parameters (``link_scale.net``, ``lat_scale.p2p``, ...) a fit moved; the others are
    the defaults. The :class:`Profile` fields are derived (NCCL's Simple protocol with the ring's
    factors, :meth:`plain`), never given.
    """

    link_scale: Mapping[str, float] = field(default_factory=dict)
    lat_scale: Mapping[str, float] = field(default_factory=dict)
    bw_scale: Mapping[str, float] = field(default_factory=dict)
    fitted: tuple[str, ...] = ()
    hop_scale: Mapping[str, float] = field(default_factory=dict)
    proto_max: Mapping[str, int] = field(default_factory=dict)
    hop_lat_us: Mapping[str, float] = field(default_factory=dict)
    proto_bw: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        what = f"profile {self.name!r}"
        for fld, keys in _FIELDS:
            m = getattr(self, fld)
            if not isinstance(m, Mapping):
                raise CollectiveError(f"{what}: {fld} expected a mapping of {list(keys)} to factors, got {m!r}")
            for k, v in m.items():
                if k not in keys:
                    raise CollectiveError(f"{what}: {fld}.{k}: expected one of {list(keys)}, got an unknown key")
                lo, hi = calibration_parameters()[f"{fld}.{k}"]
                if not _number(v) or not lo <= v <= hi:
                    unit = "a latency in µs" if fld == "hop_lat_us" else "a factor"
                    raise CollectiveError(f"{what}: {fld}.{k} expected {unit} in [{lo:g}, {hi:g}], got {v!r}")
            object.__setattr__(self, fld, {k: float(v) for k, v in m.items()})
        if not isinstance(self.proto_max, Mapping):
            raise CollectiveError(f"{what}: proto_max expected a mapping of {list(SWITCH_PROTOCOLS)} to bytes")
        lo, hi = SWITCH_BOUNDS
        for k, v in self.proto_max.items():
            if k not in SWITCH_PROTOCOLS:
                raise CollectiveError(
                    f"{what}: proto_max.{k}: expected one of {list(SWITCH_PROTOCOLS)}, got an unknown key"
                )
            if not _number(v) or not lo <= v <= hi:
                raise CollectiveError(f"{what}: proto_max.{k} expected bytes in [{lo}, {hi}], got {v!r}")
        object.__setattr__(self, "proto_max", {k: int(v) for k, v in self.proto_max.items()})
        bad = [p for p in self.fitted if p not in calibration_parameters() and p not in switch_parameters()]
        if bad:
            raise CollectiveError(
                f"{what}: fitted: unknown parameter {bad[0]!r}; expected some of {list(calibration_parameters())}"
            )
        object.__setattr__(self, "fitted", tuple(self.fitted))
        plain = self.apply(PROFILES["nccl-simple"], "ring")
        for f in ("base_lat_us", "lat_floor_us", "bw_eff", "reduce_cost", "nic_lat_mult", "tree_eff"):
            object.__setattr__(self, f, getattr(plain, f))
        super().__post_init__()

    def value(self, parameter: str) -> float:
        """One parameter by its name (``link_scale.nvlink``, ``lat_scale.ring``, ``hop_lat_us.net``, ...);
        its default when absent (:func:`parameter_default`)."""
        fld, _, key = parameter.partition(".")
        return float(getattr(self, fld).get(key, parameter_default(parameter)))

    def runs(self, protocol: str, nbytes: int) -> bool | None:
        """Whether NCCL protocol profile ``protocol`` (``nccl-ll``, ...) runs a message of ``nbytes`` on this
        machine: False above its ``proto_max``, True up to it, None where the calibration does not say (the
        simulator's own rule holds)."""
        key = next((k for k, p in SWITCH_PROTOCOLS.items() if p == protocol), None)
        if key is None or key not in self.proto_max:
            return None
        return nbytes <= self.proto_max[key]

    def link_factor(self, kind: str) -> float:
        """The factor on links of kind ``kind`` (a :data:`~treecoll.topo.model.LINK_KINDS` name)."""
        cls = next((c for c, kinds in LINK_CLASSES.items() if kind in kinds), None)
        return float(self.link_scale.get(cls, 1.0)) if cls else 1.0

    def apply(self, protocol: Profile, family: str) -> Profile:
        """``protocol`` as algorithm family ``family`` runs it on this machine: every link kind's
        efficiency times its class's factor, the family's ``bw_scale`` and the protocol's ``proto_bw``,
        each route class's per-hop floor times its ``hop_scale`` (the network's NIC latency count too),
        and the base latency, per-hop floors and NIC latency count times the family's ``lat_scale``;
        then the network's per-hop floor plus ``hop_lat_us.net`` times the protocol's own NIC latency
        count (1 for LL and LL128, 2 for Simple and NVLS: NCCL adds the transport's latency twice there).
        ``protocol`` carries the family's own latencies (the simulator gives NCCL's protocols with the
        tree's, or with one GPU per host the ring's network hop at the tree's:
        :func:`~treecoll.collectives.sim.simulator.nccl_hop_profile`). The name stays the protocol's
        (the simulator keys protocol constants on it)."""
        import dataclasses

        if family not in FAMILIES:
            raise CollectiveError(f"calibration {self.name!r}: family expected one of {list(FAMILIES)}, got {family!r}")
        s = float(self.lat_scale.get(family, 1.0))
        proto = next((k for k, p in SWITCH_PROTOCOLS.items() if p == protocol.name), None)
        b = float(self.bw_scale.get(family, 1.0)) * float(self.proto_bw.get(proto, 1.0))
        hop = {k: float(self.hop_scale.get(k, 1.0)) for k in ROUTE_CLASSES}
        # the transport's latency: once per hop, or as many times as the protocol adds the NIC's (Simple: 2)
        added = {k: float(self.hop_lat_us.get(k, 0.0)) * protocol.nic_lat_mult for k in LAT_CLASSES}
        base = Profile(
            protocol.name,
            protocol.base_lat_us,
            protocol.lat_floor_us,
            protocol.bw_eff,
            protocol.reduce_cost,
            protocol.source,
            protocol.nic_lat_mult,
            protocol.tree_eff,
        )
        return dataclasses.replace(
            base,
            base_lat_us=base.base_lat_us * s,
            lat_floor_us={k: v * s * hop.get(k, 1.0) + added.get(k, 0.0) for k, v in base.lat_floor_us.items()},
            nic_lat_mult=base.nic_lat_mult * s * hop["net"],
            bw_eff={k: min(base.efficiency(k) * self.link_factor(k) * b, MAX_EFFICIENCY) for k in LINK_KINDS},
        )

    def plain(self) -> Profile:
        """This calibration as one plain profile: NCCL's Simple protocol with the ring's factors."""
        return Profile(
            self.name,
            self.base_lat_us,
            self.lat_floor_us,
            self.bw_eff,
            self.reduce_cost,
            self.source,
            self.nic_lat_mult,
            self.tree_eff,
        )

    def for_tree_allreduce(self) -> Profile:
        return self.plain().for_tree_allreduce()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "calibration",
            "version": SCHEMA_VERSION,
            "link_scale": dict(self.link_scale),
            "hop_scale": dict(self.hop_scale),
            "lat_scale": dict(self.lat_scale),
            "bw_scale": dict(self.bw_scale),
            "proto_max": dict(self.proto_max),
            "hop_lat_us": dict(self.hop_lat_us),
            "proto_bw": dict(self.proto_bw),
            "fitted": list(self.fitted),
            "source": self.source,
        }


def calibration_parameters() -> dict[str, tuple[float, float]]:
    """Every continuous parameter of a :class:`Calibration` by name (``link_scale.nvlink``, ...,
    ``lat_scale.p2p``, ``hop_lat_us.net``, ``proto_bw.ll``), with its bounds (the switch points:
    :func:`switch_parameters`)."""
    return {f"{fld}.{k}": _bounds(fld, k) for fld, keys in _FIELDS for k in keys}


def _bounds(fld: str, key: str) -> tuple[float, float]:
    if fld == "hop_scale":
        return HOP_BOUNDS.get(key, SCALE_BOUNDS[fld])
    return LAT_US_BOUNDS if fld == "hop_lat_us" else SCALE_BOUNDS[fld]


def parameter_default(parameter: str) -> float:
    """The value a parameter of a :class:`Calibration` has when the file leaves it out: 1 for a factor,
    0 µs for an added latency (``hop_lat_us``), :data:`NO_SWITCH` for a switch point (``proto_max``).

    >>> parameter_default("link_scale.net"), parameter_default("hop_lat_us.net"), parameter_default("proto_max.ll")
    (1.0, 0.0, 1099511627776.0)
    """
    fld = parameter.partition(".")[0]
    return {"hop_lat_us": 0.0, "proto_max": NO_SWITCH}.get(fld, 1.0)


def switch_parameters() -> dict[str, tuple[int, int]]:
    """Every protocol switch point of a :class:`Calibration` by name (``proto_max.ll``, ``proto_max.ll128``),
    with its bounds (bytes)."""
    return {f"proto_max.{k}": SWITCH_BOUNDS for k in SWITCH_PROTOCOLS}


#: the value :meth:`Calibration.value` gives an absent switch point: no limit (the simulator's rule)
NO_SWITCH = float(SWITCH_BOUNDS[1])
#: the factor fields of a :class:`Calibration` and their keys
_FIELDS = (
    ("link_scale", tuple(LINK_CLASSES)),
    ("hop_scale", ROUTE_CLASSES),
    ("lat_scale", FAMILIES),
    ("bw_scale", BW_FAMILIES),
    ("hop_lat_us", LAT_CLASSES),
    ("proto_bw", tuple(SWITCH_PROTOCOLS)),
)


def get_profile(name_or_path: str | Profile | None) -> Profile:
    """A built-in profile by name, a :class:`Profile` as is, or one loaded from a YAML file."""
    if name_or_path is None:
        return PROFILES["ideal"]
    if isinstance(name_or_path, Profile):
        return name_or_path
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    if str(name_or_path).endswith((".yaml", ".yml")) or os.path.exists(str(name_or_path)):
        return load_profile(name_or_path)
    raise CollectiveError(
        f"profile {name_or_path!r}: expected one of {sorted(PROFILES)}, got an unknown name; or give a YAML file"
    )


def load_profile(path: str | os.PathLike) -> Profile:
    """Read a profile written by :func:`save_profile`: a :class:`Calibration` when the file has
    ``link_scale`` or ``lat_scale`` (``kind: calibration``), else a plain :class:`Profile`; errors name
    the file and the key."""
    import yaml

    where = f"profile file {str(path)!r}"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise CollectiveError(f"{where}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise CollectiveError(f"{where}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise CollectiveError(f"{where}: expected a mapping, got {type(data).__name__}")
    calibrated = data.get("kind") == "calibration" or any(f in data for f, _ in _FIELDS) or "proto_max" in data
    if "kind" in data and data["kind"] not in ("calibration", "profile"):
        raise CollectiveError(f"{where}: kind expected 'calibration' or 'profile', got {data['kind']!r}")
    keys = _CALIBRATION_KEYS if calibrated else _PROFILE_KEYS
    version = data.get("version", 1)
    if calibrated and version not in SCHEMA_VERSIONS:
        raise CollectiveError(
            f"{where}: version expected one of {list(SCHEMA_VERSIONS)}, got {version!r}; "
            f"write it again with treecoll simulate calibrate"
        )
    extra = sorted(set(data) - set(keys) - {"fit", "kind", "version"}, key=str)
    if extra:
        other = _PROFILE_KEYS if calibrated else _CALIBRATION_KEYS
        why = (
            f"it belongs to a {'plain profile' if calibrated else 'calibration'}, this file is a "
            f"{'calibration (it has link_scale / lat_scale)' if calibrated else 'plain profile'}"
            if extra[0] in other
            else "an unknown key"
        )
        raise CollectiveError(f"{where}: key {extra[0]!r}: {why}; expected some of {list(keys)}")
    try:
        args = {k: data[k] for k in keys if k in data}
        if calibrated:
            args["fitted"] = tuple(args.get("fitted") or ())
            return Calibration(**args)
        return Profile(**args)
    except CollectiveError as e:
        raise CollectiveError(f"{where}: {e}") from None


_PROFILE_KEYS = ("name", "base_lat_us", "lat_floor_us", "bw_eff", "reduce_cost", "source", "nic_lat_mult", "tree_eff")
_CALIBRATION_KEYS = (
    "name",
    "link_scale",
    "hop_scale",
    "lat_scale",
    "bw_scale",
    "proto_max",
    "hop_lat_us",
    "proto_bw",
    "fitted",
    "source",
)


def save_profile(profile: Profile, path: str | os.PathLike, fit: Mapping[str, Any] | None = None) -> None:
    """Write ``profile`` (and optional fit statistics) as YAML."""
    import yaml

    d = profile.as_dict()
    if fit:
        d["fit"] = dict(fit)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(d, f, sort_keys=False)
