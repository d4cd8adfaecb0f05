"""Dependency ordering."""


class CycleError(ValueError):
    """Raised when the dependencies contain a cycle."""


def topo_sort(deps):
    """Order tasks so that every task comes after all of its dependencies.

    `deps` maps a task name (str) to an iterable of the task names it
    depends on. Names that only appear as dependencies are tasks too.
    Whenever several tasks are ready (all their dependencies already
    placed), the alphabetically smallest one is placed next, so the
    result is unique. Return a list of all task names, each once.
    Do not modify `deps`. Raise CycleError if the dependencies contain
    a cycle (including a task that depends on itself).
    """
    raise NotImplementedError
