#!/usr/bin/env bash
# The freeze-accuracy study at full size on one GPU (docs/freeze.md, "The frontier"), then task (a) timed alone.
# Usage: benchmarks/gpu/run_freeze_accuracy.sh OUT_DIR [EXTRA_ARMS]
#   env ONLY_ARMS="none;..." limits the study to those arms, E2E_ARMS the timed runs (default: none, the default
#   policy, alpha 1/3), E2E_BEFORE skips the timed runs when the study took longer than that many seconds,
#   QUICK=1 runs the tiny sizes (a smoke test of the command on CPU), PARTS the scratch folder, SPLIT=K (with
#   ONLY_ARMS) deals the arms round-robin to K processes per seed, THREADS their CPU threads (default 2), SEEDS the
#   seeds (default "0 1 2"), SIGNAL_COST=1 adds timed runs of the default policy on both tasks with the probe
#   replayed as CUDA graphs and eager (freeze_signal_cost_{on,off}.json: what the signals cost, alone on the GPU).
#   E2E_ONLY=1 skips the study (the timed runs only), E2E_TASKS the tasks of the timed runs (default minilm_bbc;
#   vit_digits pre-trains its checkpoint first where PARTS has none). The units' costs are measured once, alone,
#   before the runs start.
# The tasks' seeds (and arm groups) run side by side, one process each, to fill the GPU; their wall times are
# therefore contended.
# The timed end-to-end runs come last, one at a time, with nothing else on the GPU, seed by seed (each seed's arms
# in turn).
set -u
out=$1
extra=${2:-}
only=${ONLY_ARMS:-}
bench="python3 benchmarks/bench_freeze_accuracy.py ${QUICK:+--quick}"
parts=${PARTS:-/tmp/freeze_parts}
mkdir -p "$parts"
start=$(date +%s)
# the units' costs first, with nothing else on the GPU: the runs side by side would time each other's kernels
$bench --costs-only --unit-costs "$parts/costs.json" 2> "$parts/costs.log"
if [[ -z ${E2E_ONLY:-} ]]; then
  $bench --pretrain-only --vit-checkpoint "$parts/vit_mnist5k.safetensors" --threads 2 2> "$parts/pretrain.log" &
  pre=$!
  split=${SPLIT:-1}
  groups=("$only")  # one group: every arm ("" = the study's standard arms)
  if [[ -n $only ]] && (( split > 1 )); then
    IFS=';' read -r -a arms <<< "$only"
    groups=()
    for ((g = 0; g < split; g++)); do
      group=""
      for ((i = g; i < ${#arms[@]}; i += split)); do group+="${group:+;}${arms[i]}"; done
      [[ -n $group ]] && groups+=("$group")
    done
  fi
  run_task() {  # task, extra flags...: every seed x arm group, side by side
    local task=$1; shift
    for s in ${SEEDS:-0 1 2}; do
      for g in "${!groups[@]}"; do
        $bench --tasks "$task" --seeds $s --arms "$extra" --only-arms "${groups[g]}" --threads "${THREADS:-2}" "$@" \
          --unit-costs "$parts/costs.json" \
          --out "$parts/study_${task}_$s.$g.json" 2> "$parts/${task}_$s.$g.log" &
      done
    done
  }
  run_task minilm_bbc
  wait $pre
  run_task vit_digits --vit-checkpoint "$parts/vit_mnist5k.safetensors"
  wait
  cat "$parts"/*.log > "$out/study.log"
  $bench --merge "$parts"/study_*.json --out "$out/freeze_accuracy.json" --plot "$out/freeze_frontier.png"
  echo "study done after $(( $(date +%s) - start )) s"
fi
if (( $(date +%s) - start < ${E2E_BEFORE:-330} )); then
  # one seed at a time, every arm of it in turn: a machine that speeds up or slows down meets every arm alike
  e2e_tasks=${E2E_TASKS:-minilm_bbc}
  if [[ $e2e_tasks == *vit_digits* && ! -f $parts/vit_mnist5k.safetensors ]]; then
    $bench --pretrain-only --vit-checkpoint "$parts/vit_mnist5k.safetensors" --threads 4 2>> "$out/e2e.log"
  fi
  for s in ${SEEDS:-0 1 2}; do
    $bench --tasks "$e2e_tasks" --seeds "$s" --arms "$extra" --unit-costs "$parts/costs.json" \
      --vit-checkpoint "$parts/vit_mnist5k.safetensors" \
      --only-arms "${E2E_ARMS:-none;freezeout:t0=0.7;alpha=1/3}" --threads 4 \
      --out "$parts/e2e_$s.json" --plot "$parts/e2e_$s.png" 2>> "$out/e2e.log"
  done
  $bench --merge "$parts"/e2e_*.json --out "$out/freeze_accuracy_e2e.json" > /dev/null
  echo "e2e done after $(( $(date +%s) - start )) s"
fi
if [[ -n ${SIGNAL_COST:-} ]]; then
  seeds=${SEEDS:-0 1 2}
  for mode in on off; do  # one run at a time, nothing else on the GPU
    $bench --tasks minilm_bbc,vit_digits --vit-checkpoint "$parts/vit_mnist5k.safetensors" --seeds "${seeds// /,}" \
      --only-arms drift --probe-graphs $mode --unit-costs "$parts/costs.json" --threads 4 \
      --out "$out/freeze_signal_cost_$mode.json" --plot "$parts/signal_cost_$mode.png" 2> "$out/signal_cost_$mode.log"
  done
  echo "signal cost done after $(( $(date +%s) - start )) s"
fi
tar czf "$out/parts.tgz" -C "$parts" --exclude '*.safetensors' .
