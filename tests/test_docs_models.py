"""docs/models.md lists every option field of every model builder, so the page cannot drift from the code."""

from __future__ import annotations

import dataclasses
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from elastic_pipe import models

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"
#: A builder's options dataclass, the heading of its table in docs/models.md, and its presets.
BUILDERS = [
    (models.ViTConfig, "### ViT: `ViTConfig`", models.VIT_PRESETS),
    (models.BertConfig, "### BERT: `BertConfig`", models.BERT_PRESETS),
    (models.GPTConfig, "### GPT: `GPTConfig`", models.GPT_PRESETS),
    (models.LlamaConfig, "### Llama: `LlamaConfig`", models.LLAMA_PRESETS),
]
#: ``load_minilm``'s keywords that a config does not set through ``[model] options`` (they come from ``[train]``).
FROM_TRAIN = {"seed", "dtype", "meta"}


def _table(heading: str) -> list[list[str]]:
    """The cells of the table under ``heading`` (header and separator rows dropped)."""
    text = PAGE.read_text(encoding="utf-8")
    assert heading in text, f"docs/models.md has no section {heading!r}"
    body = text[text.index(heading) + len(heading) :]
    rows = []
    for line in body.lstrip("\n").splitlines():
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    assert len(rows) > 2, f"no table under {heading!r}"
    return rows


def _shown(value: object) -> str:
    """A value as the tables write it (TOML's spelling)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


@pytest.mark.parametrize(("config", "heading", "presets"), BUILDERS, ids=lambda x: getattr(x, "__name__", ""))
def test_every_option_field_is_listed_with_each_presets_value(
    config: type, heading: str, presets: dict[str, object]
) -> None:
    header, _, *rows = _table(heading)
    assert header[:2] == ["field", "meaning"]
    assert header[2:] == [f"`{name}`" for name in presets], "one column per preset, in the presets' order"
    listed = {row[0].strip("`"): row for row in rows}
    fields = [f.name for f in dataclasses.fields(config)]
    assert sorted(listed) == sorted(fields), f"{config.__name__}: listed {sorted(listed)}, fields {sorted(fields)}"
    for name in fields:
        row = listed[name]
        assert row[1], f"{config.__name__}.{name} has no meaning written"
        assert row[2:] == [_shown(getattr(p, name)) for p in presets.values()], f"{config.__name__}.{name}: {row}"


def test_every_minilm_option_is_listed() -> None:
    _, _, *rows = _table("### MiniLM: `load_minilm`")
    listed = {row[0].strip("`") for row in rows}
    options = set(inspect.signature(models.load_minilm).parameters) - FROM_TRAIN
    assert listed == options


def test_the_toml_examples_build_their_models() -> None:
    from elastic_pipe.orchestrator import config_from_tables
    from elastic_pipe.orchestrator.components import build_model

    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Option fields of every builder") : text.index("### ViT: `ViTConfig`")]
    blocks = re.findall(r"```toml\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        tables = tomllib.loads(block)
        model = build_model(config_from_tables(tables))
        assert len(model.unit_ends) == tables["model"]["options"]["depth"]  # the override took effect
