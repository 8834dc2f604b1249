"""Where each dataset lives, in the order download.sh tries the sources, and what the published
files weigh (data/README.md gives the evidence for every value).

Base URLs can be moved by environment variables (mirrors, and the tests' local fixtures):
    QKNORM_PHONTRON_BASE  http://phontron.com/data                           (original archives)
    QKNORM_WAYBACK_BASE   https://web.archive.org/web/20240301220426if_/http://www.phontron.com/data
    QKNORM_HF_BASE        https://huggingface.co/datasets                     (parquet conversions)
    QKNORM_HF_REVISION    the revision of the parquet conversion (see HF_REVISION)
    QKNORM_IWSLT15_BASE   https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi
"""
import os

from .common import SPLITS, DataError

DEFAULT_BASES = {
    "QKNORM_PHONTRON_BASE": "http://phontron.com/data",
    # the capture reported in issue 7 of github.com/neulab/word-embeddings-for-nmt; note the www. host
    "QKNORM_WAYBACK_BASE": "https://web.archive.org/web/20240301220426if_/http://www.phontron.com/data",
    "QKNORM_HF_BASE": "https://huggingface.co/datasets",
    "QKNORM_IWSLT15_BASE": "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi",
}

# The parquet conversions live on the branch refs/convert/parquet of each dataset repository. The
# commit it points to could not be looked up without network access, so this is still the
# (moving) branch name: UNVERIFIED, see data/README.md. Set it to the commit once known, here or
# with QKNORM_HF_REVISION; every parquet URL goes through it.
HF_REVISION = "refs%2Fconvert%2Fparquet"

HF_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


class Published:
    """A file's published size and checksums (None where none is published)."""

    def __init__(self, size, sha256, md5=None):
        self.size, self.sha256, self.md5 = size, sha256, md5


# download_checksums of datasets/{ted_hrlr,ted_multi,mt_eng_vietnamese}/dataset_infos.json in the
# GitHub repository huggingface/datasets; the md5s of the Stanford files as published with them.
PUBLISHED = {
    "qi18naacl-dataset.tar.gz": Published(131005909,
                                          "216a86c3df4d4f522856fe9b920ff5be6b394d769cc88974ae8f9f5546953bbc"),
    "ted_talks.tar.gz": Published(352222045, "03457b9ebc6d60839f1a48c5a03c940266aff78b81fcda4c6d9e2a5a7fb670ae"),
    "train.en": Published(13603614, "c26dfeed74b6bf3752f5ca552f2412456f0de153f7c804df8717931fb3a5c78a",
                          "5b6300f46160ab5a7a995546d2eeb9e6"),
    "train.vi": Published(18074646, "707206edf2dc0280273952c7b70544ea8a1363aa69aaeb9d70514b888dc3067d",
                          "858e884484885af5775068140ae85dab"),
    "tst2012.en": Published(140250, "b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2",
                            "c14a0955ed8b8d6929fdabf4606e3875"),
    "tst2012.vi": Published(188396, "01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0",
                            "dddf990faa149e980b11a36fca4a8898"),
    "tst2013.en": Published(132264, "3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df",
                            "c41c43cb6d3b122c093ee89608ba62bd"),
    "tst2013.vi": Published(183855, "29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd",
                            "a3185b00264620297901b647a4cacf38"),
}


def base(var):
    return os.environ.get(var, DEFAULT_BASES[var]).rstrip("/")


def hf_revision():
    return os.environ.get("QKNORM_HF_REVISION", HF_REVISION)


def published(url):
    """The published size and checksums of the file URL names (None for parquet shards)."""
    return PUBLISHED.get(url.rstrip("/").rsplit("/", 1)[-1])


def sources_for(dataset, src, tgt):
    """Ordered (name, kind, urls) to try for a dataset. kind: ted_tsv_tar, hrlr_tar, hrlr_parquet,
    ted_multi_parquet, iwslt_text."""
    hf = f"{base('QKNORM_HF_BASE')}/neulab/{{}}/resolve/{hf_revision()}"
    if dataset == "ted_hrlr":
        folder = hf.format("ted_hrlr") + f"/{src}_to_{tgt}"
        return [
            ("phontron-qi18naacl", "hrlr_tar", [f"{base('QKNORM_PHONTRON_BASE')}/qi18naacl-dataset.tar.gz"]),
            ("hf-ted_hrlr", "hrlr_parquet", {s: f"{folder}/{HF_SPLITS[s]}/0000.parquet" for s in SPLITS}),
            ("wayback-qi18naacl", "hrlr_tar", [f"{base('QKNORM_WAYBACK_BASE')}/qi18naacl-dataset.tar.gz"]),
        ]
    if dataset == "ted_multi":
        folder = hf.format("ted_multi") + "/plain_text"
        return [
            ("phontron-ted_talks", "ted_tsv_tar", [f"{base('QKNORM_PHONTRON_BASE')}/ted_talks.tar.gz"]),
            ("hf-ted_multi", "ted_multi_parquet", {s: f"{folder}/{HF_SPLITS[s]}" for s in SPLITS}),
            ("wayback-ted_talks", "ted_tsv_tar", [f"{base('QKNORM_WAYBACK_BASE')}/ted_talks.tar.gz"]),
        ]
    if dataset == "iwslt15":
        b = base("QKNORM_IWSLT15_BASE")
        files = {"train": "train", "dev": "tst2012", "test": "tst2013"}
        return [("stanford-iwslt15", "iwslt_text",
                 {(s, lang): f"{b}/{files[s]}.{lang}" for s in SPLITS for lang in (src, tgt)})]
    raise DataError(f"unknown data source {dataset!r}: known sources are ted_hrlr, ted_multi, iwslt15 "
                    "(set data.source in the pair's config)")
