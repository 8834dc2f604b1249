"""Several training seeds per system: the table's mean, spread and per-seed scores (tests/system
runs `reproduce.sh --seeds 2` on the demo)."""
import random
import statistics

import pytest
from scipy import stats as scipy_stats

from qknorm_pipeline.scoring import bleu, compare
from qknorm_pipeline.scoring.significance import sentence_variance

from helpers import naive_bleu, write_result


def _runs(tmp_path, names):
    rng = random.Random(4)
    vocab = [f"w{i}" for i in range(30)]
    refs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(8, 14))) for _ in range(80)]
    ref = tmp_path / "ref.en"
    ref.write_text("".join(r + "\n" for r in refs))
    hyps = {}
    for name, noise in names.items():
        hyps[name] = [" ".join(w if rng.random() > noise else rng.choice(vocab) for w in r.split()) for r in refs]
        write_result(tmp_path / "results" / "demo" / name, hyps[name],
                     {"reference": [str(ref)], "metric": "multi_bleu", "detok": "none", "systems": {}})
    return refs, hyps


def test_table_over_seeds_has_mean_sd_and_every_seed(tmp_path):
    refs, hyps = _runs(tmp_path, {"postnorm": 0.4, "postnorm_seed2": 0.45, "postnorm_seed3": 0.35,
                                  "qknorm": 0.2, "qknorm_seed2": 0.25})
    table = compare.build("demo", str(tmp_path / "results"), n_samples=300)
    rows = {r["system"]: r for r in table["rows"]}
    assert set(rows) == {"postnorm", "qknorm"} and table["baseline"] == "postnorm"
    assert rows["postnorm"]["seeds"] == [1, 2, 3] and rows["qknorm"]["seeds"] == [1, 2]
    for system, runs in {"postnorm": ["postnorm", "postnorm_seed2", "postnorm_seed3"],
                         "qknorm": ["qknorm", "qknorm_seed2"]}.items():
        per_seed = [naive_bleu(hyps[r], refs) for r in runs]
        assert [rows[system]["per_seed"][k]["multi_bleu"] for k in rows[system]["seeds"]] == \
            pytest.approx(per_seed, abs=1e-3)
        assert rows[system]["multi_bleu"] == pytest.approx(statistics.mean(per_seed), abs=1e-3)
        assert rows[system]["multi_bleu_sd"] == pytest.approx(statistics.stdev(per_seed), abs=1e-3)
    assert rows["qknorm"]["delta"] == pytest.approx(rows["qknorm"]["multi_bleu"] - rows["postnorm"]["multi_bleu"],
                                                    abs=1e-3)
    # two seeds against three that spread by ~5 BLEU: Welch's t is significant at 0.05, not far below
    assert rows["qknorm"]["p_value"] < 0.05 and rows["postnorm"]["p_value"] is None
    md = compare.to_markdown(table)
    q = rows["qknorm"]
    assert (f"| qknorm | {q['multi_bleu']:.2f} ± {q['multi_bleu_sd']:.2f} |" in md
            and "Welch's t over the seeds' scores" in md and "The family of tests: qknorm, each against postnorm (1)" in md)
    assert " ".join(f"{q['per_seed'][k]['multi_bleu']:.2f}" for k in (1, 2)) in md


def test_two_runs_claiming_one_seed_are_refused(tmp_path):
    _runs(tmp_path, {"qknorm": 0.2, "qknorm_seed1": 0.3})
    with pytest.raises(compare.ScoringError, match="both seed 1 of qknorm"):
        compare.build("demo", str(tmp_path / "results"))


def test_one_seed_system_is_tested_with_the_pooled_seed_variance(tmp_path):
    """Welch's t with the test set's variance added (to the variance, not to the seed terms' degrees of
    freedom); the one-seed system's seed variance pooled over
    the others (sum of (k - 1) s^2 over sum of (k - 1)); Holm over the two tests, by hand."""
    refs, hyps = _runs(tmp_path, {"postnorm": 0.4, "postnorm_seed2": 0.45, "postnorm_seed3": 0.35,
                                  "qknorm": 0.2, "qknorm_seed2": 0.25, "fixnorm": 0.3})
    table = compare.build("demo", str(tmp_path / "results"), n_samples=300)
    rows = {r["system"]: r for r in table["rows"]}
    post = [naive_bleu(hyps[r], refs) for r in ("postnorm", "postnorm_seed2", "postnorm_seed3")]
    qk = [naive_bleu(hyps[r], refs) for r in ("qknorm", "qknorm_seed2")]
    pooled = (2 * statistics.variance(post) + 1 * statistics.variance(qk)) / 3
    assert table["pooled_sd"] == pytest.approx([pooled ** 0.5, 3], rel=1e-4)
    stats = {r: bleu.multi_bleu(hyps[r], [refs]).stats for r in hyps}
    sentences = sentence_variance([stats["fixnorm"]], [stats[r] for r in ("postnorm", "postnorm_seed2", "postnorm_seed3")],
                                  n_samples=300)
    terms = [(pooled, 3), (statistics.variance(post) / 3, 2)]
    var = sum(v for v, _ in terms) + sentences
    df = sum(v for v, _ in terms) ** 2 / sum(v ** 2 / d for v, d in terms)
    t = (naive_bleu(hyps["fixnorm"], refs) - statistics.mean(post)) / var ** 0.5
    assert rows["fixnorm"]["p_value"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-3)
    p_fix, p_qk = rows["fixnorm"]["p_value"], rows["qknorm"]["p_value"]
    assert p_qk < p_fix
    assert rows["qknorm"]["p_holm"] == pytest.approx(2 * p_qk)
    assert rows["fixnorm"]["p_holm"] == pytest.approx(max(2 * p_qk, p_fix))
