"""German-to-English translation prompts from an application's German UI translations (a wheel's de.json files).

ShareGPT holds 279 German sentences in all, and no licensed news text is installed here; Home Assistant's wheel
(Apache-2.0) ships a German translation of each integration's messages beside the English one. Each German message
of 8-60 words without placeholders, URLs or markup becomes "Translate German to English: ..." for `data generate`
(the target writes the English; the shipped English is not used). An experiment on whether German input of any kind
lifts the Spec-Bench translation category (docs/results.md); the text is technical, not news.

    python -m pip download --no-deps --only-binary :all: --python-version 3.13 -d runs/wheels homeassistant==2025.4.4
    python scripts/translation_prompts_from_translations.py runs/wheels/homeassistant-2025.4.4-py3-none-any.whl \
        --out runs/data/ha-translate-prompts.jsonl --limit 800
"""

from __future__ import annotations

import argparse
import json
import random
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

from specheads.training.task_prompts import TRANSLATE

GERMAN_FILE = re.compile(r"components/(?P<component>[^/]+)/translations/de\.json$")
NOT_PROSE = re.compile(r"[{}<>\[\]`|#*]|https?://")
WORDS = (8, 60)


def _strings(tree: dict, prefix: str = "") -> Iterator[tuple[str, str]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _strings(value, f"{prefix}{key}.")
        elif isinstance(value, str):
            yield f"{prefix}{key}", value


def german_messages(wheel: Path) -> dict[str, str]:
    """id -> German message of every de.json in ``wheel``, the ids ``<component>:<dotted key>``, first kept."""
    found: dict[str, str] = {}
    seen: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if (match := GERMAN_FILE.search(name)) is None:
                continue
            for key, text in _strings(json.loads(archive.read(name))):
                text = " ".join(text.split())
                if WORDS[0] <= len(text.split()) <= WORDS[1] and not NOT_PROSE.search(text) and text not in seen:
                    seen.add(text)
                    found[f"{match['component']}:{key}"] = text
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="a wheel holding components/*/translations/de.json")
    parser.add_argument("--out", required=True, type=Path, help="JSONL of {id, prompt, task} for `data generate`")
    parser.add_argument("--limit", type=int, default=None, help="a seeded sample of N messages (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="which messages the sample draws")
    args = parser.parse_args()
    messages = sorted(german_messages(args.wheel).items())
    random.Random(args.seed).shuffle(messages)
    chosen = messages[: args.limit] if args.limit else messages
    prefix = args.wheel.name.split("-py3")[0]
    with args.out.open("w", encoding="utf-8") as out:
        for key, text in chosen:
            record = {"id": f"{prefix}:{key}", "prompt": f"{TRANSLATE}{text}", "task": "translate"}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(chosen)} of {len(messages)} German messages -> {args.out}")


if __name__ == "__main__":
    main()
