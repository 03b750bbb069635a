"""``gradlab benchmark`` implementations: each module measures one part against its bare library.

Every benchmark prints a rich table with absolute figures and ratios, and can write the same rows
as JSON. Results are recorded, with the machine, in ``docs/BENCHMARKS.md``.
"""
