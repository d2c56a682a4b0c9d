"""The project as a user gets it: an sdist and a wheel built from the repository, the wheel imported outside it.

The tests elsewhere import the editable install, which can read any file of the checkout; a wheel has only what
``pyproject.toml`` ships: a file the package reads from outside itself (Medusa's named trees, say) passes every
other test and fails from a wheel. The build runs offline, as ``python -m build`` does: the sdist
from the files git would ship, then the wheel from the unpacked sdist.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import specheads
from specheads.decoding.head_drafter import build_drafter, shipped_tree_names
from specheads.heads import MedusaConfig, MedusaHeads

pytestmark = pytest.mark.slow  # ~15 s: two builds and a fresh interpreter that imports torch

REPO = Path(__file__).resolve().parents[1]
TREES = REPO / "specheads" / "decoding" / "trees"

DRAFTERS_FROM_THE_WHEEL = """
import json, sys
from pathlib import Path

site, repo = sys.argv[1:]
import specheads
assert Path(specheads.__file__).resolve().is_relative_to(Path(site).resolve()), specheads.__file__
sys.path.append(repo)  # after the wheel: the tests' helpers only
from tests.tiny_models import make_tiny_llama
from specheads.decoding import build_drafter
from specheads.decoding.head_drafter import shipped_tree_names
from specheads.heads import MedusaConfig, MedusaHeads

heads = MedusaHeads(MedusaConfig(num_heads=4), make_tiny_llama())
trees = [None, *shipped_tree_names()]
print(json.dumps({str(tree): build_drafter(heads, tree).tree.num_nodes for tree in trees}))
"""


def _git_files() -> list[str]:
    """What a commit of the working tree would hold: tracked files and new ones that are not ignored."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the sdist is built from the files git would ship")
    return [name for name in listed.decode().split("\0") if name and os.path.lexists(REPO / name)]


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from a copy of the git files, and the wheel built from that sdist."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    for name in _git_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # configs/trees -> ../specheads/decoding/trees
            target.symlink_to(os.readlink(REPO / name))
        else:
            shutil.copy2(REPO / name, target)
    build_sdist = f"from setuptools import build_meta; build_meta.build_sdist({str(root / 'sdist')!r})"
    _run([sys.executable, "-c", build_sdist], source)
    (sdist,) = (root / "sdist").glob("specheads-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    (unpacked,) = (root / "unpacked").iterdir()
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    _run([*pip_wheel, "--wheel-dir", str(root / "wheel"), str(unpacked)], root)
    (wheel,) = (root / "wheel").glob("specheads-*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_the_wheel_ships_the_tree_files_license_and_version(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = set(wheel.namelist())
        metadata = email.message_from_bytes(wheel.read(f"specheads-{specheads.__version__}.dist-info/METADATA"))
    trees = sorted(path.name for path in TREES.glob("*.json"))
    assert trees and {f"specheads/decoding/trees/{name}" for name in trees} <= names
    assert "specheads/__main__.py" in names
    assert f"specheads-{specheads.__version__}.dist-info/licenses/LICENSE" in names
    assert metadata["Version"] == specheads.__version__ and metadata["License-Expression"] == "Apache-2.0"


def test_the_sdist_ships_the_whole_test_suite_and_what_it_reads(dists):
    with tarfile.open(dists["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    tests = {name for name in _git_files() if name.startswith("tests/")}
    assert {"tests/conftest.py", "tests/tiny_models.py", "tests/test_packaging.py"} <= tests
    assert tests <= names, sorted(tests - names)
    # the configs, committed data, scripts and docs the tests, the README's commands and `make demo` read
    shipped = {name for name in _git_files() if name.split("/")[0] in {"configs", "data", "scripts", "docs"}}
    assert {"configs/eagle3/smollm2-135m.yaml", "data/smollm2-135m-instruct-greedy-1k.jsonl"} <= shipped
    assert shipped | {"Makefile"} <= names, sorted(shipped - names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert {"LICENSE", "specheads/decoding/trees/small10.json"} <= names


def test_medusa_drafters_build_from_the_installed_wheel(dists, tmp_path, tiny_llama):
    """Outside the checkout, with only the wheel's files importable: the default tree and every named one."""
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        wheel.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    command = [sys.executable, "-c", DRAFTERS_FROM_THE_WHEEL, str(site), str(REPO)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    heads = MedusaHeads(MedusaConfig(num_heads=4), tiny_llama)
    expected = {str(tree): build_drafter(heads, tree).tree.num_nodes for tree in [None, *shipped_tree_names()]}
    assert json.loads(done.stdout.splitlines()[-1]) == expected
    assert set(expected) == {"None", *(path.stem for path in TREES.glob("*.json"))}


def test_the_wheel_answers_version_as_a_module(dists, tmp_path):
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        wheel.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "specheads", "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == f"specheads {specheads.__version__}", done.stderr
