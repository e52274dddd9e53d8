#!/usr/bin/env bash
# A/B the single-GPU elastic arms of several commits in ONE job on one machine, rounds alternating the order, so a
# difference between commits is told apart from a difference between lent machines (docs/benchmarks.md).
#
# Usage:
#   benchmarks/gpu/ab_commits.sh --prepare COMMIT...      here: out/ab/<commit>.tar.xz holds src/ and benchmarks/
#                                                         of each commit (git archive, about 0.5 MB: a device call
#                                                         carries 64 MiB with the tree, and .device_site takes 47);
#                                                         carry out/ab to the device, where each is unpacked into
#                                                         out/ab/<commit>/ before the first round
#   benchmarks/gpu/ab_commits.sh OUT ROUNDS COMMIT...     on the device: each round runs every commit's (a COMMIT
#                                                         of "." is the working tree, named by ELASTIC_PIPE_COMMIT)
#                                                         bench_single_gpu.py --arms elastic_eager,elastic_compiled_graphs
#                                                         (about 70 s a commit a round on one H200); then prints
#                                                         total, compilation, transitions and head-only step per run
#   AB_TTA="ARGS" benchmarks/gpu/ab_commits.sh OUT ROUNDS COMMIT...
#                                                         the same rounds of time_to_accuracy.py ARGS instead (e.g.
#                                                         "--task bbc --seeds 1 --arms elastic-default"; source
#                                                         device_site.sh and use_device_site first for bbc): prints
#                                                         each elastic run's total, time per epoch, compilation and
#                                                         the cache phase of each transition
# Every commit runs its own benchmarks/ on its own src/; PYTHONPATH already set (the device site) comes after it.
# Results: OUT/ab_<commit>_r<round>.json, each recording its commit (ELASTIC_PIPE_COMMIT), and OUT/ab_summary.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ab="$root/out/ab"

if [[ ${1:-} == --prepare ]]; then
  shift
  mkdir -p "$ab"
  for c in "$@"; do
    full=$(git -C "$root" rev-parse --short "$c")
    rm -rf "${ab:?}/$full" "$ab/$full.tar.xz"
    git -C "$root" archive --prefix="$full/" "$full" src benchmarks ':!benchmarks/results' | xz -9 > "$ab/$full.tar.xz"
    echo "prepared $ab/$full.tar.xz ($(du -k "$ab/$full.tar.xz" | cut -f1) KiB)"
  done
  exit 0
fi

out=${1:?usage: ab_commits.sh OUT ROUNDS COMMIT... (or --prepare COMMIT...)}
rounds=${2:?rounds}
shift 2
[[ $# -ge 2 ]] || { echo "ab_commits.sh: name at least two commits" >&2; exit 2; }
mkdir -p "$out"
for c in "$@"; do  # what --prepare packed, unpacked once
  if [[ $c != . && ! -d $ab/$c && -f $ab/$c.tar.xz ]]; then tar -xJf "$ab/$c.tar.xz" -C "$ab"; fi
done
for r in $(seq 1 "$rounds"); do
  order=("$@")
  if (( r % 2 == 0 )); then  # even rounds run the commits in reverse order
    order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
  for c in "${order[@]}"; do
    tree="$ab/$c"
    if [[ $c == . ]]; then tree=$root c=${ELASTIC_PIPE_COMMIT:?ELASTIC_PIPE_COMMIT names the working tree}; fi
    [[ -d $tree/src ]] || { echo "ab_commits.sh: $tree missing (run --prepare here and carry out/ab)" >&2; exit 2; }
    echo "round $r: $c"
    name="ab_${c}_r$r"
    if [[ -n ${AB_TTA:-} ]]; then  # word splitting of AB_TTA is wanted: it is the script's arguments
      # shellcheck disable=SC2086
      bench=(benchmarks/time_to_accuracy.py $AB_TTA --out "$out/$name.json" --plot "${TMPDIR:-/tmp}/$name.png")
    else
      bench=(-m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu/bench_single_gpu.py --steps 30
        --arms elastic_eager,elastic_compiled_graphs --out "$out" --name "$name.json")
    fi
    (cd "$tree" && ELASTIC_PIPE_COMMIT=$c ELASTIC_PIPE_DIRTY=0 PYTHONPATH="$tree/src${PYTHONPATH:+:$PYTHONPATH}" \
      PYTHONUNBUFFERED=1 python3 "${bench[@]}" > "$out/$name.log" 2>&1) || { tail -20 "$out/$name.log"; exit 1; }
  done
done
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("ab_*_r*.json")):
    report = json.loads(f.read_text())
    if "runs" in report:  # time_to_accuracy.py: every elastic arm's runs, by seed
        for arm, seeds in report["runs"].items():
            for seed, run in seeds.items():
                if "transition_phases" not in run:
                    continue  # not an elastic arm
                times = [0.0] + [t for t, _ in run["curve"]]
                rows[f"{f.stem} {arm} seed {seed}"] = {
                    "total_s": run["total_seconds"], "setup_s": run.get("setup_seconds"),
                    "setup_phases_s": run.get("setup_phases"), "compile_s": run["compile_seconds"],
                    "transitions_s": run["transition_seconds"],
                    "epochs_s": [round(b - a, 3) for a, b in zip(times, times[1:])],
                    "cache_phases_s": [p.get("cache", 0.0) for p in run["transition_phases"]],
                }
        continue
    s = report["steps_per_epoch"]["30"]
    for arm, a in s["arms"].items():
        rows[f"{f.stem} {arm}"] = {
            "total_s": a["total_s"], "compile_s": a["compile_s"], "transitions_s": sum(a["transition_seconds"]),
            "head_only_step_ms": a.get("head_only_step_ms"), "epochs_s": sum(a["epoch_seconds"]),
        }


def shown(x):
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k} {v:.3f}" for k, v in x.items()) + "}"
    return f"{x:.3f}" if isinstance(x, float) else str(x)


for k, v in rows.items():
    print(f"{k:>48}: " + ", ".join(f"{n} {shown(x)}" for n, x in v.items() if x is not None))
(out / "ab_summary.json").write_text(json.dumps(rows, indent=1))
PY
