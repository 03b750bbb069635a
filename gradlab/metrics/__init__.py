"""Metric names and where metrics go.

Public names:
    registry.REGISTRY, registry.check_name, registry.is_registered, registry.MetricSpec: the
        executable metric contract (``METRICS.md`` is the human one).
    journal.Journal: the local JSON-lines journal (always on).
    wandb_sink.WandbSink: the W&B sink (the supervisor is the only writer).

Importing this package is cheap (no torch, no wandb).
"""
