"""fairseq's JSON log records (`--log-format json`), read from a finished log or line by line.

Each record is one JSON object on a line, optionally after a `... | INFO | valid |` prefix.
Kinds: `train_inner` (every --log-interval updates: loss, lr, ups, num_updates), `valid` (each
validation: valid_loss, valid_bleu, valid_best_bleu, valid_num_updates), `train` (end of epoch).
Used by the plots, the precision check, the study records, the throughput benchmark and the live
progress display; imports no fairseq.
"""
import json
import os

from .cli import UserError


class LogError(UserError):
    """A log that is missing or holds no record of the kind asked for."""


def parse_line(line):
    """(kind, record) of one log line, numeric strings as floats; None when it holds no record."""
    i = line.find('{"')
    if i < 0:
        return None
    try:
        rec = json.loads(line[i:])
    except json.JSONDecodeError:
        return None
    if not isinstance(rec, dict):
        return None
    rec = {k: _num(v) for k, v in rec.items()}
    if "valid_loss" in rec:
        return "valid", rec
    if "train_loss" in rec:
        return "train", rec
    if "loss" in rec and "num_updates" in rec:
        return "train_inner", rec
    return None


def parse_log(path):
    """{'train_inner': [...], 'valid': [...], 'train': [...]} from a fairseq JSON log, with
    fairseq's duplicated lines removed and numeric strings converted."""
    if not os.path.isfile(path):
        raise LogError(f"train log {path!r} does not exist")
    out = {"train_inner": [], "valid": [], "train": []}
    seen = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            parsed = parse_line(line)
            if parsed is None:
                continue
            key = json.dumps(parsed[1], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out[parsed[0]].append(parsed[1])
    return out


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return v
