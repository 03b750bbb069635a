"""Prefect flows: compose tasks; no domain logic in flow bodies.

    training_run (``training-run``): one attempt of one training run, supervised end to end.
"""
