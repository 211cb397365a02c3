"""MoE routing diagnostics: capacity drop shares on hand-made routing, the tally's dispatch groups, and
`genolc eval --routing` on real DNA with the tiny preset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from genolc.cli import main
from genolc.routing import RoutingTally, drop_shares

CHR22 = "human/GRCh37_chr22_20000001-21000000.fa.gz"
LAMBDA = "other/lambda_phage_NC_001416.1.fa.gz"


def test_drop_shares_on_a_hand_made_routing_table():
    # 2 groups of 8 tokens, top-2, 4 experts: 16 slots per group, mean 4 per expert.
    counts = np.array([[10, 2, 2, 2],      # capacity c=1: 4 -> drops 6; c=1.25: 5 -> 5; c=1.5: 6 -> 4; c=2: 8 -> 2
                       [5, 5, 3, 3]])      # c=1: drops 1+1; c=1.25: 0; c=1.5: 0; c=2: 0
    shares = drop_shares(counts, [8, 8], top_k=2)
    assert shares == {"1": 8 / 32, "1.25": 5 / 32, "1.5": 4 / 32, "2": 2 / 32}


def test_a_short_last_group_gets_a_proportional_capacity():
    # Last group has 2 tokens (4 slots): capacity at c=1 is floor(2*2/4) = 1, its [4, 0, 0, 0] drops 3.
    shares = drop_shares(np.array([[4, 4, 4, 4], [4, 0, 0, 0]]), [8, 2], top_k=2, factors=(1.0,))
    assert shares == {"1": 3 / 20}


def test_drop_shares_refuse_counts_that_do_not_add_up():
    with pytest.raises(ValueError, match="top_k"):
        drop_shares(np.array([[3, 3]]), [4], top_k=2)


def test_tally_cuts_calls_into_dispatch_groups_in_routing_order():
    tally = RoutingTally(n_experts=4, top_k=1, group_tokens=4)
    scores = torch.full((3, 4), 0.5)
    tally.add(torch.tensor([[0], [0], [0]]), scores)          # group 1 gets tokens 1-3 ...
    tally.add(torch.tensor([[0], [1], [2]]), scores)          # ... and token 4 (expert 0); group 2 the other two
    summary = tally.summary(factors=(1.0,))
    assert [g.tolist() for g in tally.groups] == [[4, 0, 0, 0]]
    assert summary["groups"] == 2 and summary["tokens"] == 6
    assert summary["tokens_per_expert"] == [4, 1, 1, 0]
    # Group 1: capacity 1, expert 0 drops 3. Group 2 (2 tokens): capacity floor(0.5) = 0, both slots dropped.
    assert summary["drop_share"] == {"1": 5 / 6}
    assert summary["busiest_over_mean"] == pytest.approx(4 / 1.5)
    assert summary["router_entropy"] == pytest.approx(np.log(4))


def test_tally_read_back_between_calls_changes_nothing():
    """Counts are read back only when a summary or a merge asks, so a summary in the middle of a group (a training
    step's end) and more calls after it must add up as if read once."""
    generator = torch.Generator().manual_seed(0)
    calls = [(torch.randint(0, 6, (n, 2), generator=generator), torch.rand(n, 6, generator=generator))
             for n in (5, 9, 2, 14, 7)]
    once, often = RoutingTally(n_experts=6, top_k=2, group_tokens=8), RoutingTally(n_experts=6, top_k=2, group_tokens=8)
    for ids, scores in calls:
        once.add(ids, scores)
        often.add(ids, scores)
        often.summary()
    assert once.summary() == often.summary()
    assert [g.tolist() for g in once.groups] == [g.tolist() for g in often.groups]
    assert sum(g.sum() for g in once.groups) + once._open.sum() == 2 * sum(n for n in (5, 9, 2, 14, 7))
    # Merged into a run's tally the open groups close at the step's end, whether read before or not.
    run = RoutingTally(n_experts=6, top_k=2, group_tokens=8)
    run.merge(once)
    assert run.summary()["tokens"] == 37 and run.summary()["groups"] == 5
    assert run.summary()["tokens_per_expert"] == once.summary()["tokens_per_expert"]


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    from conftest import shared_file
    from genolc.data.dataset import PreparedDataset
    from genolc.model.checkpoint import save_pretrained
    from genolc.model.model import build_model
    from genolc.model.presets import preset

    root = tmp_path_factory.mktemp("routing")
    data = root / "data"
    result = CliRunner().invoke(main, ["prepare", str(shared_file(CHR22)), str(shared_file(LAMBDA)), "--train", "all",
                                       "--heldout", "chr22", "--out", str(data), "--no-progress"])
    assert result.exit_code == 0, result.output
    tok = PreparedDataset(data).tokenizer
    torch.manual_seed(0)
    save_pretrained(build_model(preset("tiny", vocab_size=tok.vocab_size)), root / "model", tokenizer=tok)
    return data, root / "model", root


def _eval_routing(setup, lengths, group, tokens, name):
    data, model, root = setup
    out = root / name
    result = CliRunner().invoke(main, ["eval", "--routing", "--data", data, "--checkpoint", model, "--seq", lengths,
                                       "--routing-group", group, "--max-tokens", tokens, "--out", out, "--no-progress"])
    assert result.exit_code == 0, result.output
    return out, result.output


def _check_report(out, lengths, tokens, group):
    report = json.loads((out / "routing.json").read_text())
    assert list(report["routing"]) == lengths
    [record] = (out / "runs").glob("*_eval-routing.json")
    record = json.loads(record.read_text())
    assert record["status"] == "ok" and record["outputs"]["routing"] == report["routing"]
    assert (out / "routing_load.png").stat().st_size > 0
    for layers in report["routing"].values():
        assert layers, "the tiny preset has MoE layers"
        for figures in layers.values():
            assert figures["tokens"] == tokens and figures["groups"] == -(-tokens // group)
            assert sum(figures["tokens_per_expert"]) == tokens * 2           # tiny routes each token to 2 experts
            load = np.array(figures["tokens_per_expert"])
            assert figures["busiest_over_mean"] == pytest.approx(load.max() / load.mean())
            shares = [figures["drop_share"][c] for c in ("1", "1.25", "1.5", "2")]
            assert shares == sorted(shares, reverse=True) and 0 <= shares[-1] <= shares[0] < 1
            assert 0 < figures["router_entropy"] <= figures["max_entropy"]
    return report


def test_eval_routing_tiny_at_1k_4k_16k_on_real_dna(tiny_setup):
    # One 16k-token stretch of chr22 cut into 16 windows of 1k, 4 of 4k and one of 16k (about 15 s on 2 cores).
    out, printed = _eval_routing(tiny_setup, "1k,4k,16k", "16k", "16k", "long")
    report = _check_report(out, ["1k", "4k", "16k"], 16384, 16384)
    assert len(report["stretches"]) == 1
    assert "drop_c1.25" in printed and "busiest_over_mean" in printed


def test_eval_routing_refuses_lengths_that_do_not_cut_the_same_dna(tiny_setup):
    data, model, root = tiny_setup
    result = CliRunner().invoke(main, ["eval", "--routing", "--data", data, "--checkpoint", model, "--seq", "2k,3k",
                                       "--out", root / "bad", "--no-progress"])
    assert result.exit_code == 2 and "do not divide the longest" in result.output
    assert not (root / "bad").exists()


def test_ctrl_c_keeps_the_context_lengths_routed_and_prints_them(tiny_setup, monkeypatch):
    """A Ctrl-C during the 4k length's first of two stretches: that stretch finishes, the 4k length (cut short, so not
    the same bases as 1k) is left out, the 1k length is written and printed, marked interrupted; exit 130."""
    import os
    import signal

    from genolc.eval import scorer as eval_scorer

    load = eval_scorer.load_model_scorer
    calls = []

    class CtrlCOnThirdForward:
        def __init__(self, scorer):
            self.scorer, self.model = scorer, scorer.model

        def __call__(self, ids):
            calls.append(ids.shape)
            out = self.scorer(ids)
            if len(calls) == 3:                      # 1k: stretches 1 and 2; 4k: stretch 1
                os.kill(os.getpid(), signal.SIGINT)
            return out

    monkeypatch.setattr(eval_scorer, "load_model_scorer", lambda *a, **k: CtrlCOnThirdForward(load(*a, **k)))
    # As in an interactive shell: a test runner started in the background inherits SIGINT as ignored.
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)
    data, model, root = tiny_setup
    out = root / "interrupted"
    result = CliRunner().invoke(main, ["eval", "--routing", "--data", data, "--checkpoint", model, "--seq", "1k,4k",
                                       "--routing-group", "4k", "--max-tokens", "8k", "--out", out, "--no-progress"])
    assert result.exit_code == 130, result.output
    assert len(calls) == 3 and [c[1] for c in calls] == [1024, 1024, 4096]
    assert result.stdout.splitlines()[0] == ("MoE routing by context length (8192 tokens each; INTERRUPTED: 1 of 2 "
                                             "context lengths routed):")
    assert "busiest_over_mean" in result.stdout and "wrote" not in result.stdout
    assert "eval --routing stopped by SIGINT after 1 of 2 context lengths" in result.stderr
    report = json.loads((out / "routing.json").read_text())
    assert report["status"] == "interrupted" and list(report["routing"]) == ["1k"]
    assert report["lengths"] == {"asked": ["1k", "4k"], "routed": ["1k"]}
    assert all(figures["tokens"] == 8192 for figures in report["routing"]["1k"].values())
    [record] = (out / "runs").glob("*_eval-routing.json")
    record = json.loads(record.read_text())
    assert record["status"] == "interrupted" and list(record["outputs"]["routing"]) == ["1k"]
    assert (out / "routing_load.png").stat().st_size > 0


def test_load_heatmap_grows_with_the_layer_count(tmp_path):
    """Each MoE layer keeps a readable row: 40 layers (`base`) make a taller figure than 4, labels horizontal."""
    import matplotlib.image

    from genolc.routing import plot_load_heatmap

    rng = np.random.default_rng(0)

    def figures(layers):
        return {"4k": {f"layer{i}": {"tokens_per_expert": rng.integers(1, 100, 16).tolist()} for i in range(layers)}}

    plot_load_heatmap(figures(4), tmp_path / "few.png", "few")
    plot_load_heatmap(figures(40), tmp_path / "many.png", "many")
    few, many = (matplotlib.image.imread(tmp_path / name).shape[0] for name in ("few.png", "many.png"))
    assert many >= 2.5 * few, (few, many)
