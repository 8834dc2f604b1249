"""Corpus tools behind scripts/download.sh and scripts/prepare.sh (their command lines:
qknorm_pipeline/download.py and qknorm_pipeline/prepare.py).

    common    errors, download's log lines, the split names and fairseq's name for each
              (reading and writing files and folders: qknorm_pipeline/files.py)
    sources   where each pair's data lives and the published size / checksums of its files
    fetch     download with retries, resume, progress and verification
    readers   TED tsv / parquet / archive readers (the TED reader's rules)
    download  try each source in turn, check the counts, write data/PAIR/raw/
    tokenize  alignment check, Moses tokenization, train length filter
    spm       the SentencePiece alternative to fastBPE
    stats     data-bin/PAIR/stats.json
    demo      the seeded synthetic corpus of the offline demo

None of them imports fairseq.
"""
