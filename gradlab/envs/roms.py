"""User ROMs for stable-retro: hash-verified import into ``$GRADLAB_HOME/roms/retro``.

``import_roms(PATH)`` reads each file (a folder is searched recursively), computes the sha1 the
way stable-retro does (``stable_retro.data.groom_rom``: SMD headers parsed, NES headers skipped),
and matches it against the ``rom.sha`` files of stable-retro's game integrations. A match is
stored as ``<cache>/<Game>/rom.<ext>`` next to a copy of that game's integration files (states,
data.json, scenario.json...), and the cache folder is registered with stable-retro as a custom
integration path (:func:`register_rom_dir`) when a retro environment is built. ROMs are never
written into the repository or into site-packages. The ``retro`` provider imports this module,
never the other way round.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from gradlab.errors import ConfigError, IntegrityError, NotFound

logger = logging.getLogger(__name__)


def rom_cache_dir() -> Path:
    """``$GRADLAB_HOME/roms/retro`` (created on demand)."""
    from gradlab.settings import load_settings

    return load_settings().home / "roms" / "retro"


def register_rom_dir(roms_dir: str) -> Any:
    """Register ``roms_dir`` (created if missing) as stable-retro's custom integration path.

    Args:
        roms_dir: the ROM folder (usually :func:`rom_cache_dir`), as a string.

    Returns:
        ``stable_retro.data.Integrations.ALL``: the integration type that finds stable-retro's own
        games and the ones imported into ``roms_dir``.

    Paths registered earlier in this process that no longer exist are dropped first: stable-retro
    lists every registered folder and fails on a missing one. So is a ROM folder this module
    registered for another ``GRADLAB_HOME``: its ROMs and save states are not this home's.
    """
    from stable_retro.data import Integrations

    os.makedirs(roms_dir, exist_ok=True)
    Integrations._init()
    Integrations.CUSTOM_PATHS[:] = [p for p in Integrations.CUSTOM_PATHS
                                    if os.path.isdir(p) and (p == roms_dir or p not in _REGISTERED)]
    if roms_dir not in Integrations.CUSTOM_PATHS:
        Integrations.add_custom_path(roms_dir)
        _REGISTERED.add(roms_dir)
    return Integrations.ALL


#: ROM folders :func:`register_rom_dir` registered with stable-retro in this process.
_REGISTERED: set[str] = set()


def _groom(path: Path) -> tuple[bytes, str]:
    from stable_retro.data import groom_rom

    with path.open("rb") as f:
        return groom_rom(path.name, f)


def import_roms(path: Path, *, cache: Path | None = None) -> list[dict[str, Any]]:
    """Import every ROM under ``path`` whose sha1 stable-retro knows.

    Args:
        path: a ROM file or a folder (searched recursively).
        cache: destination (default :func:`rom_cache_dir`).

    Returns:
        One row per file: ``{"file", "sha1", "game" (None when unknown), "dest" (None when not
        imported), "status": "imported" | "already_imported" | "unknown"}``.

    Raises:
        NotFound: ``path`` does not exist.
    """
    from stable_retro.data import get_known_hashes

    path = Path(path).expanduser()
    if not path.exists():
        raise NotFound(f"{path}: no such file or folder")
    cache = cache or rom_cache_dir()
    register_rom_dir(str(cache))
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    known = get_known_hashes()
    rows = []
    for file in files:
        try:
            body, sha1 = _groom(file)
        except ValueError as e:
            rows.append({"file": str(file), "sha1": None, "game": None, "dest": None, "status": f"unreadable: {e}"})
            continue
        match = known.get(sha1)
        if match is None:
            rows.append({"file": str(file), "sha1": sha1, "game": None, "dest": None, "status": "unknown"})
            continue
        game, ext, base = match
        dest_dir = cache / game
        dest = dest_dir / f"rom{ext}"
        if dest.is_file() and hashlib.sha1(dest.read_bytes()).hexdigest() == sha1:
            rows.append({"file": str(file), "sha1": sha1, "game": game, "dest": str(dest), "status": "already_imported"})
            continue
        src_dir = Path(base) / game
        tmp_dir = cache / f".{game}.partial"
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir)
        tmp_dir.mkdir(parents=True)
        for item in src_dir.iterdir():
            if item.is_file() and not item.name.startswith("rom.") or item.name == "rom.sha":
                shutil.copy2(item, tmp_dir / item.name)
        with (tmp_dir / f"rom{ext}").open("wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if dest_dir.exists():
            shutil.rmtree(dest_dir)
        os.replace(tmp_dir, dest_dir)
        logger.info("imported %s as %s", file, game)
        rows.append({"file": str(file), "sha1": sha1, "game": game, "dest": str(dest), "status": "imported"})
    return rows


def rom_status(*, cache: Path | None = None) -> list[dict[str, Any]]:
    """Imported ROMs with their hashes re-verified, plus the ROMs stable-retro bundles.

    Returns:
        ``[{"game", "source": "bundled" | "imported", "path", "sha1", "verified": bool}]``.
    """
    from stable_retro.data import Integrations, get_file_path, get_romfile_path, list_games

    register_rom_dir(str(cache or rom_cache_dir()))
    rows = []
    for game in list_games(Integrations.STABLE):
        try:
            rom = get_romfile_path(game, Integrations.STABLE)
        except FileNotFoundError:
            continue
        sha = _groom(Path(rom))[1]
        rows.append({"game": game, "source": "bundled", "path": rom, "sha1": sha,
                     "verified": sha in _expected(get_file_path(game, "rom.sha", Integrations.STABLE))})
    cache = cache or rom_cache_dir()
    if cache.is_dir():
        for game_dir in sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")):
            roms = [p for p in game_dir.iterdir() if p.name.startswith("rom.") and p.name != "rom.sha"]
            for rom_path in roms:
                sha = hashlib.sha1(rom_path.read_bytes()).hexdigest()
                rows.append({"game": game_dir.name, "source": "imported", "path": str(rom_path), "sha1": sha,
                             "verified": sha in _expected(str(game_dir / "rom.sha"))})
    return rows


def _expected(sha_file: str | None) -> set[str]:
    if not sha_file or not os.path.exists(sha_file):
        return set()
    return {line.strip() for line in Path(sha_file).read_text().splitlines() if line.strip()}


def verify_imported(game: str, *, cache: Path | None = None) -> None:
    """Check an imported ROM's sha1 against its ``rom.sha`` before use.

    Raises:
        IntegrityError: the stored ROM does not hash to any expected value.
    """
    cache = cache or rom_cache_dir()
    game_dir = cache / game
    if not game_dir.is_dir():
        return
    for rom_path in game_dir.glob("rom.*"):
        if rom_path.name == "rom.sha":
            continue
        sha = hashlib.sha1(rom_path.read_bytes()).hexdigest()
        if sha not in _expected(str(game_dir / "rom.sha")):
            raise IntegrityError(f"{rom_path}: sha1 {sha} matches no expected hash in rom.sha; re-import it with "
                                 f"`gradlab rom import PATH`")


class RomMissing(ConfigError):
    """A game stable-retro integrates, with no ROM bundled or imported on this machine."""


def missing_rom_error(game: str) -> RomMissing:
    """The error that says ``game``'s ROM is missing and how to import it."""
    return RomMissing(
        f"retro:{game}: no ROM for this game. stable-retro bundles only Airstriker-Genesis-v0; import yours with "
        f"`gradlab rom import PATH` (a ROM file or a folder; verified against stable-retro's sha1 and stored "
        f"under {rom_cache_dir()})"
    )
