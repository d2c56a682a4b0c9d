"""Who may write an output folder, and how ranks end with their launcher: one live run per folder, ranks that do
not outlive a SIGKILLed launcher, a second SIGTERM that does not cut the first one's unwinding short."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest

from specheads.training.checkpoint import LOCK_NAME, output_lock
from specheads.training.config import ConfigError
from specheads.training.launch import process_group_kwargs
from specheads.training.train_cli import _exit_on_sigterm


def test_one_live_run_per_output_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with output_lock(tmp_path / "run"):
        with pytest.raises(ConfigError, match="being written by another training run"):
            with output_lock(tmp_path / "run"):
                pass
        with output_lock(tmp_path / "other"):  # other folders are free
            pass
        monkeypatch.setenv("RANK", "1")  # only rank 0 of a launch takes the lock
        with output_lock(tmp_path / "run"):
            pass
        monkeypatch.delenv("RANK")
    with output_lock(tmp_path / "run"):  # released when the run ends
        assert (tmp_path / "run" / LOCK_NAME).is_file()


@pytest.mark.slow  # a whole run in a subprocess: in make test, not make test-fast
def test_a_killed_run_leaves_no_stale_lock(tmp_path):
    """The OS drops the lock of a process that dies, SIGKILL included: the next run starts without cleanup."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from specheads.training.checkpoint import output_lock\n"
         "with output_lock(Path(sys.argv[1])):\n    print('locked', flush=True)\n    time.sleep(600)\n",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items() if k != "RANK"},
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError):
        with output_lock(tmp_path):
            pass
    holder.kill()
    holder.wait()
    with output_lock(tmp_path):
        pass


def test_ranks_end_when_their_launcher_is_killed(tmp_path):
    """torchrun starts each rank in its own session; a rank must not keep training after a SIGKILL of its launcher.
    Here a real 'launcher' process starts a 'rank' that runs the training CLI's set-up and then waits."""
    rank_code = textwrap.dedent("""
        import os, signal, sys, time
        from specheads.training.train_cli import _exit_on_sigterm, _exit_with_launcher
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        _exit_with_launcher()
        try:
            print(os.getpid(), flush=True)
            time.sleep(600)
        finally:
            open(sys.argv[1], "w").write("exited through SystemExit")
    """)
    launcher_code = textwrap.dedent("""
        import subprocess, sys
        rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
        rank.wait()
    """)
    marker = tmp_path / "rank-exit"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code, rank_code, str(marker)], env=env, stdout=subprocess.PIPE, text=True
    )
    rank_pid = int(launcher.stdout.readline())  # the rank is set up and waiting
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 20
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.1)
    try:
        assert marker.exists() and marker.read_text() == "exited through SystemExit"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank_pid, signal.SIGKILL)  # a rank left behind would sleep on after the test


def test_a_second_sigterm_does_not_interrupt_the_first_ones_unwinding():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_info:
            _exit_on_sigterm(signal.SIGTERM, None)
        assert exit_info.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a forwarded second SIGTERM is ignored
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_process_group_timeout_is_the_configured_one():
    (handler,) = process_group_kwargs(30)
    assert handler.to_kwargs() == {"timeout": timedelta(seconds=30)}
