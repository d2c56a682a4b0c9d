"""Thin wrapper: ``python scripts/push_head.py DIR REPO_ID`` == ``specheads push DIR REPO_ID``."""

from specheads.heads.push_cli import push_main

if __name__ == "__main__":
    raise SystemExit(push_main())
