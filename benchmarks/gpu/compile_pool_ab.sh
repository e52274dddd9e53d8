#!/usr/bin/env bash
# Does the first compiling arm of a job pay for Inductor's compile workers? (docs/time_to_accuracy.md, "What every
# arm shares".) time_to_accuracy.py --task digits for 5 epochs, the compiled loop alone, on a ViT-B/16 with random
# weights (no pre-training: only the times matter): cold once each way, writing Inductor's kernels to disk (keeping
# the pool up is part of Inductor's cache key, so each way warms its own), then warm with `--compile-pool lazy` (the
# first compilation starts the workers) and `--compile-pool first` (started before the arm), twice each, in turn.
# Prints every run's seconds per epoch (time_to_accuracy.py --epochs-of); the JSONs go to OUT. About 3 minutes on
# one H100.
# Usage, on the GPU machine (.device_site carried): benchmarks/gpu/compile_pool_ab.sh OUT
set -euo pipefail
out=${1:?usage: compile_pool_ab.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=benchmarks/gpu/device_site.sh
source "$here/device_site.sh"
use_device_site "$root"
cd "$root"
mkdir -p "$out"
ck=$out/random_vit_b16.safetensors
python3 - "$ck" <<'PY'
import json, sys
from pathlib import Path
from safetensors.torch import save_file
from elastic_pipe import models
model = models.vit(config="vit-b16", in_channels=1, num_classes=10)
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, sys.argv[1])
Path(sys.argv[1]).with_suffix(".json").write_text(json.dumps({"accuracy": None}))
PY
run() {  # NAME POOL
  python3 benchmarks/time_to_accuracy.py --task digits --seeds 0 --epochs 5 --workers 4 --arms compiled \
    --vit-checkpoint "$ck" --compile-pool "$2" --out "$out/$1.json" --plot "$out/$1.png" > "$out/$1.log" 2>&1
}
run cold-lazy lazy
run cold-first first
for i in 1 2; do run "lazy$i" lazy; run "first$i" first; done
for name in cold-lazy cold-first lazy1 first1 lazy2 first2; do  # each run's seconds per epoch, and the pool's
  echo "$name: $(grep -o '"compile_pool_s": [0-9.]*' "$out/$name.json" || echo 'pool started by the arm')"
  python3 benchmarks/time_to_accuracy.py --epochs-of "$out/$name.json" | tail -n +3
done
rm -f "$ck"
