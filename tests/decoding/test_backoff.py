"""Draft backoff: the policy on measured step times, and losslessness when drafting is switched off and on."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specheads.decoding.draft_model_drafter import DraftModelDrafter
from specheads.decoding.generator import SpeculativeGenerator
from specheads.decoding.tuning.backoff import DraftBackoff
from specheads.heads import DraftModel
from tests.decoding.helpers import TinyTokenizer
from tests.decoding.test_generator import DRAFTERS, PROMPT, tiny_drafters


def test_drafting_that_pays_stays_on():
    policy = DraftBackoff()
    assert policy.should_draft()  # measure drafting first
    policy.record(True, seconds=0.12, tokens=3)  # 25 tokens/s
    assert not policy.should_draft()  # then one plain step
    policy.record(False, seconds=0.10, tokens=1)  # 10 tokens/s
    assert all(policy.should_draft() for _ in range(20))


def test_drafting_that_does_not_pay_backs_off_and_probes():
    policy = DraftBackoff(probe_every=4)
    policy.should_draft()
    policy.record(True, seconds=0.15, tokens=1)  # 6.7 tokens/s
    policy.should_draft()
    policy.record(False, seconds=0.10, tokens=1)  # 10 tokens/s
    decisions = [policy.should_draft() for _ in range(12)]
    assert decisions == [False, False, False, True] * 3  # a probe every 4th step
    for _ in range(6):  # the probes start to accept 3 tokens: drafting pays again
        policy.record(True, seconds=0.15, tokens=3)
    assert policy.should_draft() and policy.should_draft()


@dataclass
class EveryThirdStep(DraftBackoff):
    """Drafts on steps 1, 4, 7, ...: exercises plain steps between drafts whatever the timings."""

    calls: int = 0

    def should_draft(self) -> bool:
        self.calls += 1
        return self.calls % 3 == 1


@pytest.fixture
def tiny_llama(tiny_llama):
    tiny_llama.generation_config.eos_token_id = None
    return tiny_llama


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_steps_between_drafts_stay_lossless(tiny_llama, name, temperature):
    plain = SpeculativeGenerator(tiny_llama, TinyTokenizer())
    ours = SpeculativeGenerator(tiny_llama, TinyTokenizer(), tiny_drafters(tiny_llama)[name], backoff=EveryThirdStep())
    expected = plain.generate(PROMPT, max_new_tokens=24, temperature=temperature, seed=5)
    result = ours.generate(PROMPT, max_new_tokens=24, temperature=temperature, seed=5)
    assert result.stats.plain_steps >= result.stats.target_forwards // 3
    assert len(result.token_ids) == 24
    if temperature == 0.0:
        assert result.token_ids == expected.token_ids
    again = ours.generate(PROMPT, max_new_tokens=24, temperature=temperature, seed=5)
    assert again.token_ids == result.token_ids  # a fresh policy per request


def test_a_perfect_draft_model_stays_perfect_across_plain_steps(tiny_llama):
    """A draft model that is the whole target guesses every token; after plain steps its cache must still hold
    exactly the committed tokens, or its guesses would start to miss."""
    perfect = DraftModelDrafter(
        DraftModel.from_target(tiny_llama, tiny_llama.config.num_hidden_layers).eval(),
        draft_length=3,
        min_length=3,
        max_length=3,
    )
    result = SpeculativeGenerator(tiny_llama, TinyTokenizer(), perfect, backoff=EveryThirdStep()).generate(
        PROMPT, max_new_tokens=40
    )
    steps = result.stats.accepted_lengths  # drafting steps are steps 0, 3, 6, ...; the others are plain
    assert result.stats.plain_steps == len([i for i in range(len(steps)) if i % 3]) > 3
    assert [n for i, n in enumerate(steps) if i % 3 == 0] == [3] * len(range(0, len(steps), 3))
    assert [n for i, n in enumerate(steps) if i % 3] == [0] * result.stats.plain_steps


def test_backoff_takes_a_policy_object(tiny_llama):
    """The core does not know the default policy (it lives in the tuning): a bare flag is refused with the fix."""
    with pytest.raises(TypeError, match=r"backoff takes a draft policy, got True; pass .*DraftBackoff\(\)"):
        SpeculativeGenerator(tiny_llama, TinyTokenizer(), backoff=True)
