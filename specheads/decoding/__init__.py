"""How draft heads are used: tree, draft, verify, accept, cache commit, generate (the core), with machine tuning
beside it in ``specheads.decoding.tuning`` (cost model, auto tree, backoff, CPU kernels), passed in by the caller.

from specheads.decoding import CpuKernels, SpeculativeGenerator, auto_tree_drafter, build_drafter
generator = SpeculativeGenerator(target, tokenizer, build_drafter(head))  # the head type's default tree
# on a CPU, with the matrix kernels measured faster on this machine for the few-token verify forwards:
# generator = SpeculativeGenerator(target, tokenizer, build_drafter(head), kernels=CpuKernels())
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
from specheads.decoding.draft import Drafter, DraftTree, Sampling
from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.eagle_draft import DrafterWindow, EagleTreeDrafter, with_drafter_window
from specheads.decoding.generator import DraftPolicy, Kernels, SpeculativeGenerator
from specheads.decoding.head_drafter import build_drafter
from specheads.decoding.kv_cache import commit_path
from specheads.decoding.lookup_branch import LookupBranchDrafter
from specheads.decoding.medusa_drafter import MedusaDrafter
from specheads.decoding.prompt_lookup_drafter import PromptLookupDrafter
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
from specheads.decoding.tuning.auto_tree import DrafterSpec, auto_tree_drafter
from specheads.decoding.tuning.backoff import DraftBackoff
from specheads.decoding.tuning.cpu_kernels import CpuKernels, SmallBatchLinear
from specheads.decoding.verify import Verification, verify_tree

__all__ = [
    "LOSSY_ACCEPTANCE",
    "AcceptResult",
    "CompiledTree",
    "DraftBackoff",
    "DraftModelDrafter",
    "DraftPolicy",
    "DraftTree",
    "DrafterSpec",
    "DrafterWindow",
    "Drafter",
    "DynamicTreeConfig",
    "EagleTreeDrafter",
    "GenerationResult",
    "GenerationStats",
    "Kernels",
    "LookupBranchDrafter",
    "MedusaDrafter",
    "Prompt",
    "PromptLookupDrafter",
    "Sampling",
    "CpuKernels",
    "SmallBatchLinear",
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
