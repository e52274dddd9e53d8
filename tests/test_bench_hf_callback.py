"""benchmarks/gpu/bench_hf_callback.py's arms: which callback each builds (no training)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from script_module import load_script


def test_each_arm_builds_its_callback_and_a_policy_arm_passes_its_options() -> None:
    bench = load_script(Path("benchmarks/gpu/bench_hf_callback.py"), "bench_hf_callback")
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "callback"

    assert bench.callback_for("none", record) is None and bench.callback_for("lora", record) is None
    for arm in ("freeze", "freeze_nocache", "freeze-drift:max_fraction=0.95", "freeze-alpha"):
        assert bench.callback_for(arm, record) == "callback"
    assert calls == [
        ((), {"cache": True}),
        ((), {"cache": False}),
        (("drift",), {"policy_options": {"max_fraction": 0.95}, "cache": True}),
        (("alpha",), {"policy_options": {}, "cache": True}),
    ]
    # the cached arms' datasets carry the sample index the cache is keyed by
    assert [bench.cached(a) for a in ("freeze", "freeze-drift:max_fraction=0.95", "freeze_nocache", "none")] == [
        True,
        True,
        False,
        False,
    ]


def test_an_unknown_policy_arm_is_refused_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script(Path("benchmarks/gpu/bench_hf_callback.py"), "bench_hf_callback")
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--policy-arm", "bogus:x=1"])
    assert exit_info.value.code == 2
    assert "unknown policy 'bogus'" in capsys.readouterr().err
