"""Results computed from our own stores and metric journals (docs/ARCHITECTURE.md section 12).

Offline first: nothing here needs W&B or a network.

Public modules:
    stats: IQM with a stratified-bootstrap interval, median and IQR, probability of improvement
        (Agarwal et al. 2021).
    curves: the points of every learning curve of a run, read through the journal's API, and the
        matplotlib figures drawn from them (Agg).
    cohorts: per-seed scores of runs grouped by goal, recipe and overrides; the cohort receipt of a
        sweep; leaders of runs and checkpoints.
    reports: the static HTML site (``gradlab reports build``) and its publication to a store
        (``gradlab reports sync``: create-only under the build's content hash, index by
        compare-and-swap).
"""
