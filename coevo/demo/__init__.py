"""``coevo demo``: the whole system on one machine, on the embedded default (``run``).

The steps, each in its own module and imported once Django is set up: ``humaneval`` (the seed
harness evaluated), ``campaign`` (config search from a naive TextWorld seed), ``promotion``
(the best candidate requested for production, judged on sealed held-out games, approved by a
second login); ``processes`` starts and stops the servers, ``users`` makes the logins.
"""

from coevo.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
