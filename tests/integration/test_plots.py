"""Each plot command draws the numbers of a real tiny training log or checkpoint, and writes a PNG."""
import json
import os
import subprocess
import sys

import matplotlib.image
import pytest
import torch

from qknorm_pipeline import plots

from helpers import environment, log_line, write_train_log


def _png(path):
    """A readable image with something drawn on it (not one flat colour)."""
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert img.reshape(-1, img.shape[-1]).std(0).max() > 0.05


@pytest.fixture
def drawn(monkeypatch):
    """The (label, x, y) of every line the next plot draws."""
    lines = []
    save = plots._save

    def capture(fig, out):
        for ax in fig.axes:
            lines.extend((ln.get_label(), list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines())
        return save(fig, out)
    monkeypatch.setattr(plots, "_save", capture)
    return lines


def _json_records(log, key):
    """The JSON records of fairseq's --log-file that hold KEY, read by hand; fairseq logs the last
    validation of a run twice (at the epoch's end and at the run's): one per update count."""
    by_update = {}
    for line in open(log):
        if line.startswith('{"'):
            r = json.loads(line)
            if key in r:
                by_update.setdefault(r.get("valid_num_updates", r.get("num_updates")), r)
    return list(by_update.values())


def test_parse_log_real(tiny_pipeline):
    log = plots.parse_log(os.path.join(tiny_pipeline, "logs", "demo", "postnorm", "train.log"))
    assert [r["epoch"] for r in log["valid"]] == [1.0, 2.0]  # fairseq's duplicate lines removed
    assert all("gnorm" in r for r in log["train_inner"]) and log["train_inner"]


@pytest.mark.parametrize("cmd, key", [("dev-bleu", "valid_bleu"), ("grad-norm", "gnorm")])
def test_log_plots_draw_the_logged_numbers(tiny_pipeline, tmp_path, drawn, cmd, key):
    out = str(tmp_path / f"{cmd}.png")
    assert plots.main([cmd, "--pair", "demo", "--log-dir", os.path.join(tiny_pipeline, "logs"), "--out", out]) == 0
    _png(out)
    assert [label for label, _, _ in drawn] == ["postnorm", "prenorm"]
    for label, _, y in drawn:
        logged = _json_records(tiny_pipeline / "logs" / "demo" / label / "train.log", key)
        assert y == pytest.approx([float(r[key]) for r in logged]) and len(y) >= 2


def test_scales_discovers_parameters(tiny_pipeline, tmp_path):
    # a stock checkpoint has none; names of qknorm_fairseq's parameters are found and ordered
    real = os.path.join(tiny_pipeline, "checkpoints", "demo", "postnorm", "checkpoint_best.pt")
    sd = torch.load(real, map_location="cpu", weights_only=False)["model"]
    assert plots.learned_scalars(sd) == {"scalenorm": [], "qknorm": {}, "hnas": {}}
    fake = dict(sd)
    fake.update({"encoder.layers.1.self_attn_layer_norm.g": torch.tensor(3.0),
                 "encoder.layers.0.final_layer_norm.g": torch.tensor(2.0),
                 "encoder.layer_norm.g": torch.tensor(5.0),
                 "decoder.layers.0.encoder_attn.qk_scale": torch.tensor(12.5),
                 "encoder.layers.0.self_attn.hnas_logit": torch.tensor(0.0)})
    s = plots.learned_scalars(fake)
    assert [v for _, v in s["scalenorm"]] == [2.0, 3.0, 5.0]
    assert s["qknorm"] == {"decoder encoder_attn": [(0, 12.5)]}
    assert s["hnas"] == {"encoder self_attn": [(0, 0.5)]}
    path = str(tmp_path / "fake.pt")
    torch.save({"model": fake}, path)
    out = str(tmp_path / "scales.png")
    assert plots.main(["scales", "--ckpt", f"fake={path}", "--ckpt", f"stock={real}", "--out", out]) == 0
    _png(out)


def test_attention_heatmap(tiny_pipeline, tmp_path):
    out = str(tmp_path / "attn.png")
    ck = os.path.join(tiny_pipeline, "checkpoints", "demo")
    tokens, w = plots.encoder_attention(os.path.join(ck, "prenorm", "checkpoint_best.pt"),
                                        os.path.join(tiny_pipeline, "data-bin", "demo"), index=3)
    assert w.shape == (2, len(tokens), len(tokens)) and tokens[-1] == "</s>"
    assert abs(w.sum(-1) - 1).max() < 1e-5  # per-head rows are distributions, not head averages
    p = subprocess.run([sys.executable, "-m", "qknorm_pipeline.plots", "attention", "--ckpt",
                        f"postnorm={os.path.join(ck, 'postnorm', 'checkpoint_best.pt')}", "--ckpt",
                        f"prenorm={os.path.join(ck, 'prenorm', 'checkpoint_best.pt')}", "--data-bin",
                        os.path.join(tiny_pipeline, "data-bin", "demo"), "--index", "2", "--heads", "0", "1",
                        "--out", out],
                       env=environment(tiny_pipeline), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    _png(out)


def test_plot_errors(tmp_path, capsys):
    assert plots.main(["dev-bleu", "--log", f"x={tmp_path / 'none.log'}", "--out", str(tmp_path / "a.png")]) == 1
    assert not (tmp_path / "a.png").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.log" in err[0] and "error" in err[0]
    # a checkpoint cut short (zip) or not a checkpoint at all (pickle of a list): one line, no picture
    import torch

    torch.save({"model": {"w": torch.zeros(3)}}, tmp_path / "whole.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:200])
    torch.save([1, 2], tmp_path / "list.pt")
    for name, problem in (("cut.pt", "not a readable checkpoint (RuntimeError: "), ("list.pt", "not a fairseq checkpoint")):
        assert plots.main(["scales", "--ckpt", f"x={tmp_path / name}", "--out", str(tmp_path / "s.png")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{tmp_path / name}: {problem}" in err[0], err
    assert not (tmp_path / "s.png").exists()


def _valid_only_log(path):
    """A run shorter than fairseq's --log-interval: validations, no train_inner record."""
    return write_train_log(path, [log_line("valid", {"valid_loss": 5.0, "valid_bleu": b, "valid_num_updates": u})
                                  for u, b in ((20, 1.5), (40, 2.5))])


def test_a_plot_with_nothing_to_draw_says_so_in_one_line_and_succeeds(tmp_path, capsys):
    log = _valid_only_log(tmp_path / "train.log")
    out = tmp_path / "grad_norm.png"
    assert plots.main(["grad-norm", "--log", f"short={log}", "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no train_inner records with gnorm" in err[0] and not out.exists()


def test_reproduce_draws_what_it_can_and_never_fails_on_a_plot(tmp_path, capsys):
    """reproduce.sh's last stage after a 40-update run: the dev-BLEU curve is drawn, the gradient-norm
    plot has nothing to draw, the scales plot finds no checkpoint; each says so in one line."""
    from qknorm_pipeline import reproduce
    from qknorm_pipeline.paths import Folders

    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    _valid_only_log(tmp_path / "logs" / "xx-yy" / "postnorm" / "train.log")
    (tmp_path / "results" / "xx-yy").mkdir(parents=True)
    drawn = reproduce.draw_plots("xx-yy", ["postnorm"], where)
    assert drawn == ["dev_bleu"] and (tmp_path / "results" / "xx-yy" / "dev_bleu.png").exists()
    err = capsys.readouterr().err
    assert "no train_inner records with gnorm" in err and "plot scales failed" in err
    assert "Traceback" not in err
