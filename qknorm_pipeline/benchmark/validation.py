"""fairseq-train's validation, timed at several validation batch sizes (--max-tokens-valid).

Our recipes validate by decoding the dev set (fairseq's --eval-bleu, the recipe's beam search) every
epoch of N updates. On a GPU that decoding is host-bound: each decoder call costs about the same
host time whatever its batch, so a validation's time follows its number of decoder calls (one per
batch for the loss, one per step of the search), which larger batches cut. This tool runs
fairseq-train's validation (the task's valid_step over fairseq's valid iterator, its BLEU from the
task's reduce_metrics) once per --max-tokens-valid value, the values alternating --reps times, and
prints for each: batches, decoder calls, seconds, sentences/s, dev BLEU (batches differ only in
padding, so BLEU agrees up to rounding), the time against the first value's, and how many dev
sentences the validation scored: fairseq (0.12, --required-batch-size-
multiple 8, its default) leaves out an incomplete last batch, i.e. the longest dev sentences
(fairseq's GitHub issue 5036; docs/training.md, "Dev BLEU").

The model: with --checkpoint, the run's own (its model, task and validation settings as stored in
the checkpoint, on --pair's prepared data); without, the pair recipe's SYSTEM as train.sh builds it, untrained (seeded), so
every hypothesis runs to its length limit: the slowest case, which the start of training resembles.
Records are appended to --out (default results/gpu/validation.json on a GPU,
results/validation-cpu.json on a CPU). `train.sh PAIR SYSTEM --max-tokens-valid N` trains with a
value this tool has measured.

Besides the decoder, the host turns every hypothesis and reference into text for BLEU: the tool
times that for its first validation's own tokens, the task's dictionary (the plugin's, from lists)
against fairseq's Dictionary.string (token by token from tensors); the first validation's time
includes keeping a copy of those tokens (one small copy a sequence). --profile counts one batch's
ATen ops and host-device syncs by phase, with their call sites (step_profile's counter).

--decoder-steps fairseq cached times the search with each decoder step of the task (its
--decoder-step: fairseq's incremental state, or the plugin's preallocated cache), one after the other
on the same batches (after one untimed batch with each), and checks that both make the same
hypotheses; a model the cached step cannot run (stock fairseq's) decodes with fairseq's, and its
records say so. --c-loops off on does the same with the plugin's C loops switched off and on (on a CPU,
a --fused-kernels model's decoding-step attention); the loops round otherwise, so hypotheses are compared
only among the steps of one setting.
"""
import argparse
import json
import os
import shlex
import statistics
import time
from datetime import datetime

from .. import train as train_step
from ..cli import UserError, log
from ..files import write_atomic
from ..hardware import device_name
from ..paths import USER_DIR, folders, shareable
from ..recipes import PRECISIONS
from .throughput import old_records

DECODER_STEPS = ("cached", "fairseq")  # the task's --decoder-step values (qknorm_fairseq/task.py); no fairseq import here
HELP = "fairseq-train's dev-set decoding at several --max-tokens-valid values (writes validation.json)"
DROPPED = {"--cpu": 0, "--bf16": 0, "--fp16": 0, "--log-format": 1, "--log-file": 1}  # flag: values it takes


def recipe_args(opts):
    """fairseq-train's arguments of the pair recipe's SYSTEM (train.sh's), without device, precision
    and logging flags: this tool sets the device and precision itself."""
    args = train_step.plan(opts.pair, opts.system, train_step.Options(extra=list(opts.extra)), check=False).fairseq_args
    out, i = [], 0
    while i < len(args):
        if args[i] in DROPPED:
            i += 1 + DROPPED[args[i]]
            continue
        out.append(args[i])
        i += 1
    return out


def build(opts, device):
    """(task, model, criterion, fairseq cfg) of the checkpoint, or of the recipe untrained."""
    import torch
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    if opts.checkpoint:
        if not os.path.isfile(opts.checkpoint):
            raise UserError(f"--checkpoint {opts.checkpoint}: no such file; name a checkpoint_*.pt of a run")
        utils.import_user_module(argparse.Namespace(user_dir=USER_DIR))
        data_bin = os.path.join(folders().data_bin, opts.pair)
        if not os.path.isdir(data_bin):
            raise UserError(f"no prepared data in {shareable(data_bin)}: bash scripts/prepare.sh {opts.pair} first")
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([opts.checkpoint],
                                                                          arg_overrides={"data": data_bin})
        model = models[0]
    else:
        args = recipe_args(opts)
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))
        task = tasks.setup_task(cfg.task)
        torch.manual_seed(cfg.common.seed)
        model = task.build_model(cfg.model)
    if not getattr(cfg.task, "eval_bleu", False):
        raise UserError(f"{opts.checkpoint or opts.system}: its validation does not decode (no --eval-bleu), so "
                        "there is nothing to time; use a run of a recipe that validates by dev BLEU")
    task.load_dataset(opts.subset)
    criterion = task.build_criterion(cfg.criterion)
    model = model.to(device)
    if opts.precision == "bf16":
        model = model.bfloat16()
    elif opts.precision == "fp16":
        model = model.half()
    model.eval()
    return task, model, criterion, cfg


def generators(task, model, cfg, decoder_steps):
    """{decoder step: the validation's generator built by the task with that --decoder-step} and a list
    whose first item counts the search's decoder steps of them all; each generator's `step` says which
    step it runs (a model the cached step cannot run gets fairseq's)."""
    from qknorm_fairseq.decoder_cache import CachedEnsemble

    calls, out = [0], {}
    for step in decoder_steps:
        task.cfg.decoder_step = step
        gen = task.build_generator([model], argparse.Namespace(**json.loads(cfg.task.eval_bleu_args or "{}")))
        forward = gen.model.forward_decoder

        def counted(*args, _forward=forward, **kwargs):
            calls[0] += 1
            return _forward(*args, **kwargs)

        gen.model.forward_decoder = counted
        gen.step = "cached" if isinstance(gen.model, CachedEnsemble) else "fairseq"
        out[step] = gen
    return out, calls


def capture_strings(dictionary):
    """Record every call of DICTIONARY.string (the token sequences BLEU turns into text) in the list
    returned, the tokens copied to the host."""
    import torch

    calls, string = [], dictionary.string

    def recorded(tokens, *args, **kwargs):
        calls.append((tokens.detach().cpu().clone() if torch.is_tensor(tokens) else tokens, args, kwargs))
        return string(tokens, *args, **kwargs)

    dictionary.string = recorded
    return calls, lambda: setattr(dictionary, "string", string)


def time_strings(dictionary, calls, reps=3):
    """Seconds (median of REPS) to turn CALLS' tokens into text: DICTIONARY's own string (the
    plugin's, on a translation_qk task) against fairseq's Dictionary.string; refuses to report if
    the texts differ."""
    from fairseq.data import Dictionary

    ways = {"task": dictionary.string, "fairseq": lambda *a, **kw: Dictionary.string(dictionary, *a, **kw)}
    seconds, texts = {w: [] for w in ways}, {}
    for _ in range(reps):
        for way, string in ways.items():
            start = time.perf_counter()
            texts[way] = [string(t, *a, **kw) for t, a, kw in calls]
            seconds[way].append(time.perf_counter() - start)
    if texts["task"] != texts["fairseq"]:
        raise RuntimeError("the task's dictionary and fairseq's Dictionary.string made different texts of the same tokens")
    return {w: statistics.median(s) for w, s in seconds.items()}


def profile_batch(task, model, criterion, sample, steps):
    """ATen ops and host-device syncs of one validation batch, by phase: the encoder, the decoder's
    calls (the loss's forward and the search's steps, their log-probabilities included), the beam's
    reordering of the decoder's cache (and of the encoder output), BLEU's token strings, and the rest
    (the search's own bookkeeping, the loss, BLEU's counts). Syncs are the ops step_profile counts
    (reads of a device value, data-dependent shapes); copies by .cpu() and .tolist() are not ops
    a CPU dispatches, so a CPU leaves them out."""
    from collections import Counter

    from .step_profile import OpCounter, phased

    counter = OpCounter()
    ensemble = task.sequence_generator.model
    saved = [(obj, name, getattr(obj, name)) for obj, name in (
        (model.encoder, "forward"), (model.decoder, "forward"), (ensemble, "forward_decoder"),
        (ensemble, "reorder_incremental_state"), (ensemble, "reorder_encoder_out"), (task.tgt_dict, "string"))]
    for (obj, name, fn), phase in zip(saved, ("encoder", "decoder", "decoder", "reorder", "reorder", "strings")):
        setattr(obj, name, phased(counter, phase, fn))
    steps[0] = 0
    try:
        with counter:
            task.valid_step(sample, model, criterion)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    syncs = [s for s in counter.syncs if s["kind"] == "sync"]
    return {"sentences": int(sample["nsentences"]), "decoder_calls": steps[0] + 1,  # + the loss's forward
            "ops": {phase: counter.ops[phase] for phase in ("encoder", "decoder", "reorder", "strings", "other")},
            "syncs": dict(Counter(s["phase"] for s in syncs)),
            "sync_sites": dict(Counter(f"{s['op']} {s['where']}" for s in syncs).most_common(8))}


def valid_batches(task, model, cfg, max_tokens, subset):
    """fairseq-train's valid iterator over SUBSET in batches of at most MAX_TOKENS tokens."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=max_tokens, max_sentences=cfg.dataset.batch_size_valid,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0, disable_iterator_cache=True).next_epoch_itr(shuffle=False)


def validate_once(task, model, criterion, cfg, max_tokens, subset, device, steps):
    """One pass of fairseq-train's validation over SUBSET in batches of at most MAX_TOKENS tokens, with
    the task's current sequence_generator: {batches, decoder_calls (the loss's forward of each batch and
    every step of the search), seconds, sentences, of_sentences, bleu} and the hypotheses' tokens."""
    import torch
    from fairseq import metrics

    itr = valid_batches(task, model, cfg, max_tokens, subset)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    logs, batches, steps[0] = [], 0, 0
    hypotheses, generate = [], task.sequence_generator.generate

    def kept(*args, **kwargs):
        out = generate(*args, **kwargs)
        hypotheses.extend([h["tokens"].tolist() for h in hypos] for hypos in out)
        return out

    task.sequence_generator.generate = kept
    sync()
    start = time.perf_counter()
    try:
        for sample in itr:
            sample = to_device(sample, device)
            logs.append(task.valid_step(sample, model, criterion)[2])
            batches += 1
        sync()
    finally:
        del task.sequence_generator.generate
    seconds = time.perf_counter() - start
    with metrics.aggregate(new_root=True) as agg:
        task.reduce_metrics(logs, criterion)
        bleu = agg.get_smoothed_values()["bleu"]  # fairseq's, rounded to 2 decimals
    return {"batches": batches, "decoder_calls": steps[0] + batches, "seconds": seconds,
            "sentences": sum(int(log_["nsentences"]) for log_ in logs), "of_sentences": len(task.dataset(subset)),
            "bleu": bleu}, hypotheses


def to_device(sample, device):
    from fairseq import utils

    return utils.move_to_cuda(sample) if device == "cuda" else sample


def profile_text(p):
    calls = p["decoder_calls"]
    per_call = ", ".join(f"{phase} {n / calls:.0f}" for phase, n in p["ops"].items())
    sites = "; ".join(f"{n} {site}" for site, n in p["sync_sites"].items())
    return (f"profile of one batch ({p['sentences']} sentences, {calls} decoder calls): ATen ops per decoder call: "
            f"{per_call}; syncs by phase {p['syncs']}; sites: {sites}")


def run(opts):
    import torch

    if min(opts.max_tokens_valid) < 1:
        raise UserError(f"--max-tokens-valid {min(opts.max_tokens_valid)}: a batch holds at least 1 token")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    opts.precision = opts.precision or ("bf16" if gpu else "fp32")
    if not gpu:
        train_step.check_cpu_precision(opts.precision)
    name = device_name(gpu)
    out = opts.out or os.path.join(folders().results, "gpu/validation.json" if gpu else "validation-cpu.json")
    old_records(out)  # a file the records cannot be appended to is refused before the measuring
    task, model, criterion, cfg = build(opts, device)
    dataset = task.dataset(opts.subset)
    longest = int(max(dataset.num_tokens(i) for i in range(len(dataset))))
    if min(opts.max_tokens_valid) < longest:
        raise UserError(f"--max-tokens-valid {min(opts.max_tokens_valid)}: the longest {opts.subset} sentence has "
                        f"{longest} tokens, and fairseq refuses a batch smaller than a sentence; use at least "
                        f"{longest}")
    from qknorm_fairseq import native

    gens, steps = generators(task, model, cfg, opts.decoder_steps)
    for step, gen in gens.items():
        if gen.step != step:
            log("benchmark", f"--decoder-steps {step}: this model decodes with fairseq's step (see the task's log)")
    variants = [(step, gen, loops) for loops in opts.c_loops for step, gen in gens.items()]
    if len(variants) > 1:
        # untimed, one batch with each: a process's first decoding pays one-time costs (first use of the
        # kernels and allocations), which would otherwise fall on whichever runs first
        warm = to_device(next(iter(valid_batches(task, model, cfg, opts.max_tokens_valid[0], opts.subset))), device)
        for _, gen, loops in variants:
            task.sequence_generator = gen
            with native.enabled(loops == "on"):
                task.valid_step(warm, model, criterion)
    calls, stop_capturing = capture_strings(task.tgt_dict)
    found = {(mt, step, loops): [] for mt in opts.max_tokens_valid for step, _, loops in variants}
    for rep in range(1, opts.reps + 1):
        for mt in opts.max_tokens_valid:
            first = {}  # per C loops setting: its first step's hypotheses (the loops round otherwise)
            for step, gen, loops in variants:
                task.sequence_generator = gen
                with native.enabled(loops == "on"):
                    r, hypotheses = validate_once(task, model, criterion, cfg, mt, opts.subset, device, steps)
                stop_capturing()
                first.setdefault(loops, hypotheses)
                r.update(decoder_step=gen.step, c_loops=loops, same_hypotheses=hypotheses == first[loops])
                found[mt, step, loops].append(r)
                which = f"{gen.step} decoder step" + (f", C loops {loops}" if len(opts.c_loops) > 1 else "")
                log("benchmark", f"rep {rep}/{opts.reps} --max-tokens-valid {mt}, {which}: "
                                 f"{r['batches']} batches, {r['decoder_calls']} decoder calls, {r['seconds']:.1f} s, "
                                 f"BLEU {r['bleu']:.2f} ({r['sentences']} of {r['of_sentences']} sentences)")
                if not r["same_hypotheses"]:
                    log("benchmark", f"error: the {gen.step} decoder step made other hypotheses than the "
                                     f"{next(iter(gens.values())).step} step on the same batches")
    strings = time_strings(task.tgt_dict, calls)
    log("benchmark", f"BLEU's token strings of a validation ({len(calls)} sequences): {strings['task']:.3f} s, "
                     f"fairseq's Dictionary.string {strings['fairseq']:.3f} s ({strings['fairseq'] / strings['task']:.1f}x)")
    profiles = {}
    if opts.profile:
        sample = next(iter(valid_batches(task, model, cfg, opts.max_tokens_valid[0], opts.subset)))
        for step, gen in gens.items():
            task.sequence_generator = gen
            with native.enabled(opts.c_loops[0] == "on"):
                profiles[step] = {"decoder_step": gen.step,
                                  **profile_batch(task, model, criterion, to_device(sample, device), steps)}
            log("benchmark", f"{gen.step} decoder step: {profile_text(profiles[step])}")
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    model_name = shareable(opts.checkpoint) if opts.checkpoint else f"{opts.system} untrained (seed {cfg.common.seed})"
    flags = {} if opts.checkpoint else {"flags": list(opts.extra)}
    records = [{"pair": opts.pair, "model": model_name, **flags, "subset": opts.subset, "max_tokens_valid": mt, **r,
                "command": command(opts), "strings_seconds": strings,
                "sentences_per_s": r["sentences"] / r["seconds"], "rep": i + 1, "device": name,
                "precision": opts.precision, "label": opts.label, "date": date,
                # one batch of the first size, profiled with each decoder step: in its first record
                **({"profile": profiles[step]} if step in profiles and mt == opts.max_tokens_valid[0] and i == 0
                   and loops == opts.c_loops[0] else {})}
               for (mt, step, loops), rs in found.items() for i, r in enumerate(rs)]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, json.dumps(old_records(out) + records, indent=1) + "\n")
    print(table(found, opts.reps))
    if profiles:
        print("\n" + profile_table(profiles))
    print(f"\n{opts.pair} {opts.subset}, {model_name}, {opts.precision}, {name}; appended to {shareable(out)}")
    return records


def command(opts):
    """The benchmark command of a record (its options as given or defaulted, --out left out)."""
    source = ["--checkpoint", shareable(opts.checkpoint)] if opts.checkpoint else ["--system", opts.system]
    words = ["bash", "scripts/benchmark.sh", "validation", "--pair", opts.pair, *source, "--subset", opts.subset,
             "--max-tokens-valid", *map(str, opts.max_tokens_valid), "--reps", str(opts.reps),
             "--precision", opts.precision, *(["--profile"] if opts.profile else []),
             *(["--decoder-steps", *opts.decoder_steps] if opts.decoder_steps != ["cached"] else []),
             *(["--c-loops", *opts.c_loops] if opts.c_loops != ["on"] else []),
             *(["--", *opts.extra] if opts.extra else [])]
    return shlex.join(words)


def table(found, reps):
    """A row per --max-tokens-valid value, decoder step and C loops setting: the first repetition's counts, the
    median seconds, whether the hypotheses are the first step's (with the same C loops setting)."""
    first = statistics.median(r["seconds"] for r in next(iter(found.values())))
    lines = [f"| --max-tokens-valid | decoder step | C loops | batches | decoder calls | seconds (median of {reps}) "
             "| sentences/s | dev BLEU | sentences scored | time vs the first | hypotheses as the first step's |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (mt, _, loops), rs in found.items():
        s = statistics.median(r["seconds"] for r in rs)
        lines.append(f"| {mt} | {rs[0]['decoder_step']} | {loops} | {rs[0]['batches']} | {rs[0]['decoder_calls']} | {s:.2f} | "
                     f"{rs[0]['sentences'] / s:.1f} | {rs[0]['bleu']:.2f} | {rs[0]['sentences']} of "
                     f"{rs[0]['of_sentences']} | {s / first:.2f} | "
                     f"{'yes' if all(r['same_hypotheses'] for r in rs) else 'NO'} |")
    return "\n".join(lines)


def profile_table(profiles):
    """ATen ops per decoder call of the profiled batch, by phase and in all, per decoder step."""
    phases = ("encoder", "decoder", "reorder", "strings", "other")
    lines = [f"| decoder step | ATen ops per decoder call: {' | '.join(phases)} | all | syncs |",
             "|---|" + "---|" * (len(phases) + 2)]
    for p in profiles.values():
        calls = p["decoder_calls"]
        lines.append(f"| {p['decoder_step']} | " + " | ".join(f"{p['ops'][ph] / calls:.0f}" for ph in phases)
                     + f" | {sum(p['ops'].values()) / calls:.0f} | {sum(p['syncs'].values())} |")
    return "\n".join(lines)


def add_arguments(s):
    s.add_argument("--pair", default="gl-en", help="a prepared pair (default gl-en)")
    s.add_argument("--system", default="scalenorm", help="the recipe's system, used without --checkpoint "
                                                         "(default scalenorm)")
    s.add_argument("--checkpoint", help="a run's checkpoint: its own model and validation settings (default: "
                                        "the recipe's SYSTEM, untrained)")
    s.add_argument("--max-tokens-valid", type=int, nargs="+", default=[4096, 32768],
                   help="validation batch sizes in tokens, the first the reference (default 4096 32768; "
                        "the recipes' --max-tokens is 4096, fairseq's default for --max-tokens-valid)")
    s.add_argument("--subset", default="valid", help="the split to decode (default valid, the dev set)")
    s.add_argument("--reps", type=int, default=1, help="alternating repetitions of every value (default 1)")
    s.add_argument("--precision", choices=PRECISIONS,
                   help="the model's precision, as training validates (default bf16 on a GPU, fp32 on a CPU)")
    s.add_argument("--profile", action="store_true",
                   help="also count one batch's ATen ops and host-device syncs by phase (stored in the first record)")
    s.add_argument("--decoder-steps", nargs="+", choices=DECODER_STEPS, default=["cached"],
                   help="decode with each of these decoder steps in turn (the task's --decoder-step): cached, the "
                        "plugin's preallocated cache; fairseq, fairseq's incremental state (default cached; "
                        "'fairseq cached' times both side by side and compares their hypotheses)")
    s.add_argument("--c-loops", nargs="+", choices=("on", "off"), default=["on"],
                   help="decode with the plugin's C loops (on a CPU, a --fused-kernels model's decoding-step "
                        "attention) on or off; 'off on' times both in turn on the same batches (default on)")
    s.add_argument("--label", default="", help="a note stored with the records")
    s.add_argument("--out", help="the JSON file the records are appended to")
    s.add_argument("extra", nargs="*", default=[], help="after --: fairseq-train flags for the untrained "
                                                        "recipe model (e.g. a smaller model)")
