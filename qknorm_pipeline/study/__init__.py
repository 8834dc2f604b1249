"""The real-data study (configs/studies/*.yaml; scripts/study.sh): our presets and stock fairseq
trained with the same data, model size and budget, several seeds each, at the recipes' peak
learning rates and at a multiple of them, decoded alike, reported with significance tests over
seeds and sentences.

    config.py    the study's structured config, its runs, their training flags
    corpus.py    the study's corpus: fetched or copied once, its line counts and sha256 checked
    records.py   a finished run's record (kept in git) and its training log's wall time and curve
    runs.py      training, evaluating and recording every run, resumable across sessions
    report.py    study.md, study.json, dev_bleu.png from the records
    __main__.py  the command line (scripts/study.sh)
"""
