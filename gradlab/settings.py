"""Machine settings: data directory, store URLs, W&B mode, Prefect API URL.

Read from ``GRADLAB_*`` environment variables first, then ``~/.config/gradlab/config.toml``
(``$GRADLAB_CONFIG`` overrides the path), then defaults. Never from recipes.

``GRADLAB_HOME`` is the data directory (default: the platform's user data directory); runs live
under ``$GRADLAB_HOME/runs`` and the default file stores under ``$GRADLAB_HOME/stores``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.errors import ConfigError


@dataclass(frozen=True)
class Settings:
    home: Path
    control_store_url: str
    eval_store_url: str
    model_store_url: str
    wandb_mode: str | None
    wandb_entity: str | None
    wandb_project: str | None
    prefect_api_url: str | None
    s3_endpoint_url: str | None
    default_pool: str
    config_file: Path

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id


def config_path() -> Path:
    env = os.environ.get("GRADLAB_CONFIG")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gradlab" / "config.toml"


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def load_settings() -> Settings:
    """Settings for this process (environment over config file over defaults).

    Raises:
        ConfigError: the config file is not valid TOML.
    """
    path = config_path()
    cfg = _read_config(path)
    stores = cfg.get("stores", {}) if isinstance(cfg.get("stores"), dict) else {}
    wandb = cfg.get("wandb", {}) if isinstance(cfg.get("wandb"), dict) else {}
    prefect = cfg.get("prefect", {}) if isinstance(cfg.get("prefect"), dict) else {}

    def pick(env: str, value: Any, default: Any = None) -> Any:
        return os.environ.get(env) or value or default

    home_raw = pick("GRADLAB_HOME", cfg.get("home"))
    if home_raw:
        home = Path(home_raw).expanduser().resolve()
    else:
        from platformdirs import user_data_dir

        home = Path(user_data_dir("gradlab"))
    stores_dir = home / "stores"
    return Settings(
        home=home,
        control_store_url=pick("GRADLAB_CONTROL_STORE_URL", stores.get("control"), (stores_dir / "control").as_uri()),
        eval_store_url=pick("GRADLAB_EVAL_STORE_URL", stores.get("eval"), (stores_dir / "eval").as_uri()),
        model_store_url=pick("GRADLAB_MODEL_STORE_URL", stores.get("model"), (stores_dir / "model").as_uri()),
        wandb_mode=pick("GRADLAB_WANDB_MODE", wandb.get("mode")),
        wandb_entity=pick("GRADLAB_WANDB_ENTITY", wandb.get("entity")),
        wandb_project=pick("GRADLAB_WANDB_PROJECT", wandb.get("project")),
        prefect_api_url=pick("PREFECT_API_URL", prefect.get("api_url")),
        s3_endpoint_url=pick("GRADLAB_S3_ENDPOINT_URL", stores.get("endpoint_url")),
        default_pool=pick("GRADLAB_DEFAULT_POOL", prefect.get("default_pool"), "gradlab-local"),
        config_file=path,
    )
