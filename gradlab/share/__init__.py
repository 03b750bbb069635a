"""Sharing and reuse: warm-start lineage, rl-zoo3 / SB3 export, Hugging Face publication (docs/ARCHITECTURE.md section 12).

Public names:
    lineage.check_spaces(parent_dir, environment): refuse a warm start across observation/action spaces.
    export.export_checkpoint(...): the rl-zoo3 layout or the SB3 files of a checkpoint (rl-zoo refused,
        saying why, for a goal rl-zoo3 cannot play); export.rl_zoo_files(...): rl-zoo3's saved-run files.
    zoo_repo.write_zoo_repo_files(...): what rl-zoo3's push_to_hub puts in a hub repository.
    hub.build_repo_folder(...), hub.upload_folder(...), hub.load_repo(...): Hugging Face model repos.
    evidence.accepted_result(stores, spec, sha256): a promoted checkpoint's recorded, validated result.

Importing this package imports neither torch nor huggingface_hub.
"""
