"""Fixtures the Hub tests share (``test_hub.py``, ``test_export_push.py``)."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture
def fake_hub(monkeypatch):
    """Everything up to the network: huggingface_hub's own ``upload_folder`` builds the commit from the folder and
    the repository's file list (``fake_hub.remote``); only the calls that reach the Hub are replaced (creating the
    repository, a branch, its settings, listing its files, the Hub's check of the card's YAML, the commit), and the
    upload takes the library's single-commit path rather than its Xet pipeline, so that one commit carries every
    file. ``fake_hub.calls`` records (name, keyword arguments); a commit records its sorted (operation, path)s."""
    import huggingface_hub.hf_api
    from huggingface_hub import HfApi

    hub = SimpleNamespace(calls=[], remote=[".gitattributes", "config.json", "model.safetensors", "README.md"])
    monkeypatch.setattr(huggingface_hub.hf_api, "is_xet_available", lambda: False)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: hub.calls.append(("create_repo", kw)))
    monkeypatch.setattr(HfApi, "create_branch", lambda self, repo_id, **kw: hub.calls.append(("create_branch", kw)))
    monkeypatch.setattr(HfApi, "update_repo_settings", lambda self, repo_id, **kw: hub.calls.append(("settings", kw)))
    monkeypatch.setattr(HfApi, "list_repo_files", lambda self, repo_id, **kw: list(hub.remote))
    monkeypatch.setattr(HfApi, "_validate_yaml", lambda self, content, **kw: hub.calls.append(("yaml", {})))

    hub.uploaded = {}  # path in the repository -> the bytes the last commits uploaded

    def create_commit(self, repo_id, operations, **kw):
        ops = sorted((type(op).__name__, op.path_in_repo) for op in operations)
        for op in operations:
            content = getattr(op, "path_or_fileobj", None)
            if isinstance(content, (str, os.PathLike)):
                hub.uploaded[op.path_in_repo] = Path(content).read_bytes()
            elif isinstance(content, bytes):
                hub.uploaded[op.path_in_repo] = content
        hub.calls.append(("commit", {**kw, "ops": ops}))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/abc")

    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    return hub
