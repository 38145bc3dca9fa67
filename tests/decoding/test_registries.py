"""Variants as registries: the accept-rule table (mtad/decoding/rules.py) and the proposer registry
(mtad/decoding/propose.py).

- A proposer is one entry: a new one registered at run time is a valid ``decoder.proposer``, is taken by the
  decoders it names, needs no draft model when it says so, and (at T = 0) decodes exactly as greedy does.
- The decoders and the verifier study judge through the same table: every rule of the study gives the table's
  verdict on random (p, q, x, u); a study rule built from another function fails the same comparison.
- ``decoder.accept`` takes the table's speculative rules and nothing else (not MTAD's joint rule).
"""
from __future__ import annotations

import pytest
import tinymodels as tm
import torch

import mtad
from mtad.decoding import DecoderConfig
from mtad.decoding.accept import speculative_accept
from mtad.decoding.core import needs_draft
from mtad.decoding.propose import PROPOSERS, Proposer
from mtad.decoding.rules import ACCEPT_RULES, RULES
from mtad.models.pair import ModelPair

torch.set_num_threads(1)


def repeat_rows(states, draft, batch, runs, K, rng, V):
    """A toy proposer: the row's last token, K times (one-hot q)."""
    x = [[run.tokens[-1]] * k for run, k in zip(runs, K)]
    q = torch.zeros(len(x), max(map(len, x)), V)  # (B, max K, V)
    for b, xb in enumerate(x):
        q[b, torch.arange(len(xb)), torch.tensor(xb, dtype=torch.long)] = 1.0
    return x, q


def test_a_new_proposer_is_one_entry(monkeypatch):
    monkeypatch.setitem(PROPOSERS, "repeat", Proposer("repeat", model=False, decoders=("speculative",),
                                                      rows=repeat_rows))
    cfg = DecoderConfig(name="speculative", proposer="repeat", temperature=0, max_new_tokens=12)
    assert not needs_draft(cfg)
    with pytest.raises(ValueError, match="'repeat' only with decoder=speculative"):
        DecoderConfig(name="mtad", proposer="repeat")
    target = tm.model("llama", 1, 32, hidden=16)
    prompts = [[5, 5, 5, 7], [1, 2, 3]]
    for B in (1, 2):
        got = mtad.generate(ModelPair(target), prompts[:B], cfg, torch.Generator().manual_seed(0))  # no draft model
        for r, p in zip(got, prompts):
            assert r.tokens == tm.oracle_greedy(target, p, 12)
            assert r.draft_forwards == 0 and sum(r.proposed) > 0


def verdicts_differ(rule_list, trials: int = 200) -> list[str]:
    """The study rules whose verdict differs from the table's rule of the same name and parameters."""
    from mtad.study.verifiers import shared

    g = torch.Generator().manual_seed(0)
    params = {"threshold": "tau", "mtad": "tau"}
    bad = set()
    for _ in range(trials):
        K, V = 3, 6
        p = torch.softmax(3 * torch.randn(K + 1, V, generator=g), -1)
        q = torch.softmax(3 * torch.randn(K, V, generator=g), -1)
        x = torch.multinomial(q, 1, generator=g)[:, 0]
        u = torch.rand(K, generator=g)
        for r in rule_list:
            kw = {params[r.name]: float(r.param.split("=")[1])} if r.name in params else {}
            if r.name == "typical":
                e, d = (float(s.split("=")[1]) for s in r.param.split(", "))
                kw = dict(typical_threshold=e, typical_alpha=d)
            if r.name == "fuzzy":
                kw = dict(fuzzy_threshold=float(r.param.split("≤")[1]), fuzzy_divergence="js")
            n1, law1 = r.fn(p, q, x, u)
            n2, law2 = shared(r.name, **kw)(p, q, x, u)
            if n1 != n2 or not torch.equal(law1, law2):
                bad.add(r.label)
    return sorted(bad)


def test_the_study_judges_with_the_decoders_table():
    from mtad.study.verifiers import Rule, rules

    study = rules()
    assert {r.name for r in study} <= set(RULES)
    assert verdicts_differ(study) == []
    # control: a study rule that is not the table's (token-wise acceptance without the min(1, .) cap on u) fails
    def uncapped(p, q, x, u):
        return speculative_accept(p, q, x, u * 2)
    assert verdicts_differ([Rule("lossless", "", True, uncapped)]) == ["lossless"]


def test_accept_takes_the_tables_speculative_rules_only():
    assert set(ACCEPT_RULES) == {n for n, r in RULES.items() if r.accept} and "mtad" not in ACCEPT_RULES
    for name in ACCEPT_RULES:
        DecoderConfig(name="speculative", accept=name)
    with pytest.raises(ValueError, match="decoder.accept='mtad'"):
        DecoderConfig(name="speculative", accept="mtad")
    assert {n for n, r in RULES.items() if r.lossless} == {"lossless", "block"}
