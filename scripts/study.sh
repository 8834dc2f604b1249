#!/usr/bin/env bash
# The real-data study of issue #13: our normalisation presets and stock fairseq's `transformer`
# trained on TED gl->en with the same data, model size and number of updates, several seeds each,
# test decoding alike; a table of test BLEU (mean ± sd over seeds), training wall time per system
# and dev-BLEU curves against updates and wall time.
#   bash scripts/study.sh [--config configs/studies/gl-en.yaml] [--systems "a b"] [--seeds N]
#                         [--max-update N] [--report-only] [--dry-run]
#   --config FILE    the study (default configs/studies/gl-en.yaml: model size, budget, systems,
#                    seeds, the stock row's recipe; every value commented there)
#   --systems "..."  a subset of the config's systems (ours and its stock name, fairseq_transformer)
#   --seeds N        seeds 1..N (default: the config's)
#   --max-update N   a smaller budget for a smoke run; its runs and results go to folders named
#                    NAME-uN, apart from the study's
#   --report-only    rebuild the report from the records of the chosen systems and seeds (every
#                    one must be finished); it needs the corpus at source_dir, whose prepared test
#                    set is the reference the records were scored against
#   --dry-run        print every run's state (same, more-updates, different: ..., to train) and
#                    the command.txt its record would hold; train nothing
#   --verbose        every tool's whole output instead of the progress lines (= VERBOSE=1)
#   -h, --help       this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
# Steps, each resumable (the study spans sessions; re-run the same command to go on):
#   1. bash scripts/prepare.sh --pair PAIR --src-dir SOURCE --tokenized into the study's own
#      $DATA_DIR/NAME and $DATA_BIN/NAME (skipped when done)
#   2. per seed, per system: train (our systems: scripts/train.sh --seed K PAIR SYSTEM + the
#      study's flags; stock: plain fairseq-train without --user-dir), resumed from
#      checkpoint_last.pt; then scripts/evaluate.sh on the test set; then the run's record
#      (below). A run whose record was made by the same command is skipped; one whose record
#      differs only by a smaller --max-update continues from its checkpoints; any other
#      difference stops the study (move the record away to redo the run).
#   3. the report: $RESULTS_DIR/NAME/study.md, study.json, dev_bleu.png (python -m qknorm_pipeline.study)
#      and the test table $RESULTS_DIR/NAME/runs/PAIR/compare.{md,csv,json}, read from the records
# Runs: checkpoints $CKPT_DIR/NAME/PAIR/RUN, log $LOG_DIR/NAME/PAIR/RUN/train.log, test outputs
# $RESULTS_DIR/NAME/PAIR/RUN (RUN = SYSTEM for seed 1, SYSTEM_seedK for seed K). The record of a
# finished run, $RESULTS_DIR/NAME/runs/PAIR/RUN/{train.log,hyp.txt,scores.json,command.txt}, is all
# the report reads and is kept in git (.gitignore): a study spanning sessions survives a fresh
# clone, where checkpoints and logs are gone. command.txt says how the run was made, without this
# machine's paths: the study's command, the whole training command and the decoding settings.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
config=$ROOT/configs/studies/gl-en.yaml systems="" seeds="" max_update="" report_only=0 dry=0
invocation="bash scripts/study.sh"; (( $# )) && invocation+=$(printf ' %q' "$@")
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --config) need "$@"; config=$2; shift 2 ;;
    --systems) need "$@"; systems=$2; shift 2 ;;
    --seeds) need "$@"; seeds=$2; shift 2 ;;
    --max-update) need "$@"; max_update=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    --dry-run) dry=1; shift ;;
    --verbose) VERBOSE=1; shift ;;
    *) usage_error "unknown argument $1" ;;
  esac
done
[[ -f $config ]] || usage_error "no study config $config (see configs/studies/)"
[[ -z $seeds ]] || positive --seeds "$seeds"
[[ -z $max_update ]] || positive --max-update "$max_update"
[[ -n ${VIRTUAL_ENV:-} ]] || activate_env
cd "$ROOT"

study() { python -m qknorm_pipeline.study "$@"; }
name=$(study get "$config" name) pair=$(study get "$config" pair)
stock=$(study get "$config" stock.name)
all="$(study get "$config" systems) $stock"
systems=${systems:-$all}
for s in $systems; do [[ " $all " == *" $s "* ]] || die "--systems: '$s' is not in $config (have: $all)"; done
seeds=${seeds:-$(study get "$config" seeds)}
budget_args=()
if [[ -n $max_update ]]; then name=$name-u$max_update budget_args=(--max-update "$max_update"); fi
n_updates=${max_update:-$(study get "$config" budget.max_update)}
src_dir=$(study get "$config" source_dir)
[[ $src_dir == /* ]] || src_dir=$ROOT/$src_dir

# The study's own folders, so that its data and runs never mix with the papers' recipe runs.
export DATA_DIR=$DATA_DIR/$name DATA_BIN=$DATA_BIN/$name CKPT_DIR=$CKPT_DIR/$name LOG_DIR=$LOG_DIR/$name
export RESULTS_DIR=$RESULTS_DIR/$name
# shellcheck disable=SC2086
set -- $systems
n_runs=$(( $# * seeds )) i=0
records=$RESULTS_DIR/runs/$pair

portable() {  # a command without this machine's paths (the study's folders by name) or device flag
  sed -E -e "s#$DATA_BIN/#\$DATA_BIN/#g" -e "s#$CKPT_DIR/#\$CKPT_DIR/#g" -e "s#$ROOT/##g" \
    -e 's/ --cpu( |$)/\1/g' -e 's/ +$//'
}

stock_command() {  # stock_command SEED RUN: sets cmd, the stock row's whole fairseq-train command
  local line device=()
  has_gpu || device=(--cpu)
  line=$(study stock-args "$config" --data-bin "$DATA_BIN/$pair" --save-dir "$CKPT_DIR/$pair/$2" --seed "$1" \
         "${budget_args[@]}") || die "study stock-args failed"
  eval "cmd=(fairseq-train $line ${device[*]})"
}

train_args() {  # train_args SEED SYSTEM: sets targs, the scripts/train.sh arguments of one of our runs
  local line
  line=$(study train-flags "$config" "$2" --data-bin "$DATA_BIN/$pair" "${budget_args[@]}") \
    || die "study train-flags failed"
  eval "targs=(--seed $1 $pair $2 $line)"
}

run_command() {  # run_command SYSTEM SEED RUN: how the run is made, as its record's command.txt says
  local short full decode cmd targs
  if [[ $1 == "$stock" ]]; then
    short="fairseq-train $(study stock-args "$config" --data-bin "\$DATA_BIN/$pair" \
      --save-dir "\$CKPT_DIR/$pair/$3" --seed "$2" "${budget_args[@]}")" || return 1
    stock_command "$2" "$3"
    full=$(printf '%q ' "${cmd[@]}")
  else
    short="scripts/train.sh --seed $2 $pair $1 $(study train-flags "$config" "$1" "${budget_args[@]}")" || return 1
    train_args "$2" "$1"
    full=$(bash "$ROOT/scripts/train.sh" --dry-run "${targs[@]}") || return 1
  fi
  decode=$(python -m qknorm_pipeline.recipes generate-args "$pair" --data-bin "$DATA_BIN/$pair") || return 1
  printf 'study: %s\ntrain: %s\ndecode: %s --metric %s --detok %s\n' "$short" "$full" "$decode" \
    "$(recipe "$pair" eval.metric)" "$(recipe "$pair" eval.detok)" | portable
}

file_record() {  # file_record RUN COMMAND: the finished run's record, written whole or not at all
  local rec=$records/$1 tmp=$RESULTS_DIR/runs/.$1.tmp.$$  # outside PAIR/, where compare looks
  rm -rf "$tmp"; mkdir -p "$tmp" "$records"
  # the log without this checkout's location, which results must not name
  sed "s#$ROOT/##g" "$LOG_DIR/$pair/$1/train.log" > "$tmp/train.log" \
    && cp "$RESULTS_DIR/$pair/$1/hyp.txt" "$RESULTS_DIR/$pair/$1/scores.json" "$tmp/" \
    && printf '%s\n' "$2" > "$tmp/command.txt" && rm -rf "$rec" && mv "$tmp" "$rec" \
    || die "could not write the record of $1 in $(short "$records")/"
  log "record of $1: $(short "$rec")/ (train.log, hyp.txt, scores.json, command.txt; commit it)"
}

train_stock() {  # train_stock SEED RUN: plain fairseq-train, resumable, skipped when finished
  local seed=$1 run=$2 save_dir=$CKPT_DIR/$pair/$2 log_dir=$LOG_DIR/$pair/$2 sig cmd
  stock_command "$seed" "$run"
  sig=$(printf '%q ' "${cmd[@]}" | sha1sum | cut -d' ' -f1)
  if is_done "$save_dir" "$sig"; then
    log "$pair/$run already trained with this command ($save_dir)"; return 0
  fi
  mkdir -p "$save_dir"
  log "training $pair/$run (plain fairseq-train); log $(short "$log_dir/train.log"), checkpoints $(short "$save_dir")/"
  # torch >= 2.6 loads with weights_only=True, which refuses fairseq 0.12's checkpoints (they pickle
  # an argparse.Namespace), so plain fairseq-train could not resume; our runs get an allow-list
  # from the plugin (qknorm_fairseq/checkpoint_compat.py), which this row must not load. It only
  # ever loads the checkpoints it wrote itself, in its own save dir. Its Python start-up warnings
  # (hydra, torch), which our train.py silences, are counted in one line.
  TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 run_training "$pair/$run" "$log_dir/train.log" "$n_updates" \
    --python-warnings count -- "${cmd[@]}"
  mark_done "$save_dir" "$sig"
}

# The data, also for --report-only: the records' scores name the reference test set it holds.
for f in train dev test; do for l in ${pair%-*} ${pair#*-}; do
  [[ -f $src_dir/$f.$l ]] || die "missing $src_dir/$f.$l: the study needs the shared TED corpus there (source_dir in $config)"
done; done
mkdir -p "$LOG_DIR/$pair"
quietly "$LOG_DIR/$pair/data.log" bash "$ROOT/scripts/prepare.sh" --pair "$pair" --src-dir "$src_dir" --tokenized \
  || die "preparing $pair failed; log: $(short "$LOG_DIR/$pair/data.log")"
log "data: $(short "$DATA_BIN/$pair") ready (log $(short "$LOG_DIR/$pair/data.log"))"
if [[ $report_only == 0 ]]; then
  (( dry == 0 )) || log "dry run: nothing is trained"
  log "study $name: systems ($systems), seeds 1..$seeds, $n_updates updates each; $n_runs runs"
  for seed in $(seq 1 "$seeds"); do
    for system in $systems; do
      i=$((i + 1))
      run=$system; (( seed > 1 )) && run=${system}_seed$seed
      label="run $i/$n_runs $run"
      command=$(run_command "$system" "$seed" "$run") || die "$label: study flags failed"
      change="to train"
      if [[ -f $records/$run/command.txt ]]; then
        change=$(printf '%s\n' "$command" | study record-change "$records/$run/command.txt" -) \
          || die "$label: could not read its record $(short "$records/$run")/command.txt"
      fi
      if [[ $dry == 1 ]]; then
        printf '== %s: %s\n%s\n' "$run" "$change" "$command"; continue
      fi
      if [[ -f $records/$run/command.txt ]]; then
        case $change in
          same) log "$label: finished, record $(short "$records/$run")/"; continue ;;
          more-updates)
            [[ -f $CKPT_DIR/$pair/$run/checkpoint_last.pt ]] \
              || die "$label: its record has fewer updates than $n_updates and its checkpoints are not in $(short "$CKPT_DIR/$pair/$run")/ to continue from; bring them back, or move the record away to train $run from scratch"
            log "$label: continuing its finished run to $n_updates updates" ;;
          *) die "$label: its record $(short "$records/$run")/ was made by another command (${change#different: }); move the record away (and $(short "$CKPT_DIR/$pair/$run")/, to start from scratch) to train $run again" ;;
        esac
      else
        log "$label"
      fi
      # a run that starts from scratch starts its log afresh: the record's wall time and curve are its own
      if [[ ! -f $CKPT_DIR/$pair/$run/checkpoint_last.pt && -f $LOG_DIR/$pair/$run/train.log ]]; then
        old_log=$LOG_DIR/$pair/$run/train.$(date -u +%Y%m%dT%H%M%S).log
        mv "$LOG_DIR/$pair/$run/train.log" "$old_log"
        log "$label: no checkpoint to resume; the earlier log is kept as $(short "$old_log")"
      fi
      if [[ $system == "$stock" ]]; then
        train_stock "$seed" "$run"
      else
        train_args "$seed" "$system"
        bash "$ROOT/scripts/train.sh" "${targs[@]}" || die "$label: training failed (see above)"
      fi
      bash "$ROOT/scripts/evaluate.sh" "$pair" "$run" || die "$label: evaluation failed (see above)"
      file_record "$run" "$command"
    done
  done
fi

(( dry == 0 )) || exit 0
[[ -d $records ]] || die "no finished runs: no records in $(short "$records")/ (run bash scripts/study.sh without --report-only)"
chosen=()
for seed in $(seq 1 "$seeds"); do for system in $systems; do
  run=$system; (( seed > 1 )) && run=${system}_seed$seed
  [[ -f $records/$run/command.txt ]] \
    || die "no record of $run in $(short "$records")/: finish it first (bash scripts/study.sh), or report fewer systems or seeds (--systems, --seeds)"
  chosen+=("$run")
done; done
log "test table: $(short "$records/compare.md")"
python -m qknorm_pipeline.scoring.compare --pair "$pair" --results-dir "$RESULTS_DIR/runs" --lang "$(recipe "$pair" tgt)" \
  --runs "${chosen[@]}" >/dev/null || die "the test table failed (see above)"
# shellcheck disable=SC2086
study report "$config" --log-dir "$RESULTS_DIR/runs" --compare "$records/compare.json" --out "$RESULTS_DIR" \
  --systems $systems --seeds "$seeds" "${budget_args[@]}" --command "$invocation"
cat "$RESULTS_DIR/study.md"
