"""Gameplay datasets: recorded episodes of one goal, stored immutable and verified (docs/ARCHITECTURE.md section 12).

Public names:
    plan_recording(name, goal_id=, policy=, episodes=, ...) -> RecordingPlan: what to record (``plan``).
    record_chunk(plan, chunk) / record_chunk_in_worker(...): one chunk through the evaluation runner (``record``).
    publish_dataset(store, plan, results) -> DatasetManifest: files, then the manifest, create-only (``store``).
    read_dataset, list_datasets, check_files, fetch_dataset, load_steps: reading back (``store``).
    StepBuffer, write_npz: the recorder's batch step arrays and the one deterministic shard per chunk (``shard``).
    verify_dataset(store, name) -> VerifyReport: files, then bit-exact re-simulation (``verify``).
    export_minari, export_hf: other tools' layouts (``export``).

The ``dataset-record`` Prefect flow (``flows/dataset_record.py``) runs one task per chunk.
Importing this package imports neither torch nor any environment library.
"""
