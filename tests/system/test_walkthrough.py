"""README's "Using the plugin from plain fairseq", run exactly as printed: the commands a fairseq
user types (fairseq-preprocess, fairseq-train and fairseq-generate with --user-dir qknorm_fairseq),
from a folder laid out as the checkout, with every output folder under a temporary root."""
import os
import re
import subprocess

import torch

from helpers import REPO, environment, naive_bleu


def readme_walkthrough():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text.split("## Using the plugin from plain fairseq")[1].split("\n## ")[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the walkthrough is one bash block"
    return blocks[0]


def test_readme_walkthrough_trains_and_scores_a_qknorm_model(tmp_path):
    commands = readme_walkthrough()
    assert "--user-dir qknorm_fairseq" in commands and "--arch transformer_qknorm" in commands
    # the checkout's layout: the scripts and the plugin where the commands name them
    for name in ("scripts", "qknorm_fairseq"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    env = environment(tmp_path)  # DATA_DIR=tmp/data, DATA_BIN=tmp/data-bin, ...: what the relative paths read
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]

    ckpt = torch.load(tmp_path / "checkpoints" / "demo-plain" / "checkpoint_last.pt", map_location="cpu",
                      weights_only=False)
    assert ckpt["cfg"]["model"].arch == "transformer_qknorm"
    assert any(k.endswith("self_attn.qk_scale") for k in ckpt["model"])  # QKNorm's learned g is there
    assert ckpt["optimizer_history"][-1]["num_updates"] == 300

    ref = (tmp_path / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines()
    hyp = (tmp_path / "hyp.txt").read_text().splitlines()
    assert len(hyp) == len(ref) == 300
    # the sorted H- lines are the test sentences in order: BPE undone, one per source line
    assert not any("@@" in h for h in hyp)
    printed = re.search(r"^qknorm +([\d.]+)", proc.stdout, re.M)
    assert printed, proc.stdout[-2000:]
    expected = naive_bleu(hyp, ref)
    assert abs(float(printed[1]) - expected) < 0.01, (printed[1], expected)
    assert expected > 50, f"the model did not learn the demo task: BLEU {expected:.2f}"
