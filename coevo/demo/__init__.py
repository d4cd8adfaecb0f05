"""``coevo demo``: the whole system on one machine, on the embedded default
(``coevo.demo.run``: ``DemoOptions``, ``run_demo``).

The steps, each in its own module and imported once Django is set up: ``humaneval`` (the seed
harness evaluated), ``campaign`` (config search from a naive TextWorld seed), ``promotion``
(the best candidate requested for production, judged on sealed held-out games, approved by a
second login); ``processes`` starts and stops the servers, ``users`` makes the logins.
"""
