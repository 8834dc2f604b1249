"""qknorm-fairseq: a fairseq --user-dir plugin."""
