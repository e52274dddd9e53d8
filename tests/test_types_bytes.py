"""The one grammar of byte sizes (:func:`elastic_pipe.types.parse_bytes`), read alike by the planner, the partition
CLI, the activation cache and every config size."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_pipe import cache, partition, planner, types
from elastic_pipe.cache import CacheError, CacheTiers
from elastic_pipe.cli import main
from elastic_pipe.orchestrator import ConfigError, config_from_tables
from elastic_pipe.types import BYTE_UNITS, MAX_BYTES, ByteSizeError, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        (4096, 4096),
        (4096.0, 4096),
        ("0", 0),
        ("7B", 7),
        ("7b", 7),  # a byte, never a bit
        ("16G", 16 * 10**9),
        ("16GB", 16 * 10**9),
        ("16gb", 16 * 10**9),
        ("16Gi", 16 * 2**30),
        ("16GiB", 16 * 2**30),
        ("16gib", 16 * 2**30),
        ("512MB", 512 * 10**6),
        (" 512 MiB ", 512 * 2**20),
        ("1.5kB", 1500),
        ("1.5K", 1500),
        ("1.5KiB", 1536),
        (".5GiB", 2**29),
        ("2T", 2 * 10**12),
        ("2TiB", 2 * 2**40),
        ("1P", 10**15),
        ("1.5e9", 1_500_000_000),
        ("2.5E3MB", 2_500_000_000),
        ("0.3B", 0),  # a fraction of a byte is rounded down
        ("16PiB", 16 * 2**50),
        (str(MAX_BYTES), MAX_BYTES),
    ],
)
def test_the_grammar(text: str | int | float, expected: int) -> None:
    value = parse_bytes(text)
    assert value == expected and type(value) is int


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "lots",
        "GiB",
        "12 parsecs",
        "-1",
        "-1GB",
        "+5",
        "1.2.3",
        "20 GiBs",
        "16 Gb s",
        "16GiBB",
        "1e",
        "0x10",
        "16Xi",
    ],
)
def test_a_malformed_size_raises_a_byte_size_error_naming_it(bad: str) -> None:
    with pytest.raises(ByteSizeError, match=re.escape(f"cannot read {bad!r} as a size")) as info:
        parse_bytes(bad)
    assert "powers of 1000" in str(info.value) and "powers of 1024" in str(info.value)  # the grammar, in the message


@pytest.mark.parametrize("bad", [-5, 1.5, float("nan"), float("inf"), -0.5, True, None, [16], b"16G"])
def test_a_value_of_the_wrong_kind_raises_a_byte_size_error_naming_it(bad: object) -> None:
    with pytest.raises(ByteSizeError, match=re.escape(repr(bad))):
        parse_bytes(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["18446744073709551617", "1e20", "17EiB", "1e999999999", "16385PiB"])
def test_sizes_above_the_bound_are_refused_without_building_them(bad: str) -> None:
    with pytest.raises(ByteSizeError, match=re.escape(repr(bad))):
        parse_bytes(bad)


def test_byte_size_errors_belong_to_the_family_the_cli_turns_into_exit_2() -> None:
    assert issubclass(ByteSizeError, types.ElasticPipeError) and issubclass(ByteSizeError, ValueError)


@given(
    number=st.integers(min_value=0, max_value=2**14),  # 2**14 PiB is MAX_BYTES
    unit=st.sampled_from(sorted(BYTE_UNITS)),
    spaces=st.sampled_from(["", " ", "  "]),
    case=st.sampled_from([str.lower, str.upper, str]),
    with_b=st.booleans(),
)
def test_every_unit_scales_a_whole_number_in_any_case_with_or_without_its_b(
    number: int, unit: str, spaces: str, case: object, with_b: bool
) -> None:
    written = unit if with_b or unit == "B" else unit[:-1]
    text = f"{spaces}{number}{spaces}{case(written)}{spaces}"  # type: ignore[operator]
    assert parse_bytes(text) == number * BYTE_UNITS[unit]


def test_the_units_are_decimal_letters_and_binary_with_i() -> None:
    letters = "KMGTP"
    assert {unit: BYTE_UNITS[unit] for unit in ("B", "KB", "KiB")} == {"B": 1, "KB": 1000, "KiB": 1024}
    for power, letter in enumerate(letters, start=1):
        assert BYTE_UNITS[f"{letter}B"] == 1000**power and BYTE_UNITS[f"{letter}iB"] == 1024**power


def test_every_package_reads_sizes_with_the_one_function() -> None:
    assert cache.parse_bytes is planner.parse_bytes is partition.parse_bytes is types.parse_bytes


def test_a_memory_budget_reads_as_the_planner_reads_a_gpu() -> None:
    for text in ("16G", "16GiB", "512MB", "1.5e9"):
        tables = {"model": {"name": "vit"}, "pipeline": {"memory_budget": text}}
        assert config_from_tables(tables).pipeline.memory_budget_bytes == planner.parse_bytes(text)
    assert (
        config_from_tables(
            {"model": {"name": "vit"}, "pipeline": {"memory_budget": "16G"}}
        ).pipeline.memory_budget_bytes
        == 16 * 10**9
    )
    with pytest.raises(ConfigError, match=r"pipeline.memory_budget: cannot read '16 parsecs' as a size"):
        config_from_tables({"model": {"name": "vit"}, "pipeline": {"memory_budget": "16 parsecs"}})


def test_cache_tiers_read_the_grammar_and_name_a_bad_size_in_their_family() -> None:
    tiers = CacheTiers.parse("1G", host="2Gi")
    assert (tiers.device_bytes, tiers.host_bytes) == (10**9, 2 * 2**30)
    with pytest.raises(CacheError, match=re.escape("cannot read 'lots' as a size")):
        CacheTiers.parse("1G", host="lots")


def test_the_compress_cli_reads_a_bare_letter_budget_and_keeps_plain_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps([3e9] * 4))
    assert main(["compress", "--costs", str(costs), "--from", "4", "--budget", "6G", "--rule", "memory", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pipe_len"] == 2  # 6e9 bytes: two 3e9 layers per stage
    costs.write_text(json.dumps([0.25] * 4))
    assert (
        main(["compress", "--costs", str(costs), "--from", "4", "--budget", "0.5", "--rule", "memory", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["pipe_len"] == 2  # a plain number stays a number (0.5 s, not 0 bytes)
    assert main(["compress", "--costs", str(costs), "--from", "4", "--budget", "6 parsecs", "--rule", "memory"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'6 parsecs'" in err
