"""The real-data study (configs/studies/*.yaml; scripts/study.sh): our presets and stock fairseq
trained with the same data, model size and budget, several seeds each, at the recipes' peak
learning rates and at a multiple of them, decoded alike, reported with significance tests over
seeds and sentences.

    config.py    the study's structured config, its runs, their training flags
    corpus.py    the study's corpus: fetched or copied once, its line counts and sha256 checked
    records.py   a finished run's record (kept in git), its training log's wall time and curve, its scores
    runs.py      training, evaluating and recording every run, resumable across interruptions
    stats.py     the report's statistics: seeds' means, the tests and their families, plateaus
    render.py    study.md from those (StudyReport)
    report.py    study.md, study.json and the plots from the records
    __main__.py  the command line (scripts/study.sh)
"""
