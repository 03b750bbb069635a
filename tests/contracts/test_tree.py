"""What ``gradlab.contracts.tree`` says about a GOAL/RECIPE that names no files (``gradlab train``
says it before it starts anything): one line naming what is there instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradlab.contracts.experiments import Experiments
from gradlab.contracts.tree import check_ref
from gradlab.errors import ConfigError, NotFound

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tree with a family (Fam/A, Fam/A/Sub, Fam/B), a goal with a sub-goal and no recipe of that
    name (Top, Top/Two), and odd recipe entries (a folder, a broken link) beside Top's ppo."""
    root = tmp_path / "experiments"
    for goal in ("Fam/A", "Fam/A/Sub", "Fam/B", "Top", "Top/Two"):
        (root / "goals" / goal / "recipes").mkdir(parents=True)
        (root / "goals" / goal / "_goal.yaml").write_text("title: x\n")
        (root / "goals" / goal / "recipes" / "ppo.yaml").write_text("train: {timesteps: 1}\n")
    (root / "goals" / "Top" / "recipes" / "folder.yaml").mkdir()
    (root / "goals" / "Top" / "recipes" / "broken.yaml").symlink_to(tmp_path / "nowhere.yaml")
    monkeypatch.setenv("GRADLAB_EXPERIMENTS", str(root))
    return root


@pytest.mark.parametrize(("ref", "said"), [
    ("Fam/ppo", "'Fam' is a family of goals, not a goal: Fam/A, Fam/A/Sub, Fam/B"),
    ("Fam", "'Fam' is a family of goals, not a goal: Fam/A, Fam/A/Sub, Fam/B; name one of them and a recipe: "
            "GOAL/RECIPE"),
    ("Fam/A", "'Fam/A' is a goal; name one of its recipes: GOAL/RECIPE, e.g. Fam/A/ppo"),
    ("Top", "'Top' is a goal; name one of its recipes: GOAL/RECIPE, e.g. Top/ppo"),
    ("Top/", "'Top' is a goal; name one of its recipes: GOAL/RECIPE, e.g. Top/ppo"),
    ("Top/Two", "'Top/Two' is a goal; name one of its recipes: GOAL/RECIPE, e.g. Top/Two/ppo"),
    ("experiments/goals/Fam/A/recipes/ppo.yaml",
     "'experiments/goals/Fam/A/recipes/ppo.yaml' is a recipe file; name it as GOAL/RECIPE: Fam/A/ppo"),
    ("Fam/A/ppp", "goal 'Fam/A' has no recipe 'ppp' (did you mean Fam/A/ppo?)"),
    ("Fam/A/PPO", "goal 'Fam/A' has no recipe 'PPO' (did you mean Fam/A/ppo?)"),
    ("Fam/A/ppo.yaml", "goal 'Fam/A' has no recipe 'ppo.yaml' (did you mean Fam/A/ppo?)"),
    ("top/ppo", "unknown goal 'top' (did you mean Top?)"),
    ("Top/folder", "goal 'Top' has no recipe 'folder'; its recipes: ppo"),
    ("Top/broken", "goal 'Top' has no recipe 'broken'; its recipes: ppo"),
    ("Fam/C/ppo", "unknown goal 'Fam/C' (did you mean Fam/B?)"),
])
def test_a_ref_that_names_no_files_says_what_is_there(tree: Path, ref: str, said: str) -> None:
    with pytest.raises(NotFound) as caught:
        check_ref(ref)
    assert str(caught.value) == said
    with pytest.raises(NotFound) as resolved:  # the resolver says the same
        Experiments().resolve(ref)
    assert str(resolved.value) == said


def test_a_tree_without_goals_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADLAB_EXPERIMENTS", str(tmp_path / "nothing"))
    with pytest.raises(NotFound, match=r"^unknown goal 'CartPole-v1': .*nothing/goals \(GRADLAB_EXPERIMENTS=.*nothing\) "
                                       r"holds no goal \(folders with a _goal\.yaml\)$"):
        check_ref("CartPole-v1/ppo")


@pytest.mark.parametrize("ref", ["Top/ppo\n", "Top\n/ppo"])
def test_a_trailing_newline_is_not_part_of_an_id(tree: Path, ref: str) -> None:
    with pytest.raises(ConfigError, match=r"id: expected "):
        check_ref(ref)


def test_a_long_ref_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as caught:
        check_ref("x" * 100_000)
    assert str(caught.value) == f"expected GOAL/RECIPE, found '{'x' * 80}'…"


@pytest.mark.skipif(os.geteuid() == 0 and not Path("/usr/bin/setpriv").exists(), reason="root reads anything")
def test_an_unreadable_folder_is_one_line(tree: Path) -> None:
    """A goals folder the user cannot list: a ConfigError naming it, not a traceback (run without
    the capabilities that let root read anything)."""
    (tree / "goals").chmod(0o311)  # searchable, not listable: the known goals cannot be listed
    try:
        code = ("from gradlab.contracts.tree import check_ref\ntry:\n    check_ref('nosuch/ppo')\n"
                "except Exception as e:\n    print(type(e).__name__, e)")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
        out = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                             env={**os.environ, "GRADLAB_EXPERIMENTS": str(tree)}, timeout=120)
    finally:
        (tree / "goals").chmod(0o755)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ConfigError cannot read the experiments tree: {tree / 'goals'}: Permission denied"


def test_a_deleted_working_directory_is_named(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os\nfrom gradlab.contracts.tree import check_ref\nos.rmdir(os.getcwd())\ntry:\n"
            "    check_ref('CartPole-v1/ppo')\nexcept Exception as e:\n    print(type(e).__name__, e)")
    env = {k: v for k, v in os.environ.items() if k != "GRADLAB_EXPERIMENTS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=gone,
                         env={**env, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "NotFound the current directory no longer exists: change to one that does"
