"""specheads: speculative decoding with trained draft heads on frozen Hugging Face targets."""

__version__ = "0.1.0"
