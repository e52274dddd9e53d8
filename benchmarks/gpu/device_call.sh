#!/usr/bin/env bash
# One device call of a re-measure: headline.sh's parts at a named commit, returning only their results JSONs.
#
# Usage, on the lent GPU machine (the tree sent must be that commit's, clean; .device_site carried, see
# headline.sh --prepare):
#   benchmarks/gpu/device_call.sh COMMIT PART...
# PART: single | default | default-digits | hf | hf-long | alone | data | bisect-digits | TASK:SEED (bbc or digits; each its own
# `headline.sh OUT tta` run). The parts write to /tmp/remeasure_work (kept between calls on a warm machine, so
# a later call reuses the ViT's pre-training); the JSONs this call wrote, and one log of everything, go to $OUT:
# the device returns at most 8 files a call. docs/benchmarks.md, "The headline, re-measured", gives the calls.
set -uo pipefail
commit=${1:?usage: device_call.sh COMMIT PART... (COMMIT: the full hash)}; shift
[[ $commit =~ ^[0-9a-f]{40}$ ]] || {  # the results name it: an abbreviation or a typo would name no commit
  echo "device_call.sh: COMMIT must be the full 40-hex hash (git rev-parse HEAD), got '$commit'" >&2; exit 2; }
(( $# )) || { echo "device_call.sh: name at least one part" >&2; exit 2; }
: "${OUT:?device_call.sh: \$OUT must name the folder whose files come back}"
export ELASTIC_PIPE_COMMIT=$commit ELASTIC_PIPE_DIRTY=0
here=$(cd "$(dirname "$0")" && pwd)
work=${REMEASURE_WORK:-/tmp/remeasure_work}  # the parts' own output (REMEASURE_WORK: elsewhere)
mkdir -p "$work" && touch "$work/.start"
log="$OUT/device_call_$(date +%H%M%S).log"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; echo "$(nproc) CPUs"; } >> "$log" 2>&1
failed=0
# each part's JSONs go to $OUT as soon as it ends: a call cut short by its limit still returns the parts it finished
collect() { find "$work" -maxdepth 1 -name '*.json' -newer "$work/.start" ! -name '*_lora_tuning*' -exec cp {} "$OUT/" \; ; }
run() { "$here/headline.sh" "$work" "$@" >> "$log" 2>&1 || { echo "$* FAILED" >> "$log"; failed=1; }; collect; }
for part in "$@"; do
  case $part in
    *:*) run tta "$part" ;;  # one seed a run: its JSON comes back even if a later part runs out of time
    *) run "$part" ;;
  esac
done
grep -vE '^\[' "$log" | grep -E 'done after|FAILED|accuracy|x over|speedup' | tail -n 40
exit $failed
