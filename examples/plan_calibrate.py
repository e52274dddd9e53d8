"""Check the planner's cost model against a real run: ViT-B/16 training steps on a GPU, a small model on the CPU.

On a CUDA machine this builds the package's ViT-B/16 (:func:`elastic_pipe.models.vit`), times full training steps
(bf16 autocast, fused AdamW, batch 256) with 0, 3, 6, 9 and 12 blocks frozen and recomputed, profiles its sub-layers
with :func:`elastic_pipe.partition.profile_layers`, and prints three numbers per case: measured, predicted from
the analytic H200 model, predicted from the profile. Without CUDA it runs the CPU calibration only.

    python examples/plan_calibrate.py [--out results.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from elastic_pipe.models import vit
from elastic_pipe.partition import profile_layers
from elastic_pipe.planner import ClusterSpec, Mode, SubLayerCost, from_layer_costs, model_shape, model_work, price
from elastic_pipe.planner.calibration import BARE_LOOP_GPU
from elastic_pipe.planner.step import predict_step

#: The CPU check lives with the other calibration runs, outside the package.
CALIBRATION = Path(__file__).resolve().parents[1] / "benchmarks" / "planner_calibration.py"

BATCH = 256
FROZEN = (0, 3, 6, 9, 12)
WARMUP, REPEATS = 3, 10


def _calibration() -> ModuleType:
    spec = importlib.util.spec_from_file_location("planner_calibration", CALIBRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_ms(fn: Any) -> float:
    times = []
    for i in range(WARMUP + REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def _predict(costs: list[SubLayerCost] | tuple[SubLayerCost, ...], frozen: int) -> float:
    entries = [(c, Mode.FROZEN if c.unit is not None and c.unit < frozen else Mode.ACTIVE) for c in costs]
    # This loop is a bare one (batch on the device, fused AdamW, no phase synchronisation): price it as such.
    cluster = ClusterSpec(1, gpu=BARE_LOOP_GPU)
    return 1e3 * predict_step(entries, cluster, global_batch=BATCH, pipe_len=1, microbatches=1).step_time


def gpu_check() -> dict[str, Any]:
    """Measured vs predicted ViT-B/16 steps on this GPU."""
    torch.backends.cuda.matmul.allow_tf32 = True
    model = vit("vit-b16").cuda()
    x = torch.randn(BATCH, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (BATCH,), device="cuda")
    layers = list(model)
    rows = []
    with torch.autocast("cuda", torch.bfloat16):
        records = profile_layers(list(model.named_children()), x[:BATCH], repeats=REPEATS, warmup=WARMUP)
    profiled = from_layer_costs(records, BATCH, model.unit_ends, host_weight=0.0)
    analytic = price(model_work(model_shape("vit-b16")), ClusterSpec(1).gpu)
    for frozen in FROZEN:
        cut = model.unit_ends[frozen - 1] if frozen else 0
        for i, m in enumerate(layers):
            m.requires_grad_(i >= cut)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)

        def step(cut: int = cut, opt: torch.optim.Optimizer = opt) -> None:
            with torch.autocast("cuda", torch.bfloat16):
                h = x
                with torch.no_grad():
                    for m in layers[:cut]:
                        h = m(h)
                for m in layers[cut:]:
                    h = m(h)
                loss = torch.nn.functional.cross_entropy(h.float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        torch.cuda.reset_peak_memory_stats()
        measured = _cuda_ms(step)
        rows.append(
            {
                "frozen": frozen,
                "measured_ms": measured,
                "analytic_ms": _predict(analytic, frozen),
                "profiled_ms": _predict(profiled, frozen),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            }
        )
        del opt
    per_layer = [{"name": r.name, "forward_ms": 1e3 * r.forward, "backward_ms": 1e3 * r.backward} for r in records]
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows, "layers": per_layer}


def main() -> None:
    """Run the checks and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    cpu = [
        {"name": r.name, "measured_ms": r.measured, "predicted_ms": r.predicted, "error": r.error}
        for r in _calibration().cpu_calibration()
    ]
    result: dict[str, Any] = {"cpu": cpu}
    if torch.cuda.is_available():
        result["gpu"] = gpu_check()
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
