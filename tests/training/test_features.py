"""Target features: online extraction, the offline cache giving the same features and loss, resume, CLI."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from specheads.training.data import collate, tokenize_conversation
from specheads.training.data_cli import data_main
from specheads.training.feature_cache import CachedFeatureDataset, collate_features
from specheads.training.features import TargetFeatures, cache_features, extract_features, topk_to_dense

BUCKETS = 64
LAYERS = [2, 15, 27, 30]  # the EAGLE-3 set and the last (post-norm) state of the 30-layer SmolLM2
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "An apple, which is red."}],
]


@pytest.fixture(scope="module")
def samples(smollm2):
    _, tokenizer = smollm2
    return [
        {k: v for k, v in tokenize_conversation(m, tokenizer, 64).items() if k in ("input_ids", "loss_mask")}
        for m in CONVERSATIONS
    ]


def probe_loss(features: TargetFeatures, batch: dict[str, torch.Tensor], vocab_size: int) -> torch.Tensor:
    """A stand-in training loss: a fixed random linear probe from the (normalised) concatenated features to
    ``BUCKETS`` classes (token id mod BUCKETS); soft cross-entropy against the target's distribution folded into
    the buckets (dense from logits, or from the top-k) plus hard cross-entropy on the next token."""
    hidden = torch.cat([F.layer_norm(features.hidden_states[i].float(), (576,)) for i in LAYERS], dim=-1)
    probe = torch.randn(hidden.shape[-1], BUCKETS, generator=torch.Generator().manual_seed(0)) / 40
    log_q = torch.log_softmax(hidden @ probe, dim=-1)  # (B, T, BUCKETS)
    if features.logits is not None:
        p = torch.softmax(features.logits.float(), dim=-1)
    else:
        p = topk_to_dense(features.topk_values, features.topk_indices, vocab_size)
    bucket_of = torch.arange(vocab_size) % BUCKETS
    p_buckets = torch.zeros(*p.shape[:2], BUCKETS).index_add_(-1, bucket_of, p)  # (B, T, BUCKETS)
    soft = -(p_buckets * log_q).sum(-1)  # (B, T)
    hard = F.nll_loss(log_q[:, :-1].transpose(1, 2), batch["input_ids"][:, 1:] % BUCKETS, reduction="none")
    mask = batch["loss_mask"].float()
    return (soft * mask).sum() / mask.sum() + (hard * mask[:, 1:]).sum() / mask[:, 1:].sum()


@pytest.mark.slow
def test_online_features_are_the_requested_hidden_states(smollm2, samples):
    model, _ = smollm2
    batch = collate(samples[:2], pad_token_id=0)
    features = extract_features(model, batch["input_ids"], batch["attention_mask"], LAYERS, topk=4)
    with torch.no_grad():
        full = model(batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert sorted(features.hidden_states) == LAYERS
    for i in LAYERS:
        assert torch.equal(features.hidden_states[i], full.hidden_states[i])
    assert torch.equal(features.logits, full.logits)
    probs = torch.softmax(full.logits, dim=-1)
    assert torch.equal(features.topk_indices, probs.topk(4, dim=-1).indices)
    dense = topk_to_dense(features.topk_values, features.topk_indices, probs.shape[-1])
    assert torch.allclose(dense.sum(-1), torch.ones(dense.shape[:2]))
    lean = extract_features(model, batch["input_ids"], batch["attention_mask"], [30], with_logits=False)
    assert lean.logits is None and lean.hidden_states[30].dtype == torch.float32


@pytest.mark.slow
@pytest.mark.parametrize("dtype, topk", [(torch.float16, 8), (torch.bfloat16, None)])
def test_offline_cache_equals_online(smollm2, samples, tmp_path, dtype, topk):
    model, _ = smollm2
    bytes_per_token = cache_features(model, samples, LAYERS, tmp_path, dtype=dtype, topk=topk, shard_size=2)
    cached = CachedFeatureDataset(tmp_path)
    assert len(cached) == 3 and cached.layer_ids == LAYERS and cached.target.hidden_size == 576
    batch, offline = collate_features([cached[i] for i in range(3)], cached.pad_token_id)
    online_batch = collate(samples, pad_token_id=0)
    online = extract_features(
        model, online_batch["input_ids"], online_batch["attention_mask"], LAYERS, topk is None, topk, dtype
    )
    for name in online_batch:
        assert torch.equal(batch[name], online_batch[name])
    valid = batch["attention_mask"].bool()
    for i in LAYERS:
        assert offline.hidden_states[i].dtype == dtype
        ref = online.hidden_states[i][valid].float()
        assert torch.allclose(offline.hidden_states[i][valid].float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().mean())
    if topk is None:
        assert offline.topk_values is None and offline.logits.dtype == dtype
    else:
        assert offline.logits is None and torch.equal(offline.topk_indices[valid], online.topk_indices[valid])
    vocab = model.config.vocab_size
    offline_loss, online_loss = probe_loss(offline, batch, vocab), probe_loss(online, online_batch, vocab)
    assert torch.allclose(offline_loss, online_loss, rtol=1e-3), (offline_loss, online_loss)
    meta = json.loads((tmp_path / "meta.json").read_text())
    shard_bytes = sum(p.stat().st_size for p in tmp_path.glob("shard-*.safetensors"))
    num_tokens = sum(len(s["input_ids"]) for s in samples)
    assert meta["num_tokens"] == num_tokens and meta["num_shards"] == 2
    assert bytes_per_token == meta["bytes_per_token"] == shard_bytes / num_tokens


@pytest.mark.slow
def test_cache_resumes_missing_shards_and_refuses_other_settings(smollm2, samples, tmp_path):
    model, _ = smollm2
    cache_features(model, samples, [30], tmp_path, with_logits=False, shard_size=1)
    kept, dropped = tmp_path / "shard-00000.safetensors", tmp_path / "shard-00002.safetensors"
    os.utime(kept, (0, 0))
    dropped.unlink()
    (tmp_path / "shard-00002.tmp").write_bytes(b"half a shard")  # a kill during a write
    cache_features(model, samples, [30], tmp_path, with_logits=False, shard_size=1)
    assert kept.stat().st_mtime == 0 and dropped.exists()
    assert torch.equal(CachedFeatureDataset(tmp_path)[2]["input_ids"], torch.tensor(samples[2]["input_ids"]))
    with pytest.raises(ValueError, match="other settings or data.*topk"):
        cache_features(model, samples, [30], tmp_path, topk=4, shard_size=1)
    # a cache begun by a version whose target record had no weight probe resumes too
    meta = json.loads((tmp_path / "meta.json").read_text())
    del meta["target"]["weight_probe"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    dropped.unlink()
    cache_features(model, samples, [30], tmp_path, with_logits=False, shard_size=1)
    assert dropped.exists() and json.loads((tmp_path / "meta.json").read_text())["target"]["weight_probe"]
    # a shard left empty (a power loss after its rename) was skipped, and every later read was a safetensors traceback
    whole = dropped.read_bytes()
    dropped.write_bytes(b"")
    cache_features(model, samples, [30], tmp_path, with_logits=False, shard_size=1)
    assert dropped.read_bytes() == whole


@pytest.mark.slow
def test_a_wrong_layer_id_leaves_the_cache_folder_usable(smollm2, samples, tmp_path):
    """It failed after meta.json was written, and the corrected rerun was refused as "other settings"."""
    model, _ = smollm2
    with pytest.raises(ValueError, match="layer_ids=\\[2, 31\\] must be HF hidden-state indices in 0..30"):
        cache_features(model, samples, [2, 31], tmp_path, with_logits=False, shard_size=1)
    with pytest.raises(ValueError, match="topk=0 must lie in 1..49152"):
        cache_features(model, samples, [2, 30], tmp_path, topk=0, shard_size=1)
    assert not (tmp_path / "meta.json").exists()
    cache_features(model, samples, [2, 30], tmp_path, with_logits=False, shard_size=1)
    assert json.loads((tmp_path / "meta.json").read_text())["complete"]


@pytest.mark.slow
def test_cache_features_cli_end_to_end(smollm2, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS), encoding="utf-8")
    argv = ["cache-features", "--data", str(data), "--out-dir", str(tmp_path / "cache"), "--layer-ids", "15", "30"]
    assert data_main(argv + ["--topk", "4", "--dtype", "fp16", "--eval-size", "1", "--max-length", "64"]) == 0
    train = CachedFeatureDataset(tmp_path / "cache" / "train")
    evaluation = CachedFeatureDataset(tmp_path / "cache" / "eval")
    assert (len(train), len(evaluation)) == (2, 1)
    sample = train[0]
    assert sample["hidden_states.15"].shape == (len(sample["input_ids"]), 576)
    assert sample["topk_values"].dtype == torch.float16 and sample["topk_indices"].shape[-1] == 4
