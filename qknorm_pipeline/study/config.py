"""A study's structured config (configs/studies/*.yaml), its runs and their training commands."""
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .. import recipes
from ..cli import UsageError
from ..data.common import SPLITS
from ..names import folder_name, run_name
from ..paths import ROOT, shareable

DEFAULT = os.path.join(ROOT, "configs", "studies", "gl-en.yaml")


class StudyError(UsageError):
    """A study that cannot run or be reported as asked: the message names the fix."""


@dataclass
class ModelSize:
    embed_dim: int = recipes.ranged("???", at_least=1)
    ffn_dim: int = recipes.ranged("???", at_least=1)
    layers: int = recipes.ranged("???", at_least=1)
    heads: int = recipes.ranged("???", at_least=1, divides="embed_dim")


@dataclass
class Budget:
    max_update: int = recipes.ranged("???", at_least=1)
    warmup_updates: int = recipes.ranged("???", at_least=0)
    validate_every: int = recipes.ranged("???", at_least=1)


@dataclass
class DevBleu:
    beam: int = recipes.ranged(1, at_least=1)
    max_len_a: int = recipes.ranged(1, at_least=0)
    max_len_b: int = recipes.ranged(50, at_least=0)


@dataclass
class Ours:
    """One of our systems: a preset with the pair's recipe."""

    arch: str = "???"
    stopping: str = "???"
    seeds: int = recipes.ranged("???", at_least=1)


@dataclass
class StockRow:
    seeds: int = recipes.ranged("???", at_least=1)
    flags: Dict[str, Any] = field(default_factory=dict)  # added to the stock recipe's flags


@dataclass
class Stock:
    iwslt: bool = False  # the stock recipe's (configs/base.yaml stock:) fairseq IWSLT recipe, or one_recipe: alone
    rows: Dict[str, StockRow] = field(default_factory=dict)


@dataclass
class OneRecipe:
    """One training recipe for every system: fairseq-train flags that every row gets (ours after the
    pair recipe's, so they win; the stock rows with their own), and plugin flags that ours get too."""

    flags: Dict[str, Any] = field(default_factory=dict)
    ours: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Claim:
    """An ordering a paper reports that the study's systems can test: BETTER scores above WORSE."""

    paper: str = "???"  # where, e.g. "TwT Table 3"
    better: str = "???"
    worse: str = "???"


@dataclass
class Corpus:
    """The study's corpus: a download (source: a dataset of qknorm_pipeline/data/sources.py, fetched
    for the study's pair) or a folder (dir:, relative to the repository root), not both; its line
    counts per split and sha256 per file, checked at every call where given. A study config may give
    instead the file name of another study config (beside it, else in configs/studies/), whose corpus
    it shares."""

    source: Optional[str] = None
    dir: Optional[str] = None
    expected_lines: Dict[str, int] = field(default_factory=dict)  # {train: N, dev: N, test: N}
    sha256: Dict[str, str] = field(default_factory=dict)  # {train.gl: HEX, ...}


@dataclass
class Study:
    name: str = "???"
    pair: str = "???"
    corpus: Corpus = field(default_factory=Corpus)
    model: ModelSize = field(default_factory=ModelSize)
    budget: Budget = field(default_factory=Budget)
    dev_bleu: DevBleu = field(default_factory=DevBleu)
    schedule: str = "???"
    systems: Dict[str, Ours] = field(default_factory=dict)
    stock: Stock = field(default_factory=Stock)
    one_recipe: OneRecipe = field(default_factory=OneRecipe)
    lr_multipliers: List[float] = field(default_factory=list)
    lr_grid: List[float] = field(default_factory=list)  # peak LRs: seed 1 at each, seeds 2.. at the best
    precision: str = "fp32"  # train.sh --precision of every run (stock rows: fairseq's --bf16 or --fp16)
    fast: bool = False  # train.sh --fast for our rows (a CPU only; stock rows cannot take those flags)
    optimizer: Optional[str] = None  # our rows' --optimizer; None: the pair recipe's
    claims: List[Claim] = field(default_factory=list)  # the report tests each (stats.claim_tests)
    closed: bool = False  # no more runs: study.sh trains none, the report lists those not recorded as not run
    config: str = ""  # the file, as the report names it


@dataclass(frozen=True)
class StudyRun:
    """One run of the study's plan (train.Run: how it is started)."""

    name: str
    system: str
    seed: int
    lr_multiplier: float
    stock: bool
    lr: Optional[float] = None  # a peak LR of the grid (lr_grid studies)

    @property
    def rate(self):
        """Where the run sits on its study's learning-rate axis: the grid's LR, else the multiplier."""
        return self.lr if self.lr is not None else self.lr_multiplier


def load(path):
    if not os.path.isfile(path):
        raise StudyError(f"study config {path!r} not found (see configs/studies/)")
    layer = recipes.read_yaml(path, StudyError)
    if isinstance(layer.get("corpus"), str):  # another study's corpus, by its config's file name
        beside = os.path.join(os.path.dirname(path), layer["corpus"])
        other = beside if os.path.isfile(beside) else os.path.join(os.path.dirname(DEFAULT), layer["corpus"])
        if not os.path.isfile(other):
            raise StudyError(f"{shareable(path)}: corpus: {layer['corpus']}: no such study config beside it or in "
                             "configs/studies/")
        layer["corpus"] = recipes.read_yaml(other, StudyError).get("corpus")
    cfg = recipes.structured(Study, [layer, {"config": shareable(path)}], shareable(path))
    folder_name(f"{shareable(path)}: name", cfg.name, StudyError)
    for system in cfg.systems:
        if system in cfg.stock.rows:
            raise StudyError(f"{shareable(path)}: {system!r} is both one of ours and a stock row")
    if cfg.precision not in recipes.PRECISIONS:
        raise StudyError(f"{shareable(path)}: precision {cfg.precision!r}: use one of {', '.join(recipes.PRECISIONS)}")
    if cfg.lr_grid and cfg.lr_multipliers:
        raise StudyError(f"{shareable(path)}: give lr_grid or lr_multipliers, not both")
    bad = [x for x in cfg.lr_grid + cfg.lr_multipliers if not x > 0]
    if bad:
        raise StudyError(f"{shareable(path)}: {'lr_grid' if cfg.lr_grid else 'lr_multipliers'}: {bad[0]:g} is not a "
                         "learning rate (each must be > 0)")
    if bool(cfg.corpus.source) == bool(cfg.corpus.dir):
        raise StudyError(f"{shareable(path)}: corpus: give source: (a download) or dir: (a folder), one of them")
    for key, known in (("expected_lines", SPLITS), ("sha256", corpus_files(cfg))):
        unknown = [k for k in getattr(cfg.corpus, key) if k not in known]
        if unknown:
            raise StudyError(f"{shareable(path)}: corpus: {key}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    for c in cfg.claims:
        for s in (c.better, c.worse):
            if s not in all_systems(cfg):
                raise StudyError(f"{shareable(path)}: claims: {s!r} ({c.paper}) is not one of its systems "
                                 f"({' '.join(all_systems(cfg))})")
    return cfg


def corpus_files(cfg):
    return [f"{split}.{lang}" for split in SPLITS for lang in cfg.pair.split("-")]


def all_systems(cfg):
    return [*cfg.systems, *cfg.stock.rows]


def best_rate(dev_by_lr):
    """The grid's best LR of one system from {lr: best dev BLEU of its seed-1 run}: the highest dev
    BLEU, a tie going to the smaller LR."""
    return min(dev_by_lr, key=lambda lr: (-dev_by_lr[lr], lr))


def _chosen(cfg, systems, seeds):
    """{system: its highest seed} of the chosen SYSTEMS (default: all): its own seeds, or SEEDS up to
    the most any chosen system has."""
    systems = systems or all_systems(cfg)
    for s in systems:
        if s not in all_systems(cfg):
            raise StudyError(f"--systems: {s!r} is not in {cfg.config} (have: {' '.join(all_systems(cfg))})")
    count = {s: cfg.systems[s].seeds if s in cfg.systems else cfg.stock.rows[s].seeds for s in systems}
    top = max(count.values())
    return {s: min(top, seeds or k) for s, k in count.items()}


def runs(cfg, systems=None, seeds=None, multipliers=True, best=None):
    """The study's runs in the order they train: seed by seed over every system, then each system at
    each LR multiplier (seed 1). In an lr_grid study: every system at each LR of the grid (seed 1),
    then seed by seed at each system's best rate, for the systems whose best rate BEST ({system: lr},
    records.best_rates) names: the others wait for their grid (waiting). SYSTEMS and SEEDS (the
    highest seed) restrict them."""
    count = _chosen(cfg, systems, seeds)
    stock = cfg.stock.rows
    if cfg.lr_grid:
        best = best or {}
        out = [StudyRun(run_name(s, 1, lr=lr), s, 1, 1.0, s in stock, lr) for lr in cfg.lr_grid for s in count]
        return out + [StudyRun(run_name(s, k, lr=best[s]), s, k, 1.0, s in stock, best[s])
                      for k in range(2, max(count.values()) + 1) for s in count if k <= count[s] and s in best]
    out = [StudyRun(run_name(s, k), s, k, 1.0, s in stock) for k in range(1, max(count.values()) + 1) for s in count
           if k <= count[s]]
    if multipliers:
        out += [StudyRun(run_name(s, 1, multiplier=m), s, 1, m, s in stock) for m in cfg.lr_multipliers for s in count]
    return out


def waiting(cfg, systems=None, seeds=None, best=None):
    """{system: [seeds]} of an lr_grid study's runs that cannot be named yet: those at the best rate
    of a system whose grid runs are not all recorded (BEST has no rate for it)."""
    if not cfg.lr_grid:
        return {}
    count = _chosen(cfg, systems, seeds)
    return {s: list(range(2, k + 1)) for s, k in count.items() if k > 1 and s not in (best or {})}


def budget(cfg, max_update=None):
    """(updates, warmup updates, validation interval) of the study, or of a --max-update override
    (a smoke run: warmup and interval scaled with it). The study's own warmup is a fixed number
    of updates, so that no schedule depends on max_update: raising it continues every run."""
    b = cfg.budget
    n = int(max_update or b.max_update)
    if n < 1:
        raise StudyError(f"--max-update must be >= 1, got {n}")
    if max_update is None:
        return n, b.warmup_updates, b.validate_every
    scale = n / b.max_update
    return n, max(1, round(b.warmup_updates * scale)), max(1, round(b.validate_every * scale))


def model_flags(m):
    return recipes.size_args(m.embed_dim, m.ffn_dim, m.layers, m.layers, m.heads)


def schedule_flags(cfg, max_update=None):
    n, warmup, interval = budget(cfg, max_update)
    dev = {"beam": cfg.dev_bleu.beam, "max_len_a": cfg.dev_bleu.max_len_a, "max_len_b": cfg.dev_bleu.max_len_b}
    return ["--max-update", str(n), "--warmup-updates", str(warmup), "--validate-interval-updates", str(interval),
            "--save-interval-updates", str(interval), "--eval-bleu-args", json.dumps(dev)]


def recipe(cfg, data_bin=None):
    """The pair's recipe with the study's systems in place of the recipe's own (configs/studies/*.yaml
    says why each differs)."""
    rec = recipes.load(cfg.pair, data_bin)
    rec.systems = {name: recipes.System(arch=s.arch, stopping=s.stopping) for name, s in cfg.systems.items()}
    if cfg.optimizer:
        rec.train.optimizer = cfg.optimizer
    return rec


def peak(cfg, rec):
    """The peak LR our systems get: the recipe schedule's own (TwT's rule with the recipe's warmup
    of 8,000) at the study's d, only reached sooner (configs/studies/gl-en.yaml says why)."""
    _, sched = recipes.schedule(rec, cfg.schedule)
    return recipes.schedule_peak(rec, sched, cfg.model.embed_dim)


def train_flags(cfg, run, rec, max_update=None):
    """Flags that turn the recipe of one of our systems into the study's: model size, budget, warmup,
    validation, and the peak LR (times the run's multiplier)."""
    if run.system not in cfg.systems:
        raise StudyError(f"{run.system!r} is not one of the study's systems: {', '.join(all_systems(cfg))}")
    lr = run.lr if run.lr is not None else peak(cfg, rec) * run.lr_multiplier
    one = {**cfg.one_recipe.flags, **cfg.one_recipe.ours}
    return [*model_flags(cfg.model), *schedule_flags(cfg, max_update), "--lr", f"{lr:.6g}", *recipes.flag_args(one)]


def stock_flags(cfg, rec, run):
    """A stock row's flags: the stock recipe's (with fairseq's IWSLT recipe, or the study's one
    recipe), the row's own, and the run's learning rate."""
    st = rec.stock
    flags = {**st.flags, **(st.iwslt if cfg.stock.iwslt else {}), **cfg.one_recipe.flags,
             **cfg.stock.rows[run.system].flags}
    if run.lr is not None:
        flags["lr"] = f"{run.lr:g}"
    elif run.lr_multiplier != 1.0:
        flags["lr"] = f"{float(flags['lr']) * run.lr_multiplier:g}"
    return flags


def precision_flags(cfg):
    """A stock row's precision flag: fairseq's own --bf16 (our rows get train.sh's --precision)."""
    return [] if cfg.precision == "fp32" else [f"--{cfg.precision}"]


def stock_args(cfg, run, rec, data_bin, save_dir, max_update=None):
    """fairseq-train's arguments for a stock row of the study."""
    return recipes.stock_args(rec, stock_flags(cfg, rec, run), data_bin, save_dir, run.seed,
                              [*model_flags(cfg.model), *schedule_flags(cfg, max_update), *precision_flags(cfg)])
