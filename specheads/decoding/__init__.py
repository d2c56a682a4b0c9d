"""How draft heads are used: tree, draft, verify, accept, cache commit, generate.

from specheads.decoding import SpeculativeGenerator, auto_tree_drafter, build_drafter
generator = SpeculativeGenerator(target, tokenizer, build_drafter(head))  # the head type's default tree
# or a tree sized for this machine by the cost model (measured once, then cached):
# generator = SpeculativeGenerator(target, tokenizer, auto_tree_drafter(head, head_dir, target, tokenizer).drafter)
result = generator.generate("Why is the sky blue?", max_new_tokens=128)
print(result.text, result.stats.summary())
"""

from specheads.decoding.accept import (
    LOSSY_ACCEPTANCE,
    AcceptResult,
    accept_greedy,
    accept_speculative,
    accept_typical,
)
from specheads.decoding.backoff import DraftBackoff
from specheads.decoding.draft import (
    Drafter,
    DraftTree,
    MedusaDrafter,
    PromptLookupDrafter,
    Sampling,
)
from specheads.decoding.drafters import DrafterSpec, auto_tree_drafter
from specheads.decoding.eagle_draft import DrafterWindow, EagleTreeDrafter, with_drafter_window
from specheads.decoding.factory import build_drafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.kv_cache import commit_path
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.model_draft import DraftModelDrafter
from specheads.decoding.prompts import Prompt, encode_prompt
from specheads.decoding.sampling import warp_logits_to_probs
from specheads.decoding.stats import GenerationResult, GenerationStats
from specheads.decoding.tree import (
    CompiledTree,
    DynamicTreeConfig,
    StaticTree,
    chain_tree,
    compile_tree,
    load_tree,
    static_tree,
)
from specheads.decoding.verify import Verification, verify_tree

__all__ = [
    "LOSSY_ACCEPTANCE",
    "AcceptResult",
    "CompiledTree",
    "DraftBackoff",
    "DraftModelDrafter",
    "DraftTree",
    "DrafterSpec",
    "DrafterWindow",
    "Drafter",
    "DynamicTreeConfig",
    "EagleTreeDrafter",
    "GenerationResult",
    "GenerationStats",
    "LookupBranchDrafter",
    "MedusaDrafter",
    "Prompt",
    "PromptLookupDrafter",
    "Sampling",
    "SpeculativeGenerator",
    "StaticTree",
    "Verification",
    "accept_greedy",
    "accept_speculative",
    "accept_typical",
    "auto_tree_drafter",
    "build_drafter",
    "chain_tree",
    "commit_path",
    "compile_tree",
    "encode_prompt",
    "load_tree",
    "static_tree",
    "verify_tree",
    "with_drafter_window",
    "warp_logits_to_probs",
]
