#!/usr/bin/env bash
# The effect of the original code's procedure on one pair and system, one item at a time:
#   bash scripts/ablate.sh PAIR SYSTEM [-- extra fairseq-train flags for every run]
# Trains SYSTEM with its recipe (output bias, the family's stopping rule), SYSTEM_nobias
# (--no-output-bias) and SYSTEM_stopALT (the other stopping rule: twt_paper, or twt when the
# recipe already uses twt_paper); decodes every run's best checkpoint with both beam searches
# (--beam-search twt, the recipe's, and fairseq's search + GNMT re-ranking) and writes
# $RESULTS_DIR/PAIR/ablation_SYSTEM.{md,json}. Resumable: finished runs and decodings are reused.
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
case ${1:-} in -h|--help) usage; exit 0 ;; -*) usage_error "unknown option $1 before PAIR SYSTEM" ;; esac
[[ $# -ge 2 ]] || usage_error "need PAIR and SYSTEM"
pair=$1 system=$2
shift 2
[[ ${1:-} == -- ]] && shift
extra=("$@")
activate_env
cd "$ROOT"
check_pair "$pair"
rule=$(python -m qknorm_pipeline.recipes get "$pair" "systems.$system.stopping" 2>/dev/null) \
  || usage_error "no system '$system' in the $pair recipe (have: $(python -m qknorm_pipeline.recipes systems "$pair"))"
alt=twt_paper
[[ $rule == twt_paper ]] && alt=twt
runs=("$system=none (the recipe: output bias, stopping $rule)" "${system}_nobias=--no-output-bias"
      "${system}_stop$alt=--stopping $alt")
bash scripts/train.sh "$pair" "$system" "${extra[@]}"
bash scripts/train.sh --name "${system}_nobias" "$pair" "$system" "${extra[@]}" --no-output-bias
bash scripts/train.sh --stopping "$alt" --name "${system}_stop$alt" "$pair" "$system" "${extra[@]}"
out=$RESULTS_DIR/$pair/ablation/$system
for r in "$system" "${system}_nobias" "${system}_stop$alt"; do
  for search in twt fairseq; do
    RESULTS_DIR=$out/$search bash scripts/evaluate.sh "$pair" "$r" --beam-search "$search" >/dev/null
  done
done
python -m qknorm_pipeline.ablation --pair "$pair" --system "$system" --runs "${runs[@]}" \
  --log-dir "$LOG_DIR/$pair" --results "$out" --out "$RESULTS_DIR/$pair/ablation_$system" \
  --settings "Command: bash scripts/ablate.sh $pair $system${extra[*]:+ --$(printf ' %q' "${extra[@]}")}"
