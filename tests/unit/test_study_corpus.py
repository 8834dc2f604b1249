"""qknorm_pipeline/study/corpus.py: the study's corpus copied once into its own folder and checked
at every call against the config's line counts and sha256 (the download path: tests/integration/
test_download.py); the shipped study configs describe the corpus their records used."""
import hashlib
import os

import pytest
import yaml

from qknorm_pipeline.paths import Folders
from qknorm_pipeline.study import config, corpus
from qknorm_pipeline.study.config import StudyError

from helpers import REPO, shared

STUDIES = [os.path.join(REPO, "configs", "studies", name) for name in ("gl-en.yaml", "gl-en-norm.yaml")]
NAMES = ["train.gl", "train.en", "dev.gl", "dev.en", "test.gl", "test.en"]


def write_corpus(folder, n=(5, 2, 3)):
    folder.mkdir(parents=True)
    for split, k in zip(("train", "dev", "test"), n):
        for lang in ("gl", "en"):
            (folder / f"{split}.{lang}").write_text("".join(f"{split} {lang} {i} .\n" for i in range(k)))
    return folder


def study(tmp_path, **corpus_cfg):
    cfg = yaml.safe_load(open(STUDIES[1]))
    cfg["corpus"] = corpus_cfg
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return config.load(str(path))


def where(tmp_path):
    return Folders(*(str(tmp_path / "out" / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))


def digests(folder):
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in NAMES}


def test_a_corpus_dir_is_copied_once_then_used_from_the_study_folder(tmp_path):
    src = write_corpus(tmp_path / "mine")
    cfg = study(tmp_path, dir=str(src), expected_lines={"train": 5, "dev": 2, "test": 3}, sha256=digests(src))
    raw = corpus.ensure(cfg, where(tmp_path))
    assert raw == str(tmp_path / "out/data/gl-en/raw")
    assert all((tmp_path / "out/data/gl-en/raw" / n).read_bytes() == (src / n).read_bytes() for n in NAMES)
    for n in NAMES:
        (src / n).unlink()  # from now on the study's own copy is the corpus
    assert corpus.ensure(cfg, where(tmp_path)) == raw


def test_source_dir_wins_over_the_config_and_is_checked_like_it(tmp_path):
    good = write_corpus(tmp_path / "good")
    cfg = study(tmp_path, source="ted_multi", expected_lines={"train": 5, "dev": 2, "test": 3}, sha256=digests(good))
    raw = corpus.ensure(cfg, where(tmp_path), source_dir=str(good))
    assert (tmp_path / "out/data/gl-en/raw/test.en").read_text() == (good / "test.en").read_text()
    # another corpus with the same line counts: refused by its sha256, the study's copy untouched
    other = write_corpus(tmp_path / "other")
    (other / "dev.en").write_text("dev en 0 .\ndev en 1 !\n")
    with pytest.raises(StudyError) as e:
        corpus.ensure(cfg, where(tmp_path), source_dir=str(other))
    msg = str(e.value)
    assert msg.startswith(f"--source-dir {other}: dev.en is not the corpus of the study's records (sha256 "
                          f"{hashlib.sha256(b'dev en 0 .' + bytes([10]) + b'dev en 1 !' + bytes([10])).hexdigest()[:16]}")
    assert "give --source-dir the corpus they used" in msg and "\n" not in msg
    assert (tmp_path / "out/data/gl-en/raw/dev.en").read_text() == (good / "dev.en").read_text()
    # a different line count, a missing file, a missing folder
    short = write_corpus(tmp_path / "short", n=(4, 2, 3))
    with pytest.raises(StudyError, match=r"train.gl has 4 lines where .*study.yaml expects 5 \(corpus: expected_lines\)"):
        corpus.ensure(cfg, where(tmp_path), source_dir=str(short))
    (short / "test.gl").unlink()
    with pytest.raises(StudyError, match="no test.gl: the study's corpus needs train.gl train.en dev.gl dev.en test.gl test.en"):
        corpus.ensure(study(tmp_path, source="ted_multi"), where(tmp_path), source_dir=str(short))
    with pytest.raises(StudyError, match=f"--source-dir {tmp_path}/nowhere is not a folder"):
        corpus.ensure(cfg, where(tmp_path), source_dir=str(tmp_path / "nowhere"))
    assert corpus.ensure(cfg, where(tmp_path)) == raw


def test_a_changed_copy_in_the_study_folder_is_refused_at_the_next_call(tmp_path):
    src = write_corpus(tmp_path / "mine")
    cfg = study(tmp_path, dir=str(src), sha256=digests(src))
    raw = corpus.ensure(cfg, where(tmp_path))
    with open(os.path.join(raw, "train.en"), "a") as f:
        f.write("one more .\n")
    with pytest.raises(StudyError, match="train.en is not the corpus of the study's records"):
        corpus.ensure(cfg, where(tmp_path))


def test_the_corpus_section_is_validated(tmp_path):
    with pytest.raises(StudyError, match="corpus: give source: .* or dir: .*, one of them"):
        study(tmp_path, source="ted_multi", dir="x")
    with pytest.raises(StudyError, match="corpus: give source:"):
        study(tmp_path)
    with pytest.raises(StudyError, match="corpus: sha256: unknown train.de"):
        study(tmp_path, source="ted_multi", sha256={"train.de": "0"})
    with pytest.raises(StudyError, match="corpus: expected_lines: unknown valid .known: train, dev, test."):
        study(tmp_path, source="ted_multi", expected_lines={"valid": 3})
    # a study may share another's corpus by naming its config
    assert config.load(STUDIES[1]).corpus == config.load(STUDIES[0]).corpus
    copy = tmp_path / "copy.yaml"  # a copy elsewhere still finds the shipped study it names
    copy.write_text(open(STUDIES[1]).read())
    assert config.load(str(copy)).corpus == config.load(STUDIES[0]).corpus
    copy.write_text(open(STUDIES[1]).read().replace("corpus: gl-en.yaml", "corpus: nosuch.yaml"))
    with pytest.raises(StudyError, match="copy.yaml: corpus: nosuch.yaml: no such study config beside it or in configs/studies/"):
        config.load(str(copy))


@pytest.mark.parametrize("path", STUDIES, ids=os.path.basename)
def test_the_shipped_studies_name_a_download_and_the_bytes_their_records_used(path):
    cfg = config.load(path)
    assert cfg.corpus.source == "ted_multi" and not cfg.corpus.dir
    assert "shared" not in open(path).read()
    folder = shared("ted-gl-en")
    corpus.check(cfg, folder, folder)  # line counts and sha256 of the copy the recorded runs used
    assert sorted(cfg.corpus.sha256) == sorted(NAMES)
    assert corpus.describe(cfg) == "gl-en, the ted_multi download, 11,233 / 742 / 1,112 train / dev / test lines"
