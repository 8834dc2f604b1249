"""Every architecture through the real fairseq commands: train, generate, resume, validate."""
import json
import os
import re
import subprocess
import sys

import pytest

from qknorm_fairseq.architectures import PRESETS as ARCHS

from helpers import REPO, USER_DIR, environment, fairseq, fairseq_inprocess, run, train_args


def losses(log):
    """Per-epoch train losses from fairseq's `| train | epoch NNN | loss X` lines."""
    return [float(m) for m in re.findall(r"(?:^|\| )train \| epoch \d+ \| loss ([\d.]+)", log, re.M)]


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """Each architecture trained for 2 epochs by fairseq-train's own main (in this process)."""
    out = {}
    root = tmp_path_factory.mktemp("ckpt")
    for arch in ARCHS:
        out[arch] = (root / arch, fairseq_inprocess("train", *train_args(tiny_data / "bin", root / arch, arch)))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_train_and_generate(tiny_data, trained, arch, tmp_path):
    save_dir, log = trained[arch]
    assert (save_dir / "checkpoint_last.pt").exists() and (save_dir / "checkpoint_best.pt").exists()
    assert f"arch='{arch}'" in log or f"'arch': '{arch}'" in log
    trace = losses(log)
    assert len(trace) == 2 and trace[1] < trace[0], trace
    fairseq_inprocess("generate", tiny_data / "bin", "--user-dir", USER_DIR, "--path", save_dir / "checkpoint_last.pt",
                      "--beam", "4", "--batch-size", "16", "--gen-subset", "valid", "--results-path", tmp_path)
    out = (tmp_path / "generate-valid.txt").read_text()
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 40, out[-2000:]
    assert "BLEU4" in out


def test_loss_decreases_on_tiny_overfit_task(tiny_data, tmp_path):
    for arch in ("transformer_postnorm", "transformer_qknorm"):
        log = fairseq_inprocess("train", *train_args(tiny_data / "bin", tmp_path / arch, arch, "--dropout", "0",
                                                      "--attention-dropout", "0", "--activation-dropout", "0",
                                                      "--word-dropout", "0", "--max-tokens", "500", "--lr", "0.003",
                                                      max_epoch=10))
        trace = losses(log)
        assert len(trace) == 10
        assert trace[-1] < 0.75 * trace[0], (arch, trace)


def test_resume_from_checkpoint_last(tiny_data, trained, tmp_path):
    save_dir, _ = trained["transformer_qknorm"]
    resume_dir = tmp_path / "resume"
    resume_dir.mkdir()
    (resume_dir / "checkpoint_last.pt").write_bytes((save_dir / "checkpoint_last.pt").read_bytes())
    proc = fairseq("train", *train_args(tiny_data / "bin", resume_dir, "transformer_qknorm", max_epoch=3))
    log = proc.stdout + proc.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 3 @ \d+ updates\)", log), log[-3000:]
    assert "epoch 003" in log and "epoch 001 |" not in log


def test_fine_tuning_on_other_data_allows_its_target_types(tiny_data, trained, tmp_path):
    """`--finetune-from-model` on a corpus whose targets hold types the checkpoint's mask forbids (the tiny
    corpus the other way round, with the same dictionary): the new types become allowed, so their gold
    tokens get logits and a gradient; the old ones stay allowed."""
    import torch

    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid"):
        for side, other in (("src", "tgt"), ("tgt", "src")):
            (raw / f"{split}.{side}").write_text((tiny_data / "raw" / f"{split}.{other}").read_text())
    fairseq("preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
            "--validpref", raw / "valid", "--destdir", tmp_path / "bin", "--joined-dictionary",
            "--srcdict", tiny_data / "bin" / "dict.src.txt", "--workers", "1")
    old = trained["transformer_qknorm"][0] / "checkpoint_last.pt"
    log = fairseq_inprocess("train", *train_args(tmp_path / "bin", tmp_path / "tuned", "transformer_qknorm", "--task",
                                                 "translation_qk", "--finetune-from-model", old, max_epoch=1))
    masks = [torch.load(f, weights_only=False)["model"]["decoder.allowed_types"] for f in (old, tmp_path / "tuned" /
                                                                                          "checkpoint_last.pt")]
    with open(tiny_data / "bin" / "dict.src.txt") as f:
        index = {line.split()[0]: i + 4 for i, line in enumerate(f)}  # after fairseq's four specials
    new_types = torch.zeros_like(masks[0])
    new_types[[index[w] for w in (raw / "train.tgt").read_text().split()]] = True
    assert (new_types & ~masks[0]).sum() == 24, "the old mask forbids the new corpus's 24 target words"
    assert torch.equal(masks[1], masks[0] | new_types)
    assert (f"target vocabulary mask: the checkpoint's {int(masks[0].sum())} types and 24 more from the training "
            f"targets, {int(masks[1].sum())} of {len(masks[1])} types can be generated") in log


def test_patience_counts_across_a_resume(tiny_data, tmp_path):
    """fairseq's --patience with translation_qk: a run stopped at update 6 and resumed stops where the run that
    was never stopped does (a dev loss 'maximised' never improves: the stop comes 3 validations after the
    first, at update 8), not 3 validations after the resume."""
    import torch

    def train(folder, max_update):
        return fairseq_inprocess("train", *train_args(
            tiny_data / "bin", folder, "transformer_qknorm", "--task", "translation_qk", "--best-checkpoint-metric",
            "loss", "--maximize-best-checkpoint-metric", "--validate-interval-updates", "2", "--save-interval-updates",
            "2", "--validate-interval", "1000000", "--patience", "3", "--max-update", str(max_update), max_epoch=100))

    def updates(folder):
        return torch.load(folder / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"]

    log = train(tmp_path / "whole", 100)
    assert "early stop since valid performance hasn't improved for last 3 runs" in log and updates(tmp_path / "whole") == 8
    train(tmp_path / "resumed", 6)
    assert updates(tmp_path / "resumed") == 6
    log = train(tmp_path / "resumed", 100)
    assert "--patience: 2 validations since the best one" in log, log[-3000:]
    assert updates(tmp_path / "resumed") == 8


def test_validate_loads_checkpoint(tiny_data, trained):
    save_dir, _ = trained["transformer_hnas"]
    proc = fairseq("validate", tiny_data / "bin", "--task", "translation", "--user-dir", USER_DIR, "--path",
                   save_dir / "checkpoint_best.pt",
                   "--valid-subset", "valid", "--batch-size", "16")
    assert re.search(r"valid on 'valid' subset \| loss [\d.]+", proc.stdout + proc.stderr)


def test_interactive_translates_every_input_line(tiny_data, trained):
    save_dir, _ = trained["transformer_scalenorm"]
    sources = (tiny_data / "raw" / "test.src").read_text().splitlines()[:5]
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-interactive"), str(tiny_data / "bin"),
                           "--user-dir", USER_DIR, "--path", str(save_dir / "checkpoint_best.pt"), "--beam", "2",
                           "--source-lang", "src", "--target-lang", "tgt"], input="\n".join(sources) + "\n",
                          capture_output=True, text=True, env=environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split("\t")[1] for line in lines if line.startswith("S-")] == sources
    hyps = [line.split("\t") for line in lines if line.startswith("H-")]
    assert [h[0] for h in hyps] == [f"H-{i}" for i in range(5)]
    # a score and a translation of target-side words (the target vocabulary is v0..v23)
    assert all(float(h[1]) < 0 and h[2] and all(w.startswith("v") for w in h[2].split()) for h in hyps), hyps


def test_installed_package_as_user_dir(tiny_data, trained, tmp_path):
    """`--user-dir qknorm_fairseq` from any folder finds the installed package (next to fairseq)."""
    save_dir, _ = trained["transformer_qknorm"]
    proc = fairseq("generate", tiny_data / "bin", "--user-dir", "qknorm_fairseq", "--path",
                   save_dir / "checkpoint_best.pt", "--beam", "2", "--batch-size", "16", cwd=tmp_path)
    assert "BLEU4" in proc.stdout


def test_import_then_user_dir_does_not_double_register(tiny_data):
    code = ("import qknorm_fairseq, sys\n"
            "from fairseq import options\n"
            "p = options.get_training_parser()\n"
            f"a = options.parse_args_and_arch(p, [{str(tiny_data / 'bin')!r}, '--user-dir', {USER_DIR!r}, "
            "'--arch', 'transformer_qknorm'])\n"
            "print('ok', a.arch)\n")
    proc = run([sys.executable, "-c", code], cwd=REPO)
    assert "ok transformer_qknorm" in proc.stdout


def test_user_dir_through_a_symbolic_link_after_import(tiny_data, tmp_path):
    """The package imported from its folder, then --user-dir given as a link to it (or the reverse, as a
    symlinked virtual environment does): the same package, no "not globally unique" error."""
    link = tmp_path / "linked" / "qknorm_fairseq"
    link.parent.mkdir()
    link.symlink_to(USER_DIR, target_is_directory=True)
    for imported, given in ((USER_DIR, link), (link, USER_DIR)):
        code = (f"import sys; sys.path.insert(0, {str(os.path.dirname(imported))!r})\n"
                "import qknorm_fairseq, argparse\n"
                "from fairseq import utils\n"
                f"utils.import_user_module(argparse.Namespace(user_dir={str(given)!r}))\n"
                "print('ok', qknorm_fairseq.__file__)\n")
        proc = run([sys.executable, "-c", code], cwd=tmp_path)
        assert f"ok {imported}" in proc.stdout, proc.stderr[-2000:]


def test_checkpoint_holds_no_unsafe_globals_beyond_the_allow_list(trained):
    import torch

    from qknorm_fairseq.checkpoint_compat import TRUSTED

    names = {f"{t.__module__}.{t.__qualname__}" for t in TRUSTED}
    for arch in ("transformer_qknorm", "transformer_postnorm"):
        found = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(trained[arch][0] / "checkpoint_last.pt")))
        assert found <= names, found - names
    print(json.dumps(sorted(names)))


def test_decode_precision_on_a_cpu(tiny_data, tmp_path):
    """bf16 decodes every sentence through fairseq-generate where torch has bf16 kernels (that it runs
    under autocast: tests/unit/test_task.py); fp16 on a CPU is an error naming the fix, raised as the
    task is set up (before the model loads)."""
    import torch

    fairseq("train", *train_args(tiny_data / "bin", tmp_path / "ck", "transformer_postnorm", "--cpu", max_epoch=1))

    def generate(*extra):
        return fairseq("generate", tiny_data / "bin", "--user-dir", USER_DIR, "--path", tmp_path / "ck/checkpoint_last.pt",
                       "--task", "translation_qk", "--source-lang", "src", "--target-lang", "tgt", "--cpu", "--beam", "2",
                       *extra, check=False)

    out = generate("--decode-precision", "fp16")
    assert out.returncode != 0 and "--decode-precision fp16 needs a CUDA device; decode in fp32" in out.stderr
    # refused when the task is set up, before fairseq looks for the checkpoint
    early = fairseq("generate", tiny_data / "bin", "--user-dir", USER_DIR, "--path", tmp_path / "absent.pt",
                    "--task", "translation_qk", "--source-lang", "src", "--target-lang", "tgt", "--cpu",
                    "--decode-precision", "fp16", check=False)
    assert early.returncode != 0 and "--decode-precision fp16 needs a CUDA device" in early.stderr, early.stderr[-2000:]
    assert "Model file not found" not in early.stderr
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bf16 kernels")
    bf16, fp32 = generate("--decode-precision", "bf16"), generate()
    assert bf16.returncode == 0 and fp32.returncode == 0, bf16.stderr[-2000:]
    hyps = [sorted(line for line in o.stdout.splitlines() if line.startswith("H-")) for o in (bf16, fp32)]
    assert len(hyps[0]) == len(hyps[1]) == 40


def test_setup_task_sees_cpu_and_refuses_fp16_there_even_beside_a_gpu(tiny_data, monkeypatch):
    """--cpu reaches the task (common.cpu), so fp16 decoding is refused on a GPU machine told to decode on the CPU."""
    import torch
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from qknorm_fairseq.task import TranslationQKTask

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def task_cfg(*extra):
        args = [str(tiny_data / "bin"), "--user-dir", USER_DIR, "--task", "translation_qk", "--path", "x.pt",
                "--source-lang", "src", "--target-lang", "tgt", "--decode-precision", "fp16", *extra]
        return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), args)).task

    assert TranslationQKTask.setup_task(task_cfg()).cfg.decode_precision == "fp16"
    with pytest.raises(ValueError, match=r"^--decode-precision fp16 needs a CUDA device; decode in fp32 \(drop the flag\)$"):
        TranslationQKTask.setup_task(task_cfg("--cpu"))


def test_importing_the_plugin_leaves_logging_as_it_was():
    """fairseq's import sets the root logger to DEBUG with a handler (wav2vec2_classification.py), which
    would print every library's DEBUG lines; the plugin undoes it, whatever the import order inside it."""
    code = ("import logging, qknorm_fairseq; r = logging.getLogger(); "
            "print(r.level, len(r.handlers), logging.getLogger('fairseq.tasks.text_to_speech').level)")
    p = run([sys.executable, "-c", code], cwd=REPO)
    assert p.stdout.split() == ["30", "0", "30"], p.stdout + p.stderr
    assert p.stderr == ""


def test_the_plugin_imports_torch_dynamo_only_with_fast_dropout():
    """torch._dynamo costs every process that loads the plugin 2 s; fairseq-generate never needs it, so
    only --fast-dropout (whose numpy draws torch.compile must skip) imports it."""
    code = ("import sys, qknorm_fairseq; before = 'torch._dynamo' in sys.modules; "
            "from qknorm_fairseq.attention import NormAttention; NormAttention(8, 2, self_attention=True); "
            "plain = 'torch._dynamo' in sys.modules; NormAttention(8, 2, self_attention=True, fast_dropout=True); "
            "print(before, plain, 'torch._dynamo' in sys.modules)")
    p = run([sys.executable, "-c", code], cwd=REPO)
    assert p.stdout.split() == ["False", "False", "True"], p.stdout + p.stderr


def test_multi_tensor_adam_trains_as_fairseqs_adam(tiny_data, tmp_path):
    """fairseq-train with --optimizer multi_tensor_adam: fairseq's LR scheduler and clipping drive it,
    and every logged training loss equals that of --optimizer adam to 1e-6."""
    def train_losses(optimizer):
        log = fairseq_inprocess("train", *train_args(tiny_data / "bin", tmp_path / optimizer, "transformer_qknorm",
                                                     "--optimizer", optimizer, "--clip-norm", "0.5",
                                                     "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
                                                     "--weight-decay", "0.01", "--adam-betas", "(0.9, 0.98)",
                                                     "--log-format", "json", max_epoch=5))
        inner = [json.loads(line[line.index("{"):]) for line in log.splitlines() if "train_inner" in line]
        return [(int(r["num_updates"]), float(r["loss"]), float(r["gnorm"])) for r in inner]

    ours, ref = train_losses("multi_tensor_adam"), train_losses("adam")
    assert len(ours) == len(ref) >= 10, ours
    for (u, loss, gnorm), (v, ref_loss, ref_gnorm) in zip(ours, ref):
        assert u == v and loss == pytest.approx(ref_loss, rel=1e-6) and gnorm == pytest.approx(ref_gnorm, rel=1e-6)


def test_the_original_codes_details_train_and_decode(tiny_data, tmp_path):
    """The original code's language embeddings, word dropout on EOS/BOS and label smoothing form
    through fairseq-train and fairseq-generate: the flags are stored, the second epoch (resumed from
    the first's checkpoint) lowers the loss and moves both language vectors, and the checkpoint
    decodes every sentence."""
    import torch

    flags = ("--language-embeddings", "--word-dropout-specials", "--label-smoothing-form", "uniform")
    vectors, trace = [], []
    for epochs in (1, 2):
        log = fairseq_inprocess("train", *train_args(tiny_data / "bin", tmp_path, "transformer_scalenorm", *flags,
                                                      max_epoch=epochs))
        trace += losses(log)
        state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
        vectors.append({side: state["model"][f"{side}.embed_positions.language"] for side in ("encoder", "decoder")})
    assert len(trace) == 2 and trace[1] < trace[0], trace
    cfg = state["cfg"]
    assert cfg["model"].language_embeddings and cfg["model"].word_dropout_specials
    assert cfg["criterion"]["label_smoothing_form"] == "uniform"
    for side, first in vectors[0].items():
        assert first.shape == (32,) and not torch.equal(first, vectors[1][side]), side
    fairseq_inprocess("generate", tiny_data / "bin", "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
                      "--beam", "4", "--batch-size", "16", "--gen-subset", "valid", "--results-path", tmp_path)
    hyps = [line for line in (tmp_path / "generate-valid.txt").read_text().splitlines() if line.startswith("H-")]
    assert len(hyps) == 40


def test_the_packed_decoder_trains_as_the_padded_one(tiny_data, tmp_path):
    """fairseq-train with --packed-decoder (no dropout, so both runs draw nothing): every logged training
    loss and gradient norm over 5 epochs equals the padded decoder's up to rounding (rel 1e-4), and the
    validation loss, computed by the padded decoder in both, too."""
    def train_log(*flag):
        log = fairseq_inprocess("train", *train_args(tiny_data / "bin", tmp_path / (flag[0] if flag else "padded"),
                                                     "transformer_qknorm", "--task", "translation_qk", "--dropout", "0",
                                                     "--attention-dropout", "0", "--activation-dropout", "0",
                                                     "--word-dropout", "0", "--fused-loss", "--log-format", "json",
                                                     *flag, max_epoch=5))
        records = [json.loads(line[line.index("{"):]) for line in log.splitlines() if "train_inner" in line
                   or '"valid_loss"' in line]
        return [(r.get("num_updates", r.get("valid_num_updates")), float(r.get("loss", r.get("valid_loss"))),
                 r.get("gnorm")) for r in records]

    packed, padded = train_log("--packed-decoder"), train_log()
    assert len(packed) == len(padded) >= 10, packed
    for (u, loss, gnorm), (v, ref_loss, ref_gnorm) in zip(packed, padded):
        assert u == v and loss == pytest.approx(ref_loss, rel=1e-4)
        assert gnorm is None or float(gnorm) == pytest.approx(float(ref_gnorm), rel=1e-4)
