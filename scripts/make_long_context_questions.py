"""Build the long-context benchmark set (`data/long_context/questions.jsonl`): long-document prompts at about 1k,
2k, 4k and 7.5k tokens (the SmolLM2 chat-templated prompt), in Spec-Bench's question format.

Every document is text the Python interpreter ships under the PSF license, read from this interpreter's own
standard library, never downloaded: module sources (``argparse.py``, ...) and the language reference's prose that
``pydoc`` serves (``pydoc_data.topics``). Three tasks per length, as Spec-Bench's summarisation, QA and writing
categories but over one long document each:
- ``summarise``: a run of language-reference sections, "summarise this";
- ``question``: the beginning of a module's source and a question about one function in it;
- ``continue``: the beginning of a module's source, "continue this file" (prompt lookup's best case: code repeats).

The category of each question is its length (``long-1k`` ... ``long-7.5k``), so the benchmark's per-category table
is per context length. Each document is cut at a line boundary to the largest prefix whose whole prompt fits the
length; the 7.5k prompts leave 692 tokens of SmolLM2's 8,192 for the answer.

    python scripts/make_long_context_questions.py --out data/long_context/questions.jsonl
    specheads bench --questions data/long_context/questions.jsonl --per-category 3 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import sysconfig
from collections.abc import Callable
from functools import partial
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

LENGTHS = {"long-1k": 1024, "long-2k": 2048, "long-4k": 4096, "long-7.5k": 7500}
"""Category -> the most prompt tokens (chat template included) a question of that category has."""
FIRST_ID = 1001  # question ids 1001..: clear of Spec-Bench's 1-480
MIN_FILL = 0.9  # a document too short to fill 90% of its length is refused (pick a longer source)

# Sources per length, disjoint so no two lengths share a document (and prompt lookup cannot match across them).
REFERENCE_TOPICS = {
    "long-1k": ["for", "while", "if", "with", "raise", "try"],
    "long-2k": ["assignment", "augassign", "del", "return", "global"],
    "long-4k": ["execmodel", "naming", "import", "exceptions"],
    "long-7.5k": ["formatstrings", "string-methods", "typesseq"],
}
QUESTION_MODULES = {
    "long-1k": "shlex.py",
    "long-2k": "fractions.py",
    "long-4k": "configparser.py",
    "long-7.5k": "difflib.py",
}
CONTINUE_MODULES = {"long-1k": "bisect.py", "long-2k": "heapq.py", "long-4k": "calendar.py", "long-7.5k": "argparse.py"}

SUMMARISE = "Summarise the following sections of the Python language reference in a few paragraphs.\n\n{document}"
QUESTION = (
    "Here is the beginning of the source of Python's `{module}` module.\n\n```python\n{document}\n```\n\n"
    "What does `{function}` do, what does it return, and where in this file is it used?"
)
CONTINUE = "Continue this Python file from exactly where it stops.\n\n```python\n{document}"


def stdlib_text(name: str) -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: expected the standard-library module {name} of this interpreter")
    return path.read_text(encoding="utf-8")


def reference_text(topics: list[str]) -> str:
    """Language-reference sections as ``pydoc`` shows them (``pydoc_data.topics``: the reference's text)."""
    from pydoc_data.topics import topics as reference

    missing = [t for t in topics if t not in reference]
    if missing:
        raise KeyError(f"pydoc topics {missing} not in this interpreter's pydoc_data; pick others from its keys")
    return "\n\n".join(reference[t].strip() for t in topics)


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return len(ids if isinstance(ids, list) else ids["input_ids"])


def fit(tokenizer: PreTrainedTokenizerBase, document: str, render: Callable[..., str], limit: int) -> str:
    """``render(document=...)`` over the longest line-boundary prefix of ``document`` that fits ``limit`` tokens."""
    lines = document.splitlines()
    low, high = 0, len(lines)
    while low < high:  # the largest line count that fits
        mid = (low + high + 1) // 2
        if prompt_tokens(tokenizer, render(document="\n".join(lines[:mid]))) <= limit:
            low = mid
        else:
            high = mid - 1
    prompt = render(document="\n".join(lines[:low]))
    if prompt_tokens(tokenizer, prompt) < MIN_FILL * limit:
        raise ValueError(f"document too short for {limit} tokens ({len(lines)} lines); give this length a longer one")
    return prompt


def middle_function(source: str) -> str:
    """The name of the top-level or method ``def`` nearest the middle of ``source`` (public names only)."""
    names = [(m.start(), m.group(1)) for m in re.finditer(r"^\s*def ([a-zA-Z]\w*)\(", source, re.MULTILINE)]
    if not names:
        raise ValueError("no public function in the excerpt; pick another module")
    return min(names, key=lambda item: abs(item[0] - len(source) // 2))[1]


def build(tokenizer: PreTrainedTokenizerBase) -> list[dict]:
    questions = []
    for category, limit in LENGTHS.items():
        summarise = fit(tokenizer, reference_text(REFERENCE_TOPICS[category]), partial(SUMMARISE.format), limit)
        module = QUESTION_MODULES[category]
        source = stdlib_text(module)
        # the question names a function in the part of the file that fits: fit once without it, then with it
        excerpt = fit(tokenizer, source, partial(QUESTION.format, module=module, function="x"), limit)
        ask = partial(QUESTION.format, module=module, function=middle_function(excerpt))
        question = fit(tokenizer, source, ask, limit)
        cont = fit(tokenizer, stdlib_text(CONTINUE_MODULES[category]), partial(CONTINUE.format), limit)
        for task, prompt in (("summarise", summarise), ("question", question), ("continue", cont)):
            questions.append(
                {
                    "question_id": FIRST_ID + len(questions),
                    "category": category,
                    "turns": [prompt],
                    "task": task,
                    "prompt_tokens": prompt_tokens(tokenizer, prompt),
                }
            )
    return questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/long_context/questions.jsonl"))
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the built-in SmolLM2 target's)")
    args = parser.parse_args()
    if args.tokenizer is None:
        from specheads.target import ensure_builtin_converted

        args.tokenizer = str(ensure_builtin_converted("smollm2-135m-instruct"))
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    questions = build(tokenizer)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions))
    version = ".".join(map(str, sys.version_info[:3]))
    for q in questions:
        print(f"{q['question_id']} {q['category']:>9} {q['task']:>9} {q['prompt_tokens']:>5} tokens")
    print(f"wrote {len(questions)} questions to {args.out} (Python {version} standard library)")


if __name__ == "__main__":
    main()
