"""Tree compilation against a hand-built tree, static trees from Medusa choices, dynamic-tree node selection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specheads.decoding.head_drafter import shipped_tree_names
from specheads.decoding.tree import (
    chain_tree,
    compile_tree,
    load_tree,
    reindex_parents,
    select_dynamic_nodes,
    static_tree,
)

REPO = Path(__file__).resolve().parents[2]
TREES = REPO / "specheads" / "decoding" / "trees"  # package data; configs/trees links here

# Hand-built tree (root = 0):      0
#                                /   \
#                               1     2
#                              / \     \
#                             3   4     5
#                             |
#                             6
PARENTS = [-1, 0, 0, 1, 1, 2, 3]
CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_compile_hand_built_tree():
    tree = compile_tree(PARENTS)
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.retrieve_indices.tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]
    assert tree.position_ids(10).tolist() == [[10, 11, 11, 12, 12, 12, 13]]
    mask = tree.attention_mask(prefix_len=2, dtype=torch.float32)
    assert mask.shape == (1, 1, 7, 9) and mask.dtype == torch.float32
    blocked = torch.finfo(torch.float32).min
    allowed = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 2, 5], 6: [0, 1, 3, 6]}
    for node, visible in allowed.items():
        expected = [0.0, 0.0] + [0.0 if j in visible else blocked for j in range(7)]
        assert mask[0, 0, node].tolist() == expected, node


def test_mask_is_additive_in_half_precision():
    mask = compile_tree(PARENTS).attention_mask(prefix_len=1, dtype=torch.float16)
    assert mask.dtype == torch.float16
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float16).min}


def test_static_tree_from_choices_matches_hand_built():
    tree = static_tree(list(reversed(CHOICES)))  # order of the choices does not matter
    assert tree.compiled.parents.tolist() == PARENTS
    assert tree.ranks.tolist() == [0, 0, 1, 0, 1, 0, 0]
    assert tree.max_depth == 3 and tree.max_rank == 2 and tree.num_nodes == 7


def test_static_tree_moves_to_a_device_whole():
    """Medusa drafting moves its tree to the heads' device once; every structure tensor goes with it."""
    tree = static_tree(CHOICES)
    moved = tree.to("meta")
    compiled = moved.compiled
    tensors = [moved.ranks, compiled.parents, compiled.depths, compiled.ancestors, compiled.retrieve_indices]
    assert all(t.device.type == "meta" for t in tensors)
    assert [t.shape for t in tensors[1:]] == [
        t.shape for t in (tree.compiled.parents, tree.compiled.depths, tree.compiled.ancestors,
                          tree.compiled.retrieve_indices)
    ]  # fmt: skip
    assert moved.choices == tree.choices and moved.max_rank == 2 and moved.max_depth == 3


def test_chain_is_one_path():
    tree = chain_tree(4)
    assert tree.compiled.parents.tolist() == [-1, 0, 1, 2, 3]
    assert tree.compiled.retrieve_indices.tolist() == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("bad", [[[1, 0]], [[-1]], []])
def test_static_tree_rejects_bad_choices(bad):
    with pytest.raises(ValueError):
        static_tree(bad)


def test_compile_rejects_malformed_parents():
    with pytest.raises(ValueError, match="root"):
        compile_tree([0, 0])
    with pytest.raises(ValueError, match="parents"):
        compile_tree([-1, 0, 3, 1])


@pytest.mark.parametrize("path", sorted(TREES.glob("*.json")), ids=lambda p: p.name)
def test_shipped_trees_load(path):
    tree = load_tree(path)
    assert tree.num_nodes >= 2
    assert (tree.compiled.parents[1:] < torch.arange(1, tree.num_nodes)).all()


def test_shipped_trees_sizes():
    assert load_tree(TREES / "chain4.json").compiled.retrieve_indices.shape == (1, 5)
    assert load_tree(TREES / "medusa60.json").num_nodes == 61


@pytest.mark.parametrize(
    "text, found",
    [
        ('{"choices": [0, 1, 2]}', 'found {"choices": [0, 1, 2]}'),  # ranks, not paths: was a raw TypeError
        ('{"choices": null}', 'found {"choices": null}'),  # likewise
        ("[[0], [1]]", "found [[0], [1]]"),
        ('{"choices": [[0],', "does not read as JSON (Expecting value"),  # json's error named no file
        ('{"choices": [[0], [1, 0]]}', "choice [1, 0] has no parent [1] in the tree; add the parent path"),  # likewise
    ],
)
def test_a_tree_file_of_another_shape_is_a_value_error_naming_the_file_and_the_format(tmp_path, text, found):
    """``--tree FILE``'s check before the target loads catches ValueError: a TypeError went past it as a traceback."""
    path = tmp_path / "my-tree.json"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_tree(path)
    assert str(error.value).startswith(f"tree file {path}") and found in str(error.value)
    if "parent [1]" not in found:  # a well-formed file whose paths do not make a tree: the format is not the issue
        assert 'expected a JSON object {"choices": [[0], [1], [0, 0], ...]}' in str(error.value)


def test_configs_trees_links_to_the_shipped_trees():
    """The tree files are package data (a wheel has them); ``configs/trees`` is a link to them, not a second copy."""
    assert (REPO / "configs" / "trees").is_symlink()
    assert (REPO / "configs" / "trees").resolve() == TREES.resolve()
    assert shipped_tree_names() == sorted(path.stem for path in TREES.glob("*.json")) != []


def test_dynamic_selection_keeps_parents_and_creation_order():
    # Candidates in creation order: root, two children of the root, then children of node 1 and node 2.
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
    scores = torch.tensor([0.0, -0.1, -2.0, -0.3, -0.4, -2.1, -5.0])
    kept = select_dynamic_nodes(scores, parents, total_tokens=4)
    assert kept.tolist() == [0, 1, 2, 3, 4]
    assert reindex_parents(parents, kept).tolist() == [-1, 0, 0, 1, 1]
    kept = select_dynamic_nodes(scores, parents, total_tokens=3)
    assert kept.tolist() == [0, 1, 3, 4]
    assert reindex_parents(parents, kept).tolist() == [-1, 0, 1, 1]


def test_dynamic_selection_drops_impossible_nodes_and_ties_prefer_parents():
    parents = torch.tensor([-1, 0, 1, 0])
    scores = torch.tensor([0.0, 0.0, 0.0, -float("inf")])  # a certain chain, then a zero-probability sibling
    assert select_dynamic_nodes(scores, parents, total_tokens=10).tolist() == [0, 1, 2]
    assert select_dynamic_nodes(scores, parents, total_tokens=1).tolist() == [0, 1]
