"""Exploration by search: the state archive and what the search backends share.

docs/ARCHITECTURE.md section 12a. Public names:

* :mod:`gradlab.explore.blobs`: provider-state blobs addressed by their sha256
  (:func:`~gradlab.explore.blobs.write_blobs`, :func:`~gradlab.explore.blobs.read_blob`).
* :mod:`gradlab.explore.cells`: cell functions (:class:`~gradlab.explore.cells.SignalCells`,
  :class:`~gradlab.explore.cells.FrameCells`, :func:`~gradlab.explore.cells.make_cell_function`).
* :mod:`gradlab.explore.archive`: :class:`~gradlab.explore.archive.Archive` (cells, best trajectory
  per cell, counts, count-based selection, success lineage, bounded size) and its metrics.

The package imports neither torch nor a provider: it works on cell keys, action lists and bytes.
"""
