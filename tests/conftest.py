"""The fixtures of every tier, and each test's tier marker from its folder (unit, integration,
system), so that `-m unit` and friends select them:
  tests/unit         one module against an independent computation; no training or decoding run
  tests/integration  real fairseq runs and our commands on the tiny corpus, as a user runs them
  tests/system       a user's pipelines end to end (minutes each; not in the default run)
The few tests that read the real corpora find them in the folder QKNORM_TEST_DATA names (default:
../shared/data beside the checkout; helpers.SHARED_DATA) and skip, naming the missing path, without
them; a QKNORM_TEST_DATA that names no folder stops the run. tests/README.md says how to run each tier."""
import os
import shutil

import pytest

# Tiny models: one thread each is fastest, and avoids oversubscribing the 2-core CI machine (a
# recipe's cpu.threads pins MKL_NUM_THREADS where it is unset: one per core, two trainings, four threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
import torch  # noqa: E402

from helpers import SHARED_DATA, TEST_DATA_VARIABLE, environment, fairseq, run, train_cmd, write_reverse_corpus  # noqa: E402

torch.set_num_threads(1)
TIERS = ("unit", "integration", "system")


def pytest_configure(config):
    if os.environ.get(TEST_DATA_VARIABLE) and not os.path.isdir(SHARED_DATA):
        raise pytest.UsageError(f"{TEST_DATA_VARIABLE}={os.environ[TEST_DATA_VARIABLE]}: no such folder; name the folder "
                                f"that holds the real corpora (ted-gl-en, ...), or unset it to skip their tests")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = os.path.basename(os.path.dirname(str(item.fspath)))
        if tier in TIERS:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The tiny corpus of every test: raw text (raw/{train,valid,test}.{src,tgt}) and a
    joined-dictionary data-bin (bin/) of the reverse task. Read-only: copy it to change it."""
    root = tmp_path_factory.mktemp("tiny")
    write_reverse_corpus(root / "raw")
    fairseq("preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw/train",
            "--validpref", root / "raw/valid", "--testpref", root / "raw/test", "--destdir", root / "bin",
            "--joined-dictionary", "--workers", "1")
    return root


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_data, tmp_path_factory):
    """The tiny corpus as pair 'demo' of the pipeline (its folders under the returned root), with two
    systems trained for 2 epochs: 'postnorm' and 'prenorm' (fairseq's tiny transformer, post- and
    pre-norm)."""
    root = tmp_path_factory.mktemp("pipeline")
    shutil.copytree(tiny_data / "bin", root / "data-bin" / "demo")
    (root / "data" / "demo" / "tok").mkdir(parents=True)
    shutil.copy(tiny_data / "raw" / "test.tgt", root / "data" / "demo" / "tok" / "test.tgt")
    for system, extra in (("postnorm", []), ("prenorm", ["--encoder-normalize-before", "--decoder-normalize-before"])):
        (root / "logs" / "demo" / system).mkdir(parents=True)
        run(train_cmd(root / "data-bin" / "demo", root / "checkpoints" / "demo" / system, "--lr", "5e-3",
                      "--max-epoch", "2", "--log-file", root / "logs" / "demo" / system / "train.log",
                      "--eval-bleu", "--eval-bleu-args", '{"beam": 1}', "--best-checkpoint-metric", "bleu",
                      "--maximize-best-checkpoint-metric", "--clip-norm", "1.0", "--cpu", *extra),
            env=environment())
    return root
