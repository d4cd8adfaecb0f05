"""Scale data for the benchmarks: ``python -m benchmarks.scale`` fills PostgreSQL with a busy
team's year (plan.py says how much; content.py what the rows hold; copy.py how they are
written; fill.py in what order; command.py its options).

Not part of coevo: it sits beside the benchmarks that measure pages, the API and trace
retention on its data, and nothing under ``coevo/`` imports it (pyproject.toml's import
contract "coevo-below-benchmarks"). It writes coevo's tables through coevo's models and
services, so it runs from a checkout with coevo installed.
"""
