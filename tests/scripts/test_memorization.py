"""The memorization scorer (axgrid.memorization.scores) on hand-computed cases."""
import pytest
import torch

from axgrid.memorization import exact_match, lcs_length, rouge_l, score_continuations, token_accuracy


def test_lcs_on_known_pairs():
    assert lcs_length([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == 5
    assert lcs_length([1, 2, 3, 4], [2, 4, 3]) == 2            # "2 4" or "2 3"
    assert lcs_length([7, 1, 8, 2, 9, 3], [1, 2, 3]) == 3       # a subsequence, not a substring
    assert lcs_length([1, 1, 1], [2, 2]) == 0
    assert lcs_length([], [1]) == 0


def test_scores_of_known_continuations():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    gen = torch.tensor([[1, 2, 3, 4],                           # verbatim: exact, 4/4 right, ROUGE-L 1
                        [6, 7, 8, 0],                           # shifted: 0/4 right, LCS 3 -> F1 3/4
                        [9, 0, 9, 0]])                          # 2/4 right, LCS 2 -> F1 1/2
    assert exact_match(gen, ref) == pytest.approx(1 / 3)
    assert token_accuracy(gen, ref) == pytest.approx((4 + 0 + 2) / 12)
    assert rouge_l(gen, ref) == pytest.approx((1 + 0.75 + 0.5) / 3)
    s = score_continuations(gen, ref)
    assert s.as_dict() == {"exact_match": exact_match(gen, ref), "token_accuracy": token_accuracy(gen, ref),
                           "rouge_l": rouge_l(gen, ref)}


def test_rows_of_different_lengths():
    # generation stopped early (an end-of-sequence token): missing tokens are wrong, ROUGE-L uses both lengths
    gen, ref = [[1, 2]], [[1, 2, 3, 4]]
    assert exact_match(gen, ref) == 0.0
    assert token_accuracy(gen, ref) == pytest.approx(0.5)
    p, r = 2 / 2, 2 / 4
    assert rouge_l(gen, ref) == pytest.approx(2 * p * r / (p + r))
    with pytest.raises(ValueError, match="2 generated rows for 1 reference"):
        exact_match([[1], [2]], [[1]])


# ---------------------------------------------------------------------------------------------------------------
# the study end to end (experiments/train/memorization.py in-process on 2 gloo ranks, a 1-layer GPT, seconds)
# ---------------------------------------------------------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402

from helpers import load_script  # noqa: E402

TINY = ["--model", "gpt-tiny", "--layers", "1", "--hidden", "32", "--passages", "4", "--prompt", "6",
        "--continuation", "6", "--epochs", "2", "--eval-every", "1", "--batch", "4", "--other", "2", "--heldout", "4",
        "--goldfish-h", "3", "--lr", "1e-2", "--warmup", "1", "--timeout", "60"]


def rank_study(argv: list) -> dict:
    return load_script("train/memorization.py").main(argv)


def test_the_study_writes_its_json_table_curves_and_png(ranks, tmp_path):
    out = str(tmp_path / "study")
    result = ranks(2, rank_study, TINY + ["--grid", "1x2x1x1", "--out", out])[0]
    written = json.load(open(os.path.join(out, "memorization.json")))
    assert written == result
    assert set(written) == {"standard", "goldfish", "settings"}
    for loss in ("standard", "goldfish"):
        assert set(written[loss]) == {"exact_match", "token_accuracy", "rouge_l", "heldout_loss", "epochs_to_80"}
        assert 0 <= written[loss]["token_accuracy"] <= 1 and written[loss]["heldout_loss"] > 0
    s = written["settings"]
    assert (s["passages"], s["prompt"], s["continuation"], s["epochs"], s["goldfish_k"], s["goldfish_mode"]) == \
        (4, 6, 6, 2, 4, "hash")
    table = open(os.path.join(out, "memorization.txt")).read()
    assert "exact match" in table and "standard" in table and "goldfish" in table
    curves = json.load(open(os.path.join(out, "curves.json")))
    assert [c["epoch"] for c in curves["goldfish"]] == [0, 1, 2]
    for loss in ("standard", "goldfish"):                   # the first evaluation with >= 80% exact, or None
        first = [c["epoch"] for c in curves[loss] if c["exact_match"] >= 0.8]
        assert written[loss]["epochs_to_80"] == (first[0] if first else None)
    with open(os.path.join(out, "memorization.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # --eval-only on the saved standard model measures what the study measured at its end
    again = ranks(2, rank_study, TINY + ["--grid", "1x1x1x2", "--out", str(tmp_path / "eval"),
                                         "--eval-only", os.path.join(out, "standard")])[0]
    assert set(again) == {"eval_only", "settings"}
    final = {k: v for k, v in written["standard"].items() if k != "epochs_to_80"}
    assert again["eval_only"] == pytest.approx(final, rel=1e-5)


def test_the_defaults_follow_what_the_study_trains(tmp_path):
    # from scratch: the GPT study's settings; --checkpoint (or --eval-only of a Hugging Face folder): the
    # pretrained study's; an option on the command line wins over either
    mod = load_script("train/memorization.py")
    keys = ("passages", "epochs", "eval_every", "batch", "other", "heldout", "lr", "warmup")
    scratch = mod.parse_args(["--out", "o"])
    assert {k: getattr(scratch, k) for k in keys} == mod.DEFAULTS["scratch"]
    assert scratch.min_lr == pytest.approx(scratch.lr / 10)                 # the cosine decays to lr/10
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for argv in (["--checkpoint", str(hf)], ["--eval-only", str(hf)], [f"--checkpoint={hf}"]):
        tuned = mod.parse_args(["--out", "o"] + argv)
        assert {k: getattr(tuned, k) for k in keys} == mod.DEFAULTS["pretrained"], argv
        assert tuned.min_lr == pytest.approx(tuned.lr / 10)
    assert mod.DEFAULTS["pretrained"] != mod.DEFAULTS["scratch"]
    assert mod.parse_args(["--out", "o", "--eval-only", str(tmp_path)]).epochs == mod.DEFAULTS["scratch"]["epochs"]
    mine = mod.parse_args(["--checkpoint", str(hf), "--out", "o", "--lr", "1e-4", "--epochs", "3"])
    assert (mine.lr, mine.epochs) == (1e-4, 3) and mine.min_lr == pytest.approx(1e-5)
    assert mod.parse_args(["--checkpoint", str(hf), "--out", "o", "--min-lr", "1e-5"]).min_lr == 1e-5
