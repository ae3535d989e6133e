"""The one exception hierarchy of treecoll.

Every error a user can cause is a subclass of :class:`TreecollError`; the
command line catches it and prints ``str(err)`` on one line (exit code 1).
Messages follow ``"<what>: expected X, got Y[; how to fix]"`` and name the
place (file, line, key path, rank) where one exists.

The hierarchy lives in ``topo`` because ``topo`` is the bottom of the
dependency chain ``topo <- collectives <- attention <- tools``.

>>> issubclass(TopologyError, TreecollError) and issubclass(TopologyError, ValueError)
True
"""

from __future__ import annotations

__all__ = [
    "TreecollError",
    "TopologyError",
    "DiscoveryError",
    "TreeError",
    "ScheduleError",
    "PlacementError",
    "CollectiveError",
    "AttentionError",
    "MissingDependency",
]


class TreecollError(Exception):
    """Base of every error treecoll raises on purpose."""


class TopologyError(TreecollError, ValueError):
    """Raised when a topology (YAML, XML, nvidia-smi text, graph) is invalid.

    ``where`` is prepended to the message when given: ``"file.yaml:12: hosts[0].gpus: ..."``.
    """

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class DiscoveryError(TreecollError):
    """Raised when discovery cannot produce any topology (partial failures only warn)."""


class TreeError(TreecollError, ValueError):
    """Raised when a reduction tree is invalid or cannot be built (names the rank)."""


class ScheduleError(TreecollError, ValueError):
    """Raised when a schedule is inconsistent (unmatched send/recv, bad dependency)."""


class PlacementError(TreecollError, ValueError):
    """Raised when ranks cannot be placed: an unknown GPU, a rank count beyond the topology's
    GPUs, a GPU twice, or a process group whose size differs from the ranks mapped."""


class CollectiveError(TreecollError, RuntimeError):
    """Raised when a collective fails at run time: fingerprint or shape mismatch
    across ranks, a peer that died or timed out (names the collective and peer)."""


class AttentionError(TreecollError, ValueError):
    """Raised for invalid attention inputs: shapes, dtypes, LSE values (+inf/NaN)."""


class MissingDependency(TreecollError, ImportError):
    """Raised when an optional dependency is needed but absent; says what to install."""

    def __init__(self, package: str, purpose: str, extra: str | None = None):
        hint = f"pip install 'treecoll[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{purpose} needs {package}: {hint}")
