"""scripts/translation_prompts_from_translations.py on a wheel-shaped zip of German and English message files."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

from tests.scripts_loader import SCRIPTS, load_script

GERMAN = {
    "config": {
        "step": {"user": {"description": "Gib deine E-Mail-Adresse und dein Passwort für die Anmeldung ein."}},
        "abort": {"already_configured": "Gerät ist bereits konfiguriert"},  # 4 words: too short
    },
    "services": {"reset": {"description": "Setzt den Zähler nach {hours} Stunden auf den Anfangswert zurück."}},
    "issues": {"moved": {"description": "Die Integration ist umgezogen, siehe https://example.org für alle Details."}},
}


def _wheel(path, files):
    with zipfile.ZipFile(path, "w") as archive:
        for name, tree in files.items():
            archive.writestr(name, json.dumps(tree, ensure_ascii=False))
    return path


def test_only_whole_german_messages_without_placeholders_or_links_become_prompts(tmp_path):
    script = load_script("translation_prompts_from_translations.py")
    wheel = _wheel(
        tmp_path / "app-1.0-py3-none-any.whl",
        {
            "app/components/lights/translations/de.json": GERMAN,
            "app/components/lights/translations/en.json": {"config": {"step": {"user": {"description": "x"}}}},
            "app/components/other/translations/de.json": GERMAN,  # the same messages again: kept once
        },
    )
    found = script.german_messages(wheel)
    assert found == {
        "lights:config.step.user.description": "Gib deine E-Mail-Adresse und dein Passwort für die Anmeldung ein."
    }
    out = tmp_path / "prompts.jsonl"
    run = [sys.executable, str(SCRIPTS / "translation_prompts_from_translations.py"), str(wheel), "--out", str(out)]
    subprocess.run(run, check=True, capture_output=True)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records == [
        {
            "id": "app-1.0:lights:config.step.user.description",
            "prompt": "Translate German to English: Gib deine E-Mail-Adresse und dein Passwort für die Anmeldung ein.",
            "task": "translate",
        }
    ]
