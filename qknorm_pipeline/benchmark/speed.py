"""Speed and memory of every preset against fairseq's `transformer`, on a synthetic corpus.

    python -m qknorm_pipeline.benchmark speed [--dim 256 --layers 3 --reps 15 ...] --out results/benchmark

Builds every model in one process (same synthetic corpus, dictionary, batch, dimensions and
dropout) and measures them interleaved, the order rotating each repetition:
  - training: target tokens per second of forward + backward + Adam step, after warm-up steps;
  - peak memory: on CUDA torch.cuda.max_memory_allocated over the training steps; on CPU (no
    allocator statistics) the bytes of parameters, gradients, Adam state and the tensors autograd
    saves for backward in one step (distinct storages), i.e. the memory a training step must hold;
  - decoding: sentences per second of fairseq's beam search (beam 4), every hypothesis forced to
    the same length (min_len = max_len) so untrained models do the same amount of work.
Time is CUDA-synchronised wall-clock on a GPU and process CPU time on a CPU (scripts/benchmark.sh
runs one thread): on a shared CPU the wall-clock of a step varied 2-3x between repetitions.
The speed of a shared CPU drifts by 20-30% over tens of seconds, so every measurement is short
(2 training steps, 1 decoded batch) and repeated often (15 repetitions by default), each model
warmed up once beforehand.
Writes PREFIX.json and PREFIX.md (median, quartiles, min, max, ratio of medians to the stock model).
"""
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime

import torch

from .. import recipes
from ..cli import UsageError
from ..files import write_atomic
from ..hardware import machine_info
from ..paths import USER_DIR, shareable

HELP = "training/decoding speed and memory of every preset vs stock transformer"
STOCK = recipes.STOCK_ARCH
SLOW_TARGET = {"transformer_dnas": 0.80, "transformer_hnas": 0.80}  # every other preset: 0.95
METRICS = ("train_tok_s", "decode_sent_s", "peak_mem_mb")


def target_ratio(arch):
    return SLOW_TARGET.get(arch, 0.95)


# ---------------------------------------------------------------- data and models

def make_corpus(folder, vocab, n_sent, seed=0):
    """A random parallel corpus with `vocab` word types per side, binarized with a joined dictionary."""
    from fairseq import options
    from fairseq_cli import preprocess

    g = torch.Generator().manual_seed(seed)
    raw = os.path.join(folder, "raw")
    os.makedirs(raw, exist_ok=True)
    for split in ("train", "valid"):
        for lang in ("src", "tgt"):
            ids = torch.randint(0, vocab, (n_sent, 12), generator=g).tolist()
            with open(os.path.join(raw, f"{split}.{lang}"), "w") as f:
                # every type appears at least once so the dictionary (and output layer) has `vocab` types
                f.write(" ".join(f"w{i}" for i in range(vocab)) + "\n")
                f.writelines(" ".join(f"w{i}" for i in row) + "\n" for row in ids)
    parser = options.get_preprocessing_parser()
    args = parser.parse_args(["--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
                              "--validpref", f"{raw}/valid", "--destdir", os.path.join(folder, "bin"),
                              "--joined-dictionary", "--workers", "1"])
    preprocess.main(args)
    return os.path.join(folder, "bin")


def dropouts(opts, arch):
    """(dropout, attention dropout, activation dropout) of ARCH: --dropout for all three, or the
    stock model's own --stock-dropout."""
    if arch == STOCK and opts.stock_dropout:
        return tuple(opts.stock_dropout)
    return (opts.dropout,) * 3


def model_flags(opts, arch):
    drop, attn, act = dropouts(opts, arch)
    return [*recipes.size_args(opts.dim, opts.ffn or 4 * opts.dim, opts.layers, opts.layers, opts.heads),
            "--share-all-embeddings", "--dropout", drop, "--attention-dropout", attn, "--activation-dropout", act]


def build(data_bin, arch, opts):
    """ARCH's model, criterion and optimizer in this process. The argument list only configures
    fairseq's task and model (the synthetic corpus, dimensions, dropout, criterion): no fairseq-train
    runs, so the recipes' training flags (recipes.train_args) have nothing to do here."""
    from fairseq import options, tasks

    extra = [] if arch == STOCK else ["--qknorm-length", opts.src_len]
    argv = [data_bin, "--user-dir", USER_DIR, "--arch", arch, "--source-lang", "src", "--target-lang", "tgt",
            "--criterion", "masked_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            *model_flags(opts, arch), *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args).to(opts.device)
    criterion = task.build_criterion(args).to(opts.device)
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    return {"model": model, "criterion": criterion, "optim": optim, "task": task}


def make_batch(task, bsz, src_len, tgt_len, device, seed):
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(d.nspecial, len(d), (bsz, src_len), generator=g)
    src[:, -1] = d.eos()
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    tgt[:, -1] = d.eos()
    prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)  # fairseq's shifted target: EOS first
    sample = {"id": torch.arange(bsz), "nsentences": bsz, "ntokens": bsz * tgt_len,
              "net_input": {"src_tokens": src, "src_lengths": torch.full((bsz,), src_len), "prev_output_tokens": prev},
              "target": tgt}
    return move(sample, device)


def move(obj, device):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------- measurements

def clock(opts):
    """CUDA: wall-clock. CPU: this process's CPU time, which other jobs on a shared machine do not
    inflate (a process waiting for a core accrues none); run with one thread so it equals the work."""
    return time.perf_counter() if opts.device.startswith("cuda") else time.process_time()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def autocast(opts):
    if opts.dtype == "bf16":
        return torch.autocast(device_type=opts.device.split(":")[0], dtype=torch.bfloat16)
    return torch.autocast(device_type="cpu", enabled=False)


# Dense (no sparsity) tensor-core peaks from NVIDIA's data sheets, TFLOP/s, SXM parts.
PEAK_TFLOPS = {("H100", "bf16"): 989.4, ("H200", "bf16"): 989.4, ("A100", "bf16"): 312.0,
               ("H100", "fp32"): 66.9, ("H200", "fp32"): 66.9, ("A100", "fp32"): 19.5}


def peak_tflops(gpu, dtype):
    for (name, dt), value in PEAK_TFLOPS.items():
        if gpu and name in gpu and dt == dtype:
            return value
    return None


def step_flops(entry, sample, opts):
    """Matrix FLOPs of one training step (forward + backward), as counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    entry["model"].train()
    with FlopCounterMode(display=False) as counter:
        train_step(entry, sample, opts)
    return counter.get_total_flops()


def train_step(entry, sample, opts):
    model, criterion, optim = entry["model"], entry["criterion"], entry["optim"]
    with autocast(opts):
        loss, _, _ = criterion(model, sample)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()


def state_bytes(entry):
    n = 0
    for p in entry["model"].parameters():
        n += 2 * p.numel() * p.element_size()  # parameter + gradient
    for st in entry["optim"].state.values():
        n += sum(t.numel() * t.element_size() for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
    return n


def saved_activation_bytes(entry, sample, opts):
    """Bytes of the distinct storages autograd keeps for backward during one training forward."""
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        # detached: returning `t` itself makes a saved output hold its own grad_fn, a cycle autograd
        # never frees (it leaked ~90 MB per call); returning nothing would free storages early and
        # let later tensors reuse (and be counted at) the same address
        return t.detach()

    model, criterion = entry["model"], entry["criterion"]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(opts):
        loss, _, _ = criterion(model, sample)
    del loss
    return sum(seen.values())


def warm_up(entry, sample, opts):
    """Warm-up training steps (allocator, Adam state) and one warm-up decode, once per model."""
    entry["model"].train()
    for _ in range(opts.warmup_steps):
        train_step(entry, sample, opts)
    entry["generator"] = make_generator(entry, opts)
    decode(entry, sample, opts)
    sync(opts.device)


def measure_train(entry, sample, opts):
    entry["model"].train()
    cuda = opts.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = clock(opts)
    for _ in range(opts.train_steps):
        train_step(entry, sample, opts)
    sync(opts.device)
    elapsed = clock(opts) - t0
    if cuda:
        mem = torch.cuda.max_memory_allocated()
    else:
        mem = state_bytes(entry) + saved_activation_bytes(entry, sample, opts)
    return sample["ntokens"] * opts.train_steps / elapsed, mem / 2 ** 20


def make_generator(entry, opts):
    from fairseq.sequence_generator import SequenceGenerator

    L = opts.tgt_len
    return SequenceGenerator([entry["model"]], entry["task"].target_dictionary, beam_size=opts.beam,
                             max_len_a=0, max_len_b=L, min_len=L)


@torch.no_grad()
def decode(entry, sample, opts):
    model = entry["model"]
    model.eval()
    net = {"net_input": {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}}
    with autocast(opts):
        out = entry["generator"].generate([model], net)
    bsz = sample["net_input"]["src_tokens"].size(0)
    assert len(out) == bsz and all(len(h[0]["tokens"]) == opts.tgt_len + 1 for h in out), "forced-length decoding failed"


def measure_decode(entry, sample, opts):
    sync(opts.device)
    t0 = clock(opts)
    for _ in range(opts.decode_batches):
        decode(entry, sample, opts)
    sync(opts.device)
    return sample["net_input"]["src_tokens"].size(0) * opts.decode_batches / (clock(opts) - t0)


# ---------------------------------------------------------------- environment and report

def summarise(values):
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values),
            "runs": values}


def speed_markdown(res):
    m, s = res["machine"], res["settings"]
    lines = ["# Speed and memory benchmark", "",
             f"Command: `{res['command']}`  ", f"Date: {res['date']}  ",
             f"Machine: {m['cpu']} ({m['cpu_count']} CPUs, {m['torch_threads']} torch threads)"
             + (f", GPU {m['gpu']} (CUDA {m['cuda']})" if "gpu" in m else "")
             + f"; load average at start {m['load_average_start'][0]:.2f}, at end {m['load_average_end'][0]:.2f}  ",
             f"Software: Python {m['python']}, torch {m['torch']}, fairseq {m['fairseq']}; device {m['device']}, "
             f"{m['dtype']}  ",
             f"Models: d={s['dim']}, d_ff={s['ffn']}, {s['layers']}+{s['layers']} layers, {s['heads']} heads, "
             f"joined vocabulary {s['vocab']} types, shared embeddings, dropout {s['dropout']} "
             "(dropout, attention and activation dropout alike for every model"
             + (f", but the stock model's {' / '.join(f'{x:g}' for x in s['stock_dropout'])}"
                if s.get("stock_dropout") else "")
             + "; the presets keep their own word dropout and target-vocabulary mask)  ",
             f"Training: batch {s['batch']} sentences x {s['src_len']} source / {s['tgt_len']} target tokens, "
             f"{s['warmup_steps']} warm-up steps per model, then {s['train_steps']} timed Adam steps per repetition; "
             f"decoding: beam {s['beam']}, "
             f"{s['decode_batches']} batches of {s['batch']} sentences, hypotheses forced to {s['tgt_len']} tokens. "
             f"{s['reps']} interleaved repetitions; median [interquartile range]; ratio = median / median of stock "
             f"fairseq `{STOCK}`.  ",
             f"Timing: {res['timing_method']}  ",
             f"Peak memory: {res['memory_method']}", "",
             "MFU: matrix FLOPs of a training step (torch FlopCounterMode) x median steps/s / "
             + (f"{res['peak_tflops']:g} TFLOP/s dense peak" if res.get("peak_tflops") else "no known peak"), "",
             "| model | train tok/s | ratio | decode sent/s | ratio | peak MB | ratio | TFLOP/s | MFU | target | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    def flop(r):
        if "train_tflops" not in r:
            return " | "
        return f"{r['train_tflops']:.1f} | " + (f"{r['mfu']:.1%}" if r.get("mfu") is not None else "")

    for arch, r in res["models"].items():
        def cell(k, r=r):
            v = r[k]
            return f"{v['median']:.1f} [{v['q1']:.1f}-{v['q3']:.1f}]"
        if arch == STOCK:
            lines.append(f"| {arch} (stock) | {cell('train_tok_s')} | 1 | {cell('decode_sent_s')} | 1 | "
                         f"{cell('peak_mem_mb')} | 1 | {flop(r)} | | |")
            continue
        rt = r["ratio"]
        lines.append(f"| {arch} | {cell('train_tok_s')} | {rt['train_tok_s']:.2f} | {cell('decode_sent_s')} | "
                     f"{rt['decode_sent_s']:.2f} | {cell('peak_mem_mb')} | {rt['peak_mem_mb']:.2f} | {flop(r)} | "
                     f">= {r['target']:.2f} | {'yes' if r['meets_target'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def run(opts):
    from qknorm_fairseq.architectures import PRESETS

    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device; use --device cpu")
    if opts.dtype == "bf16" and not opts.device.startswith("cuda"):
        raise UsageError("--dtype bf16 is for --device cuda; a CPU benchmark runs in fp32")
    archs = [STOCK] + (opts.archs or list(PRESETS))
    unknown = [a for a in archs[1:] if a not in PRESETS]
    if unknown:
        raise UsageError(f"--archs: unknown preset {unknown[0]!r}; choose from {' '.join(PRESETS)}")
    info = machine_info(opts.device, opts.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        data_bin = make_corpus(tmp, opts.vocab, n_sent=50)
        entries = {}
        for arch in archs:
            print(f"[benchmark] building {arch}", file=sys.stderr, flush=True)
            entries[arch] = build(data_bin, arch, opts)
    vocab = len(entries[STOCK]["task"].target_dictionary)
    sample = make_batch(entries[STOCK]["task"], opts.batch, opts.src_len, opts.tgt_len, opts.device, seed=1)
    flops = {}
    for arch in archs:
        warm_up(entries[arch], sample, opts)
        flops[arch] = step_flops(entries[arch], sample, opts)
    runs = {a: {k: [] for k in METRICS} for a in archs}
    # Short measurements, many repetitions, order rotating: the speed of a shared CPU drifts by
    # 20-30% over tens of seconds, so each model is timed often and close to every other.
    for rep in range(opts.reps):
        shift = rep % len(archs)
        for arch in archs[shift:] + archs[:shift]:  # rotate the order: no model always runs first
            tok_s, mem = measure_train(entries[arch], sample, opts)
            sent_s = measure_decode(entries[arch], sample, opts)
            for k, v in zip(METRICS, (tok_s, sent_s, mem)):
                runs[arch][k].append(v)
            print(f"[benchmark] rep {rep + 1}/{opts.reps} {arch}: {tok_s:.0f} tok/s train, {sent_s:.1f} sent/s "
                  f"decode, {mem:.1f} MB", file=sys.stderr, flush=True)
    info["load_average_end"] = list(os.getloadavg())
    models = {}
    peak = opts.peak_tflops if opts.peak_tflops is not None else peak_tflops(info.get("gpu"), opts.dtype)
    for arch in archs:
        models[arch] = {k: summarise(runs[arch][k]) for k in METRICS}
        # model FLOPs utilisation: matrix FLOPs of one training step (forward + backward, counted by
        # torch's FlopCounterMode) at the median step rate, over the device's dense peak
        tflops = flops[arch] * models[arch]["train_tok_s"]["median"] / sample["ntokens"] / 1e12
        models[arch]["train_tflops"] = tflops
        models[arch]["mfu"] = tflops / peak if peak else None
    for arch in archs[1:]:
        r = models[arch]
        r["ratio"] = {k: r[k]["median"] / models[STOCK][k]["median"] for k in METRICS}
        r["target"] = target_ratio(arch)
        r["meets_target"] = bool(r["ratio"]["train_tok_s"] >= r["target"] and r["ratio"]["decode_sent_s"] >= r["target"])
    settings = {k: getattr(opts, k) for k in ("dim", "layers", "heads", "dropout", "stock_dropout", "batch", "src_len", "tgt_len",
                                              "warmup_steps", "train_steps", "decode_batches", "beam", "reps")}
    settings.update(ffn=opts.ffn or 4 * opts.dim, vocab=vocab)
    res = {"command": "python -m qknorm_pipeline.benchmark " + " ".join(shareable(a) for a in sys.argv[1:]),
           "date": datetime.now().astimezone().isoformat(timespec="seconds"), "machine": info, "settings": settings,
           "memory_method": ("torch.cuda.max_memory_allocated over the timed training steps"
                             if opts.device.startswith("cuda") else
                             "CPU estimate = parameters + gradients + Adam state + distinct storages saved "
                             "by autograd for backward in one training forward"),
           "timing_method": ("wall-clock (CUDA synchronised)" if opts.device.startswith("cuda") else
                             "process CPU time (time.process_time), not inflated by other jobs on a shared CPU"),
           "stock": STOCK, "peak_tflops": peak, "models": models}
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    write_atomic(opts.out + ".json", json.dumps(res, indent=1) + "\n")
    write_atomic(opts.out + ".md", speed_markdown(res))
    print(speed_markdown(res))
    return res


def add_arguments(s):
    s.add_argument("--dim", type=int, default=256)
    s.add_argument("--ffn", type=int, help="feed-forward size (default 4 * dim)")
    s.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--vocab", type=int, default=4000, help="word types of the synthetic corpus")
    s.add_argument("--dropout", type=float, default=0.1, help="dropout, attention and activation dropout, all models")
    s.add_argument("--stock-dropout", type=float, nargs=3, metavar=("D", "A", "R"),
                   help="the stock model's own dropout, attention and activation (ReLU) dropout instead of "
                        "--dropout, e.g. 0.3 0 0 for fairseq's IWSLT recipe against the TwT recipe's --dropout 0.4")
    s.add_argument("--batch", type=int, default=16, help="sentences per batch")
    s.add_argument("--src-len", type=int, default=24)
    s.add_argument("--tgt-len", type=int, default=24)
    s.add_argument("--warmup-steps", type=int, default=2)
    s.add_argument("--train-steps", type=int, default=2)
    s.add_argument("--decode-batches", type=int, default=1)
    s.add_argument("--beam", type=int, default=4)
    s.add_argument("--reps", type=int, default=15)
    s.add_argument("--archs", nargs="+", help="presets to compare (default: all)")
    s.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU)")
    s.add_argument("--dtype", choices=("fp32", "bf16"), help="default: bf16 on a GPU, fp32 on a CPU")
    s.add_argument("--threads", type=int, help="torch CPU threads (default: 1)")
    s.add_argument("--peak-tflops", type=float,
                   help="the device's dense peak for --dtype, for the MFU column (default: known H100/H200/A100 values)")
    s.add_argument("--out", help="writes OUT.json and OUT.md (default: $RESULTS_DIR/benchmark)")
