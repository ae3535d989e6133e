"""treecoll: topology-aware collective communication and Tree Attention decoding.

The distribution's rooms are its subpackages, one concept each, with imports in
one direction (``topo`` <- ``collectives`` <- ``attention`` <- ``tools``):

* :mod:`treecoll.topo`: the cluster graph, its YAML forms and discovery;
* :mod:`treecoll.collectives`: trees, schedules, execution over torch.distributed, simulation;
* :mod:`treecoll.attention`: partial attention states, decode kernels, tree decoding;
* :mod:`treecoll.tools`: the ``treecoll`` command line and the benchmarks.

Importing ``treecoll`` imports none of them (and no torch).

>>> import treecoll
>>> treecoll.__version__
'0.1.0'
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
