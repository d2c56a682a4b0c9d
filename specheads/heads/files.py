"""The file names of a head folder, in a module of their own so that every reader and writer (save, load, card, Hub)
imports them without importing each other."""

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
LORA_DIR = "lora"
"""A Medusa-2 head's LoRA adapter for the target, in a folder beside the heads."""
CHECKPOINT_STATE_NAME = "trainer_state.json"
"""The file that marks a training checkpoint folder (written last, so it marks a complete one); a folder with it and
no ``config.json`` is a checkpoint given where a saved head belongs."""
