"""Modal app ``gradlab-eval``: the remote evaluation backend.

The function ``evaluate`` receives the JSON payload built by
``gradlab.evaluation.modal.build_modal_payload`` (the ``EvalRequest`` plus the checkpoint's
weights-only files, base64) and returns the same ``EvalResult`` JSON the local backend returns.

Image: Debian slim + ``uv sync --frozen`` of this project's ``pyproject.toml``/``uv.lock`` (the same
locked versions as training), then the ``gradlab`` source. No secrets are baked in and none are
attached: the payload carries everything evaluation needs, and Modal's own credentials stay on
the caller's machine (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or ``~/.modal.toml``).

Deploy: ``uv run modal deploy deployments/modal/app.py`` (needs a Modal account; not reachable from
the build machine, where only the payloads and error handling are tested).
"""

from __future__ import annotations

from pathlib import Path

import modal

APP_NAME = "gradlab-eval"
FUNCTION_NAME = "evaluate"
REPO_ROOT = Path(__file__).resolve().parents[2]

app = modal.App(APP_NAME)

image = (
    modal.Image.debian_slim(python_version="3.11")
    .apt_install("libgl1", "libglib2.0-0")  # opencv/ale-py/vizdoom runtime libraries
    .uv_sync(str(REPO_ROOT), frozen=True)
    .env({"GRADLAB_HOME": "/tmp/gradlab", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    .add_local_python_source("gradlab")
)


@app.function(image=image, cpu=4.0, memory=8192, timeout=3600, retries=0)
def evaluate(payload: dict) -> dict:
    """Evaluate one checkpoint: payload (``gradlab.eval-payload/1``) -> ``EvalResult`` JSON."""
    import tempfile

    import torch

    from gradlab.evaluation.modal import handle_modal_payload

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gradlab-eval-") as workdir:
        return handle_modal_payload(payload, Path(workdir))
