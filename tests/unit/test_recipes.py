"""configs/*.yaml training recipes -> fairseq-train / fairseq-generate command lines
(tests/integration/test_train.py runs scripts/train.sh)."""
import json
import math
import os
import re
import shlex

import pytest

from qknorm_pipeline import recipes
from qknorm_pipeline.cli import UsageError, UserError

from helpers import REPO, module

# the papers' pairs and the demo must be there; a user's own pair (a new configs/*.yaml) may be too
PAPER_PAIRS = ["ar-en", "demo", "en-he", "en-vi", "gl-en", "sk-en"]
PAIRS = sorted(recipes.available_pairs())
SYSTEMS = ["postnorm", "prenorm", "fixnorm", "scalenorm", "rmsnorm", "qknorm", "lpqknorm", "dnas", "hnas"]
SCHEDULES = ["valdecay", "nowarmup", "invsqrtdecay", "valdecay_2xlr", "invsqrtdecay_2xlr"]
RECIPE_SECTIONS = ("model", "train", "schedules", "stopping", "decode", "systems", "cpu", "gpu")


def flag(args, name):
    return args[args.index(name) + 1]


def test_every_pair_has_the_recipe_sections():
    assert set(PAPER_PAIRS) <= set(PAIRS), f"missing recipes: {sorted(set(PAPER_PAIRS) - set(PAIRS))}"
    for pair in PAIRS:
        cfg = recipes.load(pair)
        assert list(cfg.systems) == SYSTEMS
        assert list(cfg.schedules) == SCHEDULES and cfg.train.schedule in SCHEDULES
        assert {s.stopping for s in cfg.systems.values()} <= set(cfg.stopping)


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
        assert ns.arch == cfg.systems[system].arch and ns.task == "translation_qk"
        assert ns.encoder_layers == cfg.model.encoder_layers and ns.dropout == cfg.model.dropout
        assert ns.max_update == cfg.train.epoch_updates * cfg.train.max_epochs
        assert ns.validate_interval_updates == ns.save_interval_updates == cfg.train.epoch_updates
        rule = cfg.stopping[cfg.systems[system].stopping]
        assert (ns.patience, ns.decay_stop_lr if ns.lr_scheduler == "val_decay" else rule.stop_lr) == (
            rule.patience, rule.stop_lr)
        assert ns.positions == ("qknorm" if system in ("qknorm", "lpqknorm") else "fairseq")
        assert ns.length_norm == "gnmt" and ns.gnmt_alpha == 0.6 and ns.maximize_best_checkpoint_metric
        assert ns.beam_search == "twt"
        assert ns.best_checkpoint_metric == "bleu" and ns.eval_bleu


def test_twt_values_reach_the_command_line():
    gl = recipes.load("gl-en")
    args = recipes.train_args(gl, "scalenorm")
    ns = _parse(args)
    assert (ns.encoder_layers, ns.encoder_attention_heads, ns.dropout) == (4, 4, 0.4)  # TwT Table 1
    assert ns.max_update == 100 * 1000 and ns.patience == 50  # TwT Appendix A: 50 validations for gl->en
    assert ns.lr_scheduler == "val_decay" and ns.warmup_updates == 8000
    assert ns.lr[0] == pytest.approx(1 / math.sqrt(512 * 8000), rel=1e-5)  # ~4.94e-4
    assert recipes.peak_lr(1, 512, 8000) == pytest.approx(4.941e-4, rel=1e-3)
    assert (ns.decay_factor, ns.decay_patience, ns.decay_stop_lr) == (0.8, 3, 1e-6)  # TwT Sec. 3.3, Appendix A
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
def test_stopping_rules_follow_the_procedure_of_each_published_table(pair, qknorm_stop):
    """QKNorm rows: the QKNorm code's rule. TwT rows: TwT Appendix A, the procedure of TwT Table 3;
    the TwT repository's code (no early stopping, stop at 5e-5, NOWARMUP) one flag away."""
    cfg = recipes.load(pair)
    qk = _parse(recipes.train_args(cfg, "qknorm"))
    assert (qk.decay_stop_lr, qk.patience, qk.warmup_updates) == (qknorm_stop, -1, 8000)
    paper = _parse(recipes.train_args(cfg, "postnorm"))
    assert (paper.decay_stop_lr, paper.patience) == (1e-6, 50 if pair == "gl-en" else 20)
    assert (paper.warmup_updates, paper.lr[0]) == (8000, pytest.approx(recipes.peak_lr(1, cfg.model.embed_dim, 8000)))
    code = _parse(recipes.train_args(cfg, "postnorm", stopping_rule="twt_code"))
    assert (code.decay_stop_lr, code.patience, code.warmup_updates, code.lr[0]) == (5e-5, -1, 0, 3e-4)
    with pytest.raises(recipes.RecipeError, match="no stopping rule 'nope'; known: twt_paper, twt_code, qknorm"):
        recipes.train_args(cfg, "postnorm", stopping_rule="nope")


def test_cpu_pins_reach_the_environment_and_the_user_wins():
    demo = recipes.load("demo")
    env = recipes.cpu_env(demo, {"PATH": "/bin"})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["ATEN_CPU_CAPABILITY"], env["MKL_CBWR"],
            env["ONEDNN_MAX_CPU_ISA"]) == ("2", "2", "avx2", "AVX2", "AVX2")
    assert recipes.cpu_env(demo, {"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"
    assert recipes.cpu_env(recipes.load("gl-en"), {"PATH": "/bin"}) == {"PATH": "/bin"}  # no pins: torch's defaults


def test_decoding_uses_twt_search_for_test_and_dev():
    cfg = recipes.load("en-vi")
    gen = recipes.generate_args(cfg)
    assert gen[gen.index("--beam-search") + 1] == "twt" and gen[gen.index("--length-norm") + 1] == "gnmt"
    assert _parse(recipes.train_args(cfg, "qknorm")).beam_search == "twt"  # --eval-bleu's generator


def test_errors_name_the_problem(tmp_path, monkeypatch):
    gl = recipes.load("gl-en")
    with pytest.raises(recipes.RecipeError, match="no system 'nosuch'; known: postnorm"):
        recipes.train_args(gl, "nosuch")
    with pytest.raises(recipes.RecipeError, match="no schedule 'fast'; known: valdecay"):
        recipes.train_args(gl, "scalenorm", "fast")
    with pytest.raises(recipes.RecipeError, match="has no model.qknorm_length"):
        recipes.train_args(recipes.load("demo"), "qknorm", paper_qknorm_length=True)
    with pytest.raises(recipes.RecipeError, match="unknown pair 'xx-yy'.*bash scripts/prepare.sh --pair xx-yy"):
        recipes.load("xx-yy", data_bin=str(tmp_path))
    (tmp_path / "xx-yy").mkdir()
    (tmp_path / "xx-yy" / "stats.json").write_text('{"lines": ')  # cut short
    # the stage that wrote it is redone when its folder is gone; a folder not in $DATA_BIN may be a study's
    with pytest.raises(UserError, match=r"xx-yy/stats.json: not valid JSON \(.*\): delete .*xx-yy and prepare it again "
                                        r"\(bash scripts/prepare.sh --pair xx-yy; a study's data: its study.sh command\)$"):
        recipes.load("xx-yy", data_bin=str(tmp_path / "xx-yy"))
    monkeypatch.setenv("DATA_BIN", str(tmp_path))
    with pytest.raises(UserError, match=r": delete .*xx-yy and prepare it again \(bash scripts/prepare.sh --pair xx-yy\)$"):
        recipes.load("xx-yy", data_bin=str(tmp_path / "xx-yy"))
    monkeypatch.delenv("DATA_BIN")
    # a misspelt key in a config is named with its file
    monkeypatch.setattr(recipes, "CONFIG_DIR", str(tmp_path))
    (tmp_path / "base.yaml").write_text(open(os.path.join(REPO, "configs", "base.yaml")).read())
    (tmp_path / "xx-yy.yaml").write_text("src: xx\ntgt: yy\nmodel:\n  embed_dims: 256\n")
    with pytest.raises(recipes.RecipeError, match=r"configs/xx-yy.yaml over configs/base.yaml: model.embed_dims"):
        recipes.load("xx-yy")
    # a choice outside its enum: the field, the value and the choices, on one line
    for text, field, bad, choices in (("decode:\n  length_norm: gnmx\n", "decode.length_norm", "gnmx", "fairseq, gnmt"),
                                      ("decode:\n  beam_search: beam\n", "decode.beam_search", "beam", "fairseq, twt"),
                                      ("systems:\n  qknorm: {positions: sin}\n", "systems.qknorm.positions", "sin",
                                       "fairseq, twt, qknorm")):
        (tmp_path / "xx-yy.yaml").write_text("src: xx\ntgt: yy\n" + text)
        with pytest.raises(recipes.RecipeError) as e:
            recipes.load("xx-yy")
        assert "\n" not in str(e.value) and f"{field}: Invalid value '{bad}', expected one of [{choices}]" in str(e.value)
    # a pair's file without its languages
    (tmp_path / "xx-yy.yaml").write_text("model:\n  embed_dim: 64\n")
    with pytest.raises(recipes.RecipeError, match=r"^\S*xx-yy.yaml: src and tgt \(the language codes of its files\) are "
                                                  r"required, or 'size_from_data: true' to take them from the prepared data$"):
        recipes.load("xx-yy")


def test_a_value_out_of_range_is_one_line_naming_the_key_and_the_range(tmp_path, monkeypatch):
    """A negative embed_dim had given a complex --lr (d^-0.5) and heads that do not divide it an
    assertion inside fairseq; a study config goes through the same check."""
    from qknorm_pipeline.study import config as study_config

    monkeypatch.setattr(recipes, "CONFIG_DIR", str(tmp_path))
    (tmp_path / "base.yaml").write_text(open(os.path.join(REPO, "configs", "base.yaml")).read())
    for text, message in (("model: {embed_dim: -128}", "model.embed_dim is -128; it must be >= 1"),
                          ("model: {dropout: 1.0}", "model.dropout is 1; it must be >= 0 and < 1"),
                          ("model: {embed_dim: 130, heads: 4}", r"model.heads \(4\) must divide model.embed_dim \(130\)"),
                          ("schedules: {valdecay: {decay_factor: 1.5}}",
                           "schedules.valdecay.decay_factor is 1.5; it must be > 0 and < 1"),
                          ("train: {max_tokens: 0}", "train.max_tokens is 0; it must be >= 1"),
                          ("decode: {beam: 0}", "decode.beam is 0; it must be >= 1")):
        (tmp_path / "xx-yy.yaml").write_text(f"src: xx\ntgt: yy\n{text}\n")
        with pytest.raises(recipes.RecipeError, match=rf"^configs/xx-yy.yaml over configs/base.yaml: {message}"):
            recipes.load("xx-yy")
    study = open(os.path.join(REPO, "configs", "studies", "gl-en-norm.yaml")).read()
    for old, new, message in (("  heads: 4\n", "  heads: 3\n", r"model.heads \(3\) must divide model.embed_dim \(256\)"),
                              ("  max_update: 6000", "  max_update: 0", "budget.max_update is 0; it must be >= 1"),
                              ("lr_grid: [", "lr_grid: [-1.0e-3, ", "lr_grid: -0.001 is not a learning rate")):
        assert old in study
        (tmp_path / "s.yaml").write_text(study.replace(old, new).replace("corpus: gl-en.yaml", "corpus: {dir: x}"))
        with pytest.raises(UsageError, match=message):
            study_config.load(str(tmp_path / "s.yaml"))


def test_a_config_that_is_not_a_yaml_mapping_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from qknorm_pipeline import train
    from qknorm_pipeline.study import config as study_config

    monkeypatch.setattr(recipes, "CONFIG_DIR", str(tmp_path))
    (tmp_path / "base.yaml").write_text(open(os.path.join(REPO, "configs", "base.yaml")).read())
    for text, problem in (("src: [xx\n", r"not valid YAML \(expected ',' or '\]', but got '<stream end>' at line 2, "
                                         r"column 1\): fix the file$"),
                          ("- src\n- tgt\n", r"a config holds keys \(key: value\), not a list$")):
        (tmp_path / "xx-yy.yaml").write_text(text)
        with pytest.raises(recipes.RecipeError, match=rf"^{tmp_path}/xx-yy.yaml: {problem}"):
            recipes.load("xx-yy")
        with pytest.raises(study_config.StudyError, match=rf"^{tmp_path}/xx-yy.yaml: {problem}"):
            study_config.load(str(tmp_path / "xx-yy.yaml"))
    # train.sh builds its help from base.yaml: a broken one is the same one line, before anything else
    (tmp_path / "base.yaml").write_text("7\n")
    assert train.main(["--dry-run", "demo", "postnorm"]) == 2
    assert capsys.readouterr().err == f"[train] error: {tmp_path}/base.yaml: a config holds keys (key: value), not a number\n"


def test_the_pipelines_choices_are_the_plugins():
    """The plugin cannot import the pipeline: its lists of choices are checked against the recipes' here."""
    from qknorm_fairseq.config import QKNormConfig
    from qknorm_fairseq.task import TranslationQKConfig

    def choices(config, name):  # a ChoiceEnum field's choices, in their order
        return tuple(config.__dataclass_fields__[name].type.__members__)

    assert choices(TranslationQKConfig, "decode_precision") == recipes.PRECISIONS
    assert choices(TranslationQKConfig, "length_norm") == tuple(e.value for e in recipes.LengthNorm)
    assert choices(TranslationQKConfig, "beam_search") == tuple(e.value for e in recipes.BeamSearch)
    assert choices(QKNormConfig, "positions") == tuple(e.value for e in recipes.Positions)


def test_stock_args_parse_with_fairseq_without_the_plugin():
    cfg = recipes.load("gl-en")
    st = cfg.stock
    args = recipes.stock_args(cfg, {**st.flags, **st.iwslt}, "data-bin/gl-en", "/tmp/x", 3,
                              ["--warmup-updates", str(st.warmup_updates)])
    assert "--user-dir" not in args and "--task" not in args
    ns = _parse(args)
    assert (ns.arch, ns.task, ns.seed, ns.warmup_updates, ns.lr[0], ns.clip_norm) == (
        recipes.STOCK_ARCH, "translation", 3, 4000, 5e-4, 0.0)
    assert ns.eval_bleu and ns.best_checkpoint_metric == "bleu" and ns.keep_interval_updates == 1
    assert ns.eval_bleu_remove_bpe == "@@ " and ns.save_dir == "/tmp/x" and ns.log_format == "json"


def test_train_help_lists_what_the_configs_hold(tmp_path, monkeypatch):
    from qknorm_pipeline import train

    base = open(os.path.join(REPO, "configs", "base.yaml")).read()
    base = base.replace("\nschedules:", "\nschedules:\n  myschedule: {scheduler: inverse_sqrt, warmup_updates: 10, lr: 1.0e-3}")
    base = base.replace("\nsystems:", "\nsystems:\n  mysystem: {arch: transformer_postnorm, stopping: twt_paper}")
    (tmp_path / "base.yaml").write_text(base)
    (tmp_path / "zz-en.yaml").write_text("src: zz\ntgt: en\n")
    monkeypatch.setattr(recipes, "CONFIG_DIR", str(tmp_path))
    text = " ".join(train.parser().format_help().split())
    assert "configs/PAIR.yaml (zz-en)" in text and "mysystem postnorm" in text
    assert "(myschedule, valdecay," in text and "(twt_paper, twt_code, qknorm)" in text
    assert "fp32|bf16|fp16" in text


def test_generate_args_parse_with_fairseq():
    from fairseq import options

    args = recipes.generate_args(recipes.load("en-vi"))
    parser = options.get_generation_parser()
    ns = options.parse_args_and_arch(parser, input_args=["data-bin/en-vi", "--path", "x.pt", *args])
    assert (ns.beam, ns.max_len_a, ns.max_len_b, ns.length_norm, ns.gnmt_alpha) == (4, 1, 50, "gnmt", 0.6)
    assert ns.lenpen == 1 and not ns.unnormalized  # GNMT replaces fairseq's --lenpen


def test_cli_get_and_train_args_is_one_shell_line():
    assert module("recipes", "get", "gl-en", "data.bpe_merges").stdout.strip() == "3000"
    out = module("recipes", "train-args", "sk-en", "qknorm", "--schedule", "nowarmup").stdout.strip().splitlines()
    assert len(out) == 1
    args = shlex.split(out[0])
    assert flag(args, "--arch") == "transformer_qknorm" and flag(args, "--lr") == "0.0003"
    assert flag(args, "--eval-bleu-args") == '{"beam": 4, "max_len_a": 1, "max_len_b": 50}'


def test_every_pair_gives_the_same_commands_as_before_the_base_recipe(tmp_path, monkeypatch, capsys):
    """tests/data/recipes_golden.json: the CLI outputs captured from the six full configs before they
    became base.yaml + per-pair differences, every system, schedule, stopping rule and key (regenerated
    for intended changes since: TwT rows stop by the paper's rule, QKNorm rows use the QKNorm code's
    position table, and the recipes use --optimizer multi_tensor_adam, the same update as adam)."""
    monkeypatch.setenv("DATA_BIN", str(tmp_path))  # no prepared data: the recipes alone
    golden = json.loads(open(os.path.join(REPO, "tests", "data", "recipes_golden.json")).read())
    assert sorted(golden) == PAPER_PAIRS
    checked = 0
    for pair, outputs in golden.items():
        for call, expected in outputs.items():
            words = call.split()
            recipes.main([words[0], pair, *words[1:]])
            got = capsys.readouterr().out.strip().replace(recipes.USER_DIR, "USER_DIR")
            assert got == expected, f"{call} {pair}"
            checked += 1
    assert checked == 203


def test_the_recipes_import_nothing_above_them():
    """recipes.py sits below data/ (data/download.py and data/stats.py import it), so it imports no data/ module."""
    import subprocess
    import sys

    code = ("import sys, qknorm_pipeline.recipes\n"
            "print(' '.join(m for m in sys.modules if m.startswith(('qknorm_pipeline.data', 'fairseq'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_a_gpu_run_validates_in_the_recipes_gpu_batches_a_cpu_run_in_its_training_batches(monkeypatch):
    from qknorm_pipeline import train
    from qknorm_pipeline.paths import folders
    from qknorm_pipeline.study import runs as study_runs

    def planned(gpu, extra=()):
        monkeypatch.setattr(train.hardware, "has_gpu", lambda: gpu)
        return train.plan("gl-en", "qknorm", train.Options(extra=list(extra)), check=False).fairseq_args

    tokens = recipes.load("gl-en").gpu.max_tokens_valid
    assert tokens == 32768
    on_gpu = _parse(planned(True))
    assert int(on_gpu.max_tokens_valid) == tokens and on_gpu.max_tokens == 4096
    assert int(_parse(planned(False)).max_tokens_valid) == 4096  # fairseq's default: the training --max-tokens
    assert int(_parse(planned(True, ["--max-tokens-valid", "8192"])).max_tokens_valid) == 8192  # the user's flag wins
    # a run moves between the two: the validation batch size is the device's, like --cpu
    assert train.settings(planned(True)) == train.settings(planned(False))
    # a finished run's signature and a study's records leave it out, as they did before it was set
    assert train.without_gpu_validation(planned(True)) == planned(False)[:-1] and planned(False)[-1] == "--cpu"
    assert "--max-tokens-valid" not in study_runs.portable(planned(True), folders())
