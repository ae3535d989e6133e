"""The machine flags of the command line: ``--topology FILE|name``, or ``--hosts N --gpus-per-host G
--gpu MODEL --nic COUNTxSPEEDG-FABRIC --gpu-nic aligned|unaligned``, for every command that needs a
machine a file may not name.

:func:`add_machine_flags` adds them to a parser (as one argument group);
:func:`machine_flags` reads them back as a :class:`~treecoll.topo.machines.MachineFlags`;
:func:`machine_from_args` builds the machine, what a file says (``facts``,
e.g. :meth:`treecoll.collectives.sim.nccltests.Table.machine_facts`) filling
what the flags leave out: flags win. Bad values are one-line
:class:`~treecoll.tools.units.UsageError` s at parse time; what is missing is a
one-line :class:`~treecoll.topo.errors.TopologyError` naming the flags to pass.
:func:`parse_machine_flags` reads the same flags from a string (an index file
that records, per nccl-tests table, what its user would have passed).

>>> import argparse
>>> p = argparse.ArgumentParser(prog="x")
>>> _ = add_machine_flags(p)
>>> f = machine_flags(p.parse_args(["--hosts", "2", "--gpu", "B200", "--nic", "8x400G-roce"]))
>>> f.hosts, f.gpus_per_host, f.gpu, str(f.nic)
(2, None, 'B200', '8x400G-roce')
>>> parse_machine_flags("--gpu-nic unaligned").gpu_nic
'unaligned'
>>> parse_machine_flags("--gpu-nic pix")
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --gpu-nic 'pix': expected one of aligned, unaligned (whether each GPU shares ...
>>> parse_machine_flags("--gpu H999")
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --gpu 'H999': no machine template for this GPU; expected a template (a100-pcie, ...
"""

from __future__ import annotations

import argparse
import shlex

from treecoll.tools.units import UsageError, int_arg
from treecoll.topo import machines
from treecoll.topo.errors import TopologyError
from treecoll.topo.machines import Machine, MachineFacts, MachineFlags
from treecoll.topo.model import Topology

__all__ = [
    "add_machine_flags",
    "machine_flags",
    "machine_from_args",
    "machine_given",
    "topology_from_args",
    "parse_machine_flags",
    "COUNTS_HELP",
    "nic_arg",
    "gpu_arg",
    "gpu_nic_arg",
    "describe",
]


def nic_arg(text: str) -> machines.Nic:
    """argparse ``type=`` for ``--nic``: a :class:`~treecoll.topo.machines.Nic` or a one-line UsageError."""
    try:
        return machines.parse_nic(text)
    except TopologyError as e:
        raise UsageError(str(e)) from None


def gpu_arg(text: str) -> str:
    """argparse ``type=`` for ``--gpu``: the name as given, once it is known to the machine table."""
    try:
        machines.resolve_gpu(text, 1)
    except TopologyError as e:
        if "no machine template" in str(e):
            raise UsageError(str(e)) from None
    return text


def gpu_nic_arg(text: str) -> str:
    """argparse ``type=`` for ``--gpu-nic``: ``aligned`` or ``unaligned``, or a one-line UsageError."""
    try:
        return machines.parse_gpu_nic(text)
    except TopologyError as e:
        raise UsageError(str(e)) from None


#: the machine flags in a help text: what a command's machine group says after "--topology, or"
COUNTS_HELP = "--hosts N --gpu MODEL with --gpus-per-host/--nic/--gpu-nic where the machine template's own do not fit"


def add_machine_flags(
    parser: argparse.ArgumentParser,
    *,
    topology_help: str | None = None,
    description: str | None = None,
    topology: bool = True,
) -> argparse._ArgumentGroup:
    """Add ``--topology`` (unless ``topology`` is False: a command that reads it as its FILE argument),
    ``--hosts``, ``--gpus-per-host``, ``--gpu``, ``--nic``, ``--gpu-nic`` (one group, ``description`` its
    help) to ``parser``."""
    g = parser.add_argument_group(
        "machine",
        description
        or "the machine a run is on, where its file does not say it (flags win "
        "over the file): --topology, or --hosts/--gpus-per-host/--gpu/--nic/--gpu-nic",
    )
    if topology:
        g.add_argument(
            "--topology",
            default=None,
            metavar="FILE|name",
            help=topology_help or "a topology YAML, NCCL XML or nvidia-smi file, or a shipped name",
        )
    g.add_argument(
        "--hosts",
        type=int_arg("--hosts", maximum=machines.MAX_HOSTS),
        default=None,
        metavar="N",
        help="number of hosts",
    )
    g.add_argument(
        "--gpus-per-host",
        type=int_arg("--gpus-per-host", maximum=1024),
        default=None,
        metavar="G",
        help="GPUs per host (default: the machine template's)",
    )
    g.add_argument(
        "--gpu",
        type=gpu_arg,
        default=None,
        metavar="MODEL",
        help="GPU model: a machine template (h100-sxm, hgx-b200, ...) or a name as nvidia-smi prints it",
    )
    g.add_argument(
        "--nic",
        type=nic_arg,
        default=None,
        metavar="COUNTxSPEEDG-FABRIC",
        help=f"NICs per host, e.g. 8x400G-ib; FABRIC one of {', '.join(machines.FABRICS)} "
        f"(default: the template's NICs)",
    )
    g.add_argument(
        "--gpu-nic",
        type=gpu_nic_arg,
        default=None,
        metavar="|".join(machines.GPU_NIC),
        help="whether each GPU shares a PCIe switch with the NIC it uses (default aligned, as on DGX/HGX); "
        "unaligned: no GPUDirect RDMA, NCCL stages the network through host memory",
    )
    return g


def machine_flags(args: argparse.Namespace) -> MachineFlags:
    """The machine flags of parsed ``args`` (absent attributes count as not given)."""
    return MachineFlags(
        topology=getattr(args, "topology", None),
        hosts=getattr(args, "hosts", None),
        gpus_per_host=getattr(args, "gpus_per_host", None),
        gpu=getattr(args, "gpu", None),
        nic=getattr(args, "nic", None),
        gpu_nic=getattr(args, "gpu_nic", None),
    )


def machine_given(args: argparse.Namespace) -> bool:
    """Whether parsed ``args`` name a machine: ``--topology`` or any of the counts, GPU and NICs."""
    flags = machine_flags(args)
    return flags.topology is not None or flags.counts_given()


def topology_from_args(
    args: argparse.Namespace, *, default: str | None = None, required: str | None = None
) -> tuple[Topology | None, Machine | None]:
    """``(Topology, Machine or None)`` the machine flags of parsed ``args`` name (a topology given whole:
    no Machine). Without any: the topology ``default`` names, else ``(None, None)``, or with
    ``required`` (the command, for the message) a one-line UsageError naming the flags to pass."""
    flags = machine_flags(args)
    if flags.topology is None and not flags.counts_given():
        if default is None:
            if required:
                raise UsageError(
                    f"{required}: expected the machine: --topology FILE|name, or --hosts N --gpu MODEL "
                    "[--gpus-per-host G] [--nic COUNTxSPEEDG-FABRIC] [--gpu-nic aligned|unaligned]"
                )
            return None, None
        flags = MachineFlags(topology=default)
    return machines.machine_topology(flags)


def machine_from_args(args: argparse.Namespace, facts: MachineFacts | None = None) -> tuple[Topology, Machine | None]:
    """``(Topology, Machine or None)`` for parsed ``args`` and what a file says
    (:func:`treecoll.topo.machines.machine_topology`)."""
    return machines.machine_topology(machine_flags(args), facts)


class _Quiet(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(f"machine flags: {message}")


def parse_machine_flags(text: str) -> MachineFlags:
    """The machine flags in a string (``"--hosts 2 --nic 4x100G-efa"``); anything else is a UsageError.

    >>> str(parse_machine_flags("--hosts 2 --gpus-per-host 8 --nic 4x100G-efa").nic)
    '4x100G-efa'
    """
    p = _Quiet(prog="machine flags", add_help=False)
    add_machine_flags(p)
    try:
        words = shlex.split(str(text))
    except ValueError as e:
        raise UsageError(f"machine flags {str(text)[:60]!r}: {e}") from None
    return machine_flags(p.parse_args(words))


def describe(machine: Machine | None, topology: Topology) -> str:
    """One line naming the machine a command used (for its output)."""
    if machine is None:
        return f"topology {topology.name or '(unnamed)'}: {len(topology.hosts())} hosts, {len(topology.gpus())} GPUs"
    return machine.describe()
