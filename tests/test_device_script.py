"""``scripts/h200_bench.sh``, the one-lease GPU benchmark: its steps refuse to run out of order, naming the missing
step. (Its whole path, stage -> receive -> run, was rehearsed on a CPU with ``DEVICE=cpu``, see docs/results.md; a
run trains and benchmarks, too long for CI.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "h200_bench.sh"


def run_step(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_script_parses_and_names_its_steps():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    for args in ((), ("bogus",)):
        result = run_step(*args)
        assert result.returncode == 2 and "usage: bash scripts/h200_bench.sh stage|receive K|run" in result.stderr


def test_receive_and_run_say_which_step_is_missing(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SPECHEADS_DEVICE_STAGE": str(tmp_path / "stage"), "OUT_DIR": str(tmp_path / "out")}
    env["SPECHEADS_DEVICE_WORK"] = str(tmp_path / "work")
    received = run_step("receive", env=env)
    assert received.returncode == 2 and "run 'stage' first" in received.stderr
    ran = run_step("run", env=env)
    assert ran.returncode == 2 and "'receive 1' did not run on this machine" in ran.stderr
    assert not (tmp_path / "out").exists()  # nothing started
    (tmp_path / "work" / "parts").mkdir(parents=True)
    (tmp_path / "work" / "parts" / "1").write_bytes(b"part 1")
    (tmp_path / "work" / "part_count").write_text("3\n")  # part 1 received, the last part not carried
    ran = run_step("run", env=env)
    assert ran.returncode == 2 and "stage/3 here: carry it" in ran.stderr
    (tmp_path / "stage" / "3").mkdir(parents=True)
    (tmp_path / "stage" / "3" / "target.part").write_bytes(b"part 3")  # carried, but part 2 never received
    ran = run_step("run", env=env)
    assert ran.returncode == 2 and "part 2 never arrived: call 'receive 2' first" in ran.stderr
    assert not (tmp_path / "out").exists()
