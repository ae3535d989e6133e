"""treecoll.collectives: cost model, trees, schedules, execution, simulation."""
from .tree import Tree
from .schedule import Schedule, Step

__all__ = ["Tree", "Schedule", "Step"]
