"""Machine settings: data directory, store URLs, W&B mode, Prefect API URL.

Read from ``GRADLAB_*`` environment variables first, then ``~/.config/gradlab/config.toml``
(``$GRADLAB_CONFIG`` overrides the path), then defaults. Never from recipes.

``GRADLAB_HOME`` is the data directory (default: the platform's user data directory); runs live
under ``$GRADLAB_HOME/runs`` and the default file stores under ``$GRADLAB_HOME/stores``.

The local Prefect server kept in the background (``gradlab.runs.server``, docs/ARCHITECTURE.md
section 11): ``GRADLAB_DAEMON`` / ``[daemon] enabled`` (default on; ``0`` runs each command on
Prefect's ephemeral server instead), ``GRADLAB_DAEMON_IDLE_S`` / ``[daemon] idle_s`` (seconds with
no run and no command before it stops itself, default 1800; 0 = never),
``GRADLAB_SERVER_START_TIMEOUT_S`` / ``[daemon] start_timeout_s`` (how long a command waits for a
Prefect server to answer, default 180).

Secrets never appear in the config file. A key ending in ``_ref`` (any table) is a secret
*reference*: ``"env:NAME"`` (the environment variable NAME) or ``"keyring:SERVICE/USERNAME"`` (the
OS keyring, through the optional ``keyring`` package), resolved by :func:`resolve_secret`, e.g.
``[stores] s3_secret_ref = "env:R2_SECRET"``. References are resolved where the credential is used
(:meth:`Settings.secret`): ``[wandb] api_key_ref`` by the W&B sink, ``[stores] s3_access_key_id_ref``,
``s3_secret_ref`` and ``s3_session_token_ref`` by the S3 client (:func:`gradlab.stores.s3_credentials`).
A file that names a secret reference must be readable
by its owner only (mode 0600) or it is refused; a secret-like key with a literal value
(``secret_access_key = "..."``) is refused outright.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradlab.errors import ConfigError

_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")  # matched whole (fullmatch: no trailing newline)


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
    #: Start a local Prefect server in the background on first use (``GRADLAB_DAEMON``, ``[daemon] enabled``).
    daemon: bool = True
    #: Seconds without a run or a command before that server stops itself; 0 = never.
    daemon_idle_s: float = 1800.0
    #: Seconds a command waits for a Prefect server (local or ephemeral) to answer its health check.
    server_start_timeout_s: float = 180.0
    #: ``(dotted key, reference)`` for every ``*_ref`` key of the config file, e.g.
    #: ``("stores.s3_secret_ref", "env:R2_SECRET")``; resolve with :func:`resolve_secret`.
    secret_refs: tuple[tuple[str, str], ...] = ()
    #: False (default): the home and the file stores are private (folders 0700, files 0600).
    #: True (``GRADLAB_SHARED_PERMISSIONS=1`` or ``[permissions] shared = true``): the process
    #: umask decides, as for any other program (docs/ARCHITECTURE.md section 9).
    shared_permissions: bool = False
    #: The ``dataset`` store (recorded episodes, docs/ARCHITECTURE.md section 12):
    #: ``GRADLAB_DATASET_STORE_URL`` / ``[stores] dataset``; "" = ``$GRADLAB_HOME/stores/dataset``.
    dataset_store_url: str = ""

    def secret(self, ref_key: str) -> str | None:
        """The secret that the reference at dotted key ``ref_key`` (``wandb.api_key_ref``) points at.

        Resolved on every call and never cached here: callers pass the value straight to the client
        that uses it and write it nowhere.

        Returns:
            The value; None when the config file has no such reference.

        Raises:
            ConfigError: the reference names an unset variable or keyring entry (names the key, the
                file and the reference, never a value), or needs the missing ``keyring`` package.
        """
        ref = dict(self.secret_refs).get(ref_key)
        if ref is None:
            return None
        value = resolve_secret(ref)
        if value is None:
            raise ConfigError(f"{self.config_file}: {ref_key}: secret reference {ref} is not set "
                              f"(expected {'the environment variable' if ref.startswith('env:') else 'a keyring entry'} "
                              f"{ref.partition(':')[2]})")
        return value

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: str) -> Path:
        """``<home>/runs/<run_id>``.

        Raises:
            ConfigError: ``run_id`` is not one name (a ``/``, ``..`` or other character that could
                reach outside the runs folder).
        """
        if not isinstance(run_id, str) or not _RUN_ID_RE.fullmatch(run_id) or ".." in run_id:
            raise ConfigError(f"run id: expected one name of letters, digits and _ . + - (no '/', no '..'), "
                              f"found {str(run_id)[:80]!r}")
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


SECRET_REF_SUFFIX = "_ref"
_SECRET_LIKE_KEY = re.compile(r"(secret|password|passwd|token|api[_-]?key|access[_-]?key|credential)", re.I)
_SECRET_REF = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|keyring:[^/\s]+/[^/\s]+)$")


def secret_references(cfg: dict[str, Any], path: Path) -> tuple[tuple[str, str], ...]:
    """Every ``*_ref`` key of a parsed config file, after checking no literal secret is present.

    Raises:
        ConfigError: every problem at once: a ``*_ref`` value that is not ``env:NAME`` or
            ``keyring:SERVICE/USERNAME``; a secret-like key (secret, password, token, api_key,
            access_key, credential) holding a literal value.
    """
    from gradlab.errors import ConfigProblem

    refs: list[tuple[str, str]] = []
    problems: list[ConfigProblem] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, f"{dotted}.")
            elif key.endswith(SECRET_REF_SUFFIX):
                if isinstance(value, str) and _SECRET_REF.match(value):
                    refs.append((dotted, value))
                else:
                    problems.append(ConfigProblem(str(path), dotted, f"expected a secret reference \"env:NAME\" or "
                                                  f"\"keyring:SERVICE/USERNAME\", found {value!r}"))
            elif _SECRET_LIKE_KEY.search(key) and value not in (None, ""):
                problems.append(ConfigProblem(str(path), dotted, "literal secret refused: secrets come from the "
                                              f"environment or the OS keyring; write {key}{SECRET_REF_SUFFIX} = "
                                              "\"env:NAME\" instead"))

    walk(cfg, "")
    if problems:
        raise ConfigError(problems)
    return tuple(refs)


def check_config_permissions(path: Path, refs: tuple[tuple[str, str], ...]) -> None:
    """Refuse a config file that names a secret reference and is readable by group or others.

    Raises:
        ConfigError: ``refs`` is not empty and ``path``'s mode has any group/other bit (expected 0600).
    """
    if not refs:
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        from gradlab.errors import ConfigProblem

        keys = ", ".join(k for k, _ in refs)
        raise ConfigError([ConfigProblem(str(path), "", f"names secret reference(s) ({keys}) but its mode is "
                                         f"{mode:04o}; expected 0600 (owner read/write only): run chmod 600 {path}")])


def resolve_secret(ref: str) -> str | None:
    """The secret a reference points at, or None when it is not set.

    Args:
        ref: ``env:NAME`` (environment variable) or ``keyring:SERVICE/USERNAME`` (OS keyring).

    Raises:
        ConfigError: a malformed reference, or a keyring reference while the ``keyring`` package
            is not installed.
    """
    if not _SECRET_REF.match(ref):
        raise ConfigError(f"secret reference {ref!r}: expected env:NAME or keyring:SERVICE/USERNAME")
    kind, _, target = ref.partition(":")
    if kind == "env":
        return os.environ.get(target) or None
    try:
        import keyring
    except ImportError:
        raise ConfigError(f"secret reference {ref!r}: the OS keyring needs the 'keyring' package "
                          "(uv pip install keyring), or use env:NAME") from None
    service, _, username = target.partition("/")
    return keyring.get_password(service, username)


def load_settings() -> Settings:
    """Settings for this process (environment over config file over defaults).

    Raises:
        ConfigError: the config file is not valid TOML, holds a literal secret or a malformed
            secret reference, or names a secret reference while not 0600.
    """
    path = config_path()
    cfg = _read_config(path)
    refs = secret_references(cfg, path)
    check_config_permissions(path, refs)
    stores = cfg.get("stores", {}) if isinstance(cfg.get("stores"), dict) else {}
    permissions = cfg.get("permissions", {}) if isinstance(cfg.get("permissions"), dict) else {}
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
    if home.exists() and not home.is_dir():
        raise ConfigError(f"GRADLAB_HOME {home}: expected a folder (the gradlab data directory), found a file")
    stores_dir = home / "stores"
    daemon = cfg.get("daemon", {}) if isinstance(cfg.get("daemon"), dict) else {}
    return Settings(
        home=home,
        control_store_url=pick("GRADLAB_CONTROL_STORE_URL", stores.get("control"), (stores_dir / "control").as_uri()),
        eval_store_url=pick("GRADLAB_EVAL_STORE_URL", stores.get("eval"), (stores_dir / "eval").as_uri()),
        model_store_url=pick("GRADLAB_MODEL_STORE_URL", stores.get("model"), (stores_dir / "model").as_uri()),
        dataset_store_url=pick("GRADLAB_DATASET_STORE_URL", stores.get("dataset"), (stores_dir / "dataset").as_uri()),
        wandb_mode=pick("GRADLAB_WANDB_MODE", wandb.get("mode")),
        wandb_entity=pick("GRADLAB_WANDB_ENTITY", wandb.get("entity")),
        wandb_project=pick("GRADLAB_WANDB_PROJECT", wandb.get("project")),
        prefect_api_url=pick("PREFECT_API_URL", prefect.get("api_url")),
        s3_endpoint_url=pick("GRADLAB_S3_ENDPOINT_URL", stores.get("endpoint_url")),
        default_pool=pick("GRADLAB_DEFAULT_POOL", prefect.get("default_pool"), "gradlab-local"),
        config_file=path,
        secret_refs=refs,
        shared_permissions=_flag(SHARED_PERMISSIONS_ENV, permissions, "shared", path, default=False,
                                 section="permissions"),
        daemon=_flag("GRADLAB_DAEMON", daemon, "enabled", path, default=True),
        daemon_idle_s=_seconds("GRADLAB_DAEMON_IDLE_S", daemon, "idle_s", path, default=1800.0),
        server_start_timeout_s=_seconds("GRADLAB_SERVER_START_TIMEOUT_S", daemon, "start_timeout_s", path,
                                        default=180.0, positive=True),
    )


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(env: str, table: dict[str, Any], key: str, path: Path, *, default: bool, section: str = "daemon") -> bool:
    """A boolean machine setting: the environment variable, else ``[section] key``, else ``default``.

    Raises:
        ConfigError: the value is not one of 1/0, true/false, yes/no, on/off.
    """
    raw = os.environ.get(env)
    if raw is not None and raw.strip() != "":
        where, value = env, raw.strip().lower()
    elif key in table:
        where, value = f"{path}: {section}.{key}", table[key]
        if isinstance(value, bool):
            return value
        value = str(value).lower()
    else:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{where}: expected 1 or 0 (true/false), found {value!r}")


def _seconds(env: str, table: dict[str, Any], key: str, path: Path, *, default: float, positive: bool = False) -> float:
    """A duration machine setting in seconds: the environment variable, else ``[daemon] key``, else ``default``.

    Raises:
        ConfigError: not a number, negative, or 0 where ``positive``.
    """
    raw = os.environ.get(env)
    if raw is not None and raw.strip() != "":
        where, value = env, raw.strip()
    elif key in table:
        where, value = f"{path}: daemon.{key}", table[key]
    else:
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds >= (1e-9 if positive else 0.0) or seconds == float("inf"):
        expected = "a number of seconds > 0" if positive else "a number of seconds >= 0 (0 = never)"
        raise ConfigError(f"{where}: expected {expected}, found {value!r}")
    return seconds


SHARED_PERMISSIONS_ENV = "GRADLAB_SHARED_PERMISSIONS"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def secure_home(settings: Settings) -> None:
    """Make this process create private files and folders (unless the operator shares them).

    Private: the umask becomes 0077, so everything gradlab creates from here on (the home, run
    directories, the outbox and journal, W&B's files, and Prefect's database when its server is
    started from here) is 0700 / 0600. Called by every entry point (the CLI, the training-run
    flow); child processes (the learner, the local Prefect server) inherit the umask. File
    stores set their modes explicitly as well (:class:`gradlab.stores.local.FileStore`).

    A home that already exists with group or other access (e.g. 0755, made by a tool with a login
    umask) and belongs to this user is made 0700, which closes everything below it; a home of
    another user is left alone with a warning on stderr.
    """
    if settings.shared_permissions:
        return
    os.umask(0o077)
    home = Path(settings.home)
    try:
        info = home.stat()
    except OSError:  # not created yet: the umask makes it private
        return
    if not stat.S_IMODE(info.st_mode) & 0o077:
        return
    if info.st_uid == os.getuid():
        home.chmod(PRIVATE_DIR_MODE)
    else:
        print(f"gradlab: warning: GRADLAB_HOME {home} is mode {stat.S_IMODE(info.st_mode):04o} and belongs to "
              f"another user; its runs and stores are readable by others", file=sys.stderr)
