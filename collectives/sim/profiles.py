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

Profiles are plain data; :func:`save_profile` / :func:`load_profile` write and
read them as YAML (what the calibration command produces).

>>> get_profile("nccl-ll").step_lat("net")
2.7e-06
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

__all__ = ["Profile", "PROFILES", "NCCL_PROTOCOLS", "get_profile", "load_profile", "save_profile", "ROUTE_CLASSES"]

ROUTE_CLASSES = ("nvlink", "pci", "net")


@dataclass(frozen=True)
class Profile:
    """How a library uses the links; see the module docstring. Times in µs, efficiencies in (0, 1]."""

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
            if k not in LINK_KINDS or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise CollectiveError(
                    f"{what}: bw_eff.{k} expected a link kind in {list(LINK_KINDS)} with a value in (0, 1], got {v!r}"
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
    """Read a profile written by :func:`save_profile`; errors name the file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise CollectiveError(f"profile file {str(path)!r}: cannot read it ({e.strerror})") from None
    if not isinstance(data, dict):
        raise CollectiveError(f"profile file {str(path)!r}: expected a mapping, got {type(data).__name__}")
    keys = ("name", "base_lat_us", "lat_floor_us", "bw_eff", "reduce_cost", "source", "nic_lat_mult", "tree_eff")
    extra = sorted(set(data) - set(keys) - {"fit"})
    if extra:
        raise CollectiveError(f"profile file {str(path)!r}: unknown keys {extra}; expected some of {list(keys)}")
    try:
        return Profile(**{k: data[k] for k in keys if k in data})
    except CollectiveError as e:
        raise CollectiveError(f"profile file {str(path)!r}: {e}") from None


def save_profile(profile: Profile, path: str | os.PathLike, fit: Mapping[str, Any] | None = None) -> None:
    """Write ``profile`` (and optional fit statistics) as YAML."""
    import yaml

    d = profile.as_dict()
    if fit:
        d["fit"] = dict(fit)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(d, f, sort_keys=False)
