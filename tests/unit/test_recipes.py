"""configs/*.yaml training recipes -> fairseq-train / fairseq-generate command lines, and scripts/train.sh."""
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, env
from qknorm_pipeline import recipes

# the papers' pairs and the demo must be there; a user's own pair (a new configs/*.yaml) may be too
PAPER_PAIRS = ["ar-en", "demo", "en-he", "en-vi", "gl-en", "sk-en"]
PAIRS = sorted(recipes.available_pairs())
SYSTEMS = ["postnorm", "prenorm", "fixnorm", "scalenorm", "rmsnorm", "qknorm", "lpqknorm", "dnas", "hnas"]
SCHEDULES = ["valdecay", "nowarmup", "invsqrtdecay", "valdecay_2xlr", "invsqrtdecay_2xlr"]
RECIPE_SECTIONS = ("model", "train", "schedules", "decode", "systems")


def flag(args, name):
    return args[args.index(name) + 1]


def test_every_pair_has_the_recipe_sections():
    assert set(PAPER_PAIRS) <= set(PAIRS), f"missing recipes: {sorted(set(PAPER_PAIRS) - set(PAIRS))}"
    for pair in PAIRS:
        cfg = recipes.load(pair)
        for section in RECIPE_SECTIONS:
            assert isinstance(cfg.get(section), dict), f"{pair}: no {section}: section"
        assert list(cfg["systems"]) == SYSTEMS
        assert [k for k in cfg["schedules"] if k != "default"] == SCHEDULES


def test_every_recipe_value_has_a_source_comment():
    for pair in PAIRS + ["base"]:
        lines = open(os.path.join(recipes.CONFIG_DIR, f"{pair}.yaml")).read().splitlines()
        section = None
        for line in lines:
            m = re.match(r"^(\w+):", line)
            if m:
                section = m.group(1)
                continue
            if section in RECIPE_SECTIONS and re.match(r"^\s+\S+:\s*\S", line):
                assert "#" in line, f"configs/{pair}.yaml: no source comment on {line.strip()!r}"


def _parse(args):
    """Parses a fairseq-train argument list with fairseq's own parser (raises on a bad flag)."""
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=args)


@pytest.mark.parametrize("pair", PAIRS)
def test_train_args_parse_with_fairseq_for_every_system_and_schedule(pair):
    cfg = recipes.load(pair)
    combos = [(s, None) for s in SYSTEMS] + [("scalenorm", sch) for sch in SCHEDULES]
    for system, schedule in combos:
        args = recipes.train_args(cfg, system, schedule, save_dir="/tmp/x")
        ns = _parse(args)
        assert ns.arch == cfg["systems"][system]["arch"] and ns.task == "translation_qk"
        assert ns.encoder_layers == cfg["model"]["encoder_layers"] and ns.dropout == cfg["model"]["dropout"]
        assert ns.max_update == cfg["train"]["epoch_updates"] * cfg["train"]["max_epochs"]
        assert ns.validate_interval_updates == ns.save_interval_updates == cfg["train"]["epoch_updates"]
        assert ns.patience == -1  # the original code has no dev-BLEU early stopping
        assert ns.length_norm == "gnmt" and ns.gnmt_alpha == 0.6 and ns.maximize_best_checkpoint_metric
        assert ns.beam_search == "twt"
        assert ns.best_checkpoint_metric == "bleu" and ns.eval_bleu


def test_twt_values_reach_the_command_line():
    gl = recipes.load("gl-en")
    args = recipes.train_args(gl, "scalenorm")
    ns = _parse(args)
    assert (ns.encoder_layers, ns.encoder_attention_heads, ns.dropout) == (4, 4, 0.4)  # TwT Table 1
    assert ns.max_update == 100 * 1000 and ns.patience == -1
    assert ns.lr_scheduler == "val_decay" and ns.warmup_updates == 8000
    assert ns.lr[0] == pytest.approx(1 / math.sqrt(512 * 8000), rel=1e-5)  # ~4.94e-4
    assert (ns.decay_factor, ns.decay_patience, ns.decay_stop_lr) == (0.8, 3, 5e-5)  # TwT code base()
    assert ns.stop_min_lr < 0  # fairseq's own check would stop a warmup from 0 at once
    assert (ns.clip_norm, ns.max_tokens, ns.weight_decay, ns.label_smoothing) == (1.0, 4096, 0.0, 0.1)

    nowarm = _parse(recipes.train_args(gl, "scalenorm", "nowarmup"))
    assert nowarm.warmup_updates == 0 and nowarm.lr[0] == 3e-4 and nowarm.lr_scheduler == "val_decay"
    inv2 = _parse(recipes.train_args(gl, "scalenorm", "invsqrtdecay_2xlr"))
    assert inv2.lr_scheduler == "inverse_sqrt" and inv2.lr[0] == pytest.approx(2 / math.sqrt(512 * 8000), rel=1e-5)

    en_vi = _parse(recipes.train_args(recipes.load("en-vi"), "qknorm", paper_qknorm_length=True))
    assert en_vi.qknorm_length == 72 and en_vi.encoder_layers == 6 and en_vi.validate_interval_updates == 1500


@pytest.mark.parametrize("pair, qknorm_stop", [("gl-en", 5e-5), ("sk-en", 1e-5), ("en-vi", 1e-5), ("en-he", 1e-5),
                                               ("ar-en", 1e-5)])
def test_stopping_rules_follow_each_papers_code(pair, qknorm_stop):
    cfg = recipes.load(pair)
    qk = _parse(recipes.train_args(cfg, "qknorm"))
    assert (qk.decay_stop_lr, qk.patience) == (qknorm_stop, -1)
    twt = _parse(recipes.train_args(cfg, "postnorm"))
    assert (twt.decay_stop_lr, twt.patience) == (5e-5, -1)
    text = _parse(recipes.train_args(cfg, "postnorm", stopping_rule="twt_paper"))
    assert (text.decay_stop_lr, text.patience) == (1e-6, 50 if pair == "gl-en" else 20)


def test_decoding_uses_twt_search_for_test_and_dev():
    cfg = recipes.load("en-vi")
    gen = recipes.generate_args(cfg)
    assert gen[gen.index("--beam-search") + 1] == "twt" and gen[gen.index("--length-norm") + 1] == "gnmt"
    assert _parse(recipes.train_args(cfg, "qknorm")).beam_search == "twt"  # --eval-bleu's generator


def test_errors_name_the_problem():
    gl = recipes.load("gl-en")
    with pytest.raises(SystemExit, match="no system 'nosuch'; known: postnorm"):
        recipes.train_args(gl, "nosuch")
    with pytest.raises(SystemExit, match="no schedule 'fast'; known: valdecay"):
        recipes.train_args(gl, "scalenorm", "fast")
    with pytest.raises(SystemExit, match="does not use QKNorm"):
        recipes.train_args(gl, "scalenorm", paper_qknorm_length=True)
    with pytest.raises(SystemExit, match="has no model.qknorm_length"):
        recipes.train_args(recipes.load("demo"), "qknorm", paper_qknorm_length=True)


def test_generate_args_parse_with_fairseq():
    from fairseq import options

    args = recipes.generate_args(recipes.load("en-vi"))
    parser = options.get_generation_parser()
    ns = options.parse_args_and_arch(parser, input_args=["data-bin/en-vi", "--path", "x.pt", *args])
    assert (ns.beam, ns.max_len_a, ns.max_len_b, ns.length_norm, ns.gnmt_alpha) == (4, 1, 50, "gnmt", 0.6)
    assert ns.lenpen == 1 and not ns.unnormalized  # GNMT replaces fairseq's --lenpen


def _cli(*argv):
    # as scripts/train.sh runs it (`python -m` skips fairseq's import: qknorm_fairseq/__init__.py)
    return subprocess.run([sys.executable, "-m", "qknorm_pipeline.recipes", *argv],
                          capture_output=True, text=True, cwd=REPO, env=env())


def test_cli_get_still_works_and_train_args_is_one_shell_line():
    assert _cli("get", "gl-en", "data.bpe_merges").stdout.strip() == "3000"
    out = _cli("train-args", "sk-en", "qknorm", "--schedule", "nowarmup").stdout.strip().splitlines()
    assert len(out) == 1
    args = shlex.split(out[0])
    assert flag(args, "--arch") == "transformer_qknorm" and flag(args, "--lr") == "0.0003"
    assert flag(args, "--eval-bleu-args") == '{"beam": 4, "max_len_a": 1, "max_len_b": 50}'


def _train_sh(*argv, **extra_env):
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "train.sh"), *argv], capture_output=True,
                          text=True, env=env(**extra_env))


def test_train_sh_dry_run_passes_extra_flags_and_picks_the_device(tmp_path):
    p = _train_sh("--dry-run", "gl-en", "qknorm", "--max-update", "7", CKPT_DIR=str(tmp_path / "ck"))
    assert p.returncode == 0, p.stderr
    args = shlex.split(p.stdout)
    assert args[:3] == ["python", "-m", "qknorm_pipeline.fairseq_train"] and args[-2:] == ["--max-update", "7"]  # extra last: they win
    assert flag(args, "--save-dir") == str(tmp_path / "ck" / "gl-en" / "qknorm")
    import torch

    assert ("--cpu" in args) != torch.cuda.is_available()
    # the printed command is what fairseq parses
    ns = _parse(args[3:])
    assert ns.max_update == 7 and ns.arch == "transformer_qknorm"
    # the recipe of the issue: the QKNorm code's stopping and the original beam search
    assert (ns.decay_stop_lr, ns.patience, ns.beam_search) == (5e-5, -1, "twt")


def test_train_sh_refuses_bad_input():
    p = _train_sh("--dry-run", "gl-en", "nosuch")
    assert p.returncode != 0 and "no system 'nosuch'" in p.stderr
    p = _train_sh("--precision", "fp8", "gl-en", "qknorm")
    assert p.returncode != 0 and "--precision must be fp32, fp16 or bf16" in p.stderr


def test_train_sh_trains_and_writes_the_log(tiny_data, tmp_path):
    # the demo recipe (languages src/tgt) on the tiny corpus, cut short with pass-through flags
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    roots = dict(DATA_BIN=str(tmp_path / "data-bin"), CKPT_DIR=str(tmp_path / "ck"), LOG_DIR=str(tmp_path / "logs"))
    extra = ["--max-update", "4", "--validate-interval-updates", "2", "--num-workers", "0", "--max-tokens", "512",
             "--log-interval", "1", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 5}']
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    save, log = tmp_path / "ck" / "demo" / "postnorm", tmp_path / "logs" / "demo" / "postnorm" / "train.log"
    assert (save / "checkpoint_best.pt").exists() and (save / "checkpoint_last.pt").exists()
    assert f"log {log}, checkpoints {save}/" in p.stderr
    # the progress display without a terminal: a line per validation, then the summary
    assert re.search(r"demo/postnorm 2/4 updates  loss [\d.]+  dev BLEU [\d.]+  lr ", p.stderr), p.stderr
    assert re.search(r"demo/postnorm: 4 updates in \d+:\d\d, loss [\d.]+, best dev BLEU", p.stderr), p.stderr
    assert "| INFO |" not in p.stderr + p.stdout  # fairseq's own lines are in the log only
    text = log.read_text()
    assert re.search(r"\| INFO \| train_inner \| \{.*\"num_updates\": \"4\"", text)
    valid = re.findall(r"\| INFO \| valid \| (\{.*\})", text)
    assert len(valid) == 2 and all('"valid_bleu"' in v for v in valid)  # dev BLEU every 2 updates
    # the same command again is skipped (resuming is fairseq's, from checkpoint_last.pt: test_lr_scheduler)
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0 and "already trained with this command" in p.stderr


def test_every_pair_gives_the_same_commands_as_before_the_base_recipe(tmp_path, monkeypatch, capsys):
    """tests/data/recipes_golden.json: the CLI outputs captured from the six full configs before
    they became base.yaml + per-pair differences; every system, schedule, stopping rule and key."""
    from qknorm_pipeline import corpora

    monkeypatch.setenv("DATA_BIN", str(tmp_path))  # no prepared data: the recipes alone
    golden = json.loads(open(os.path.join(REPO, "tests", "data", "recipes_golden.json")).read())
    assert sorted(golden) == PAPER_PAIRS
    checked = 0
    for pair, outputs in golden.items():
        for call, expected in outputs.items():
            words = call.split()
            if words[0] == "corpora":
                corpora.main(["config", "--pair", pair])
            else:
                recipes.main([words[0], pair, *words[1:]])
            got = capsys.readouterr().out.strip().replace(recipes.USER_DIR, "USER_DIR")
            assert got == expected, f"{call} {pair}"
            checked += 1
    assert checked == 209
