"""Shared helpers for the decoding tests: a stand-in tokenizer for the tiny random Llama."""

from __future__ import annotations


class TinyTokenizer:
    """Decodes token i as the word ``w{i}``; no chat template. Enough for generate() on ids."""

    chat_template = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f" w{int(i)}" for i in ids)
