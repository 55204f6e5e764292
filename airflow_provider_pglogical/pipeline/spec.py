"""Pipeline spec: load a YAML/JSON file describing source, staging, target and tables, and validate it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.hooks.sizes import parse_size
from airflow_provider_pglogical.pipeline import model
from airflow_provider_pglogical.pipeline.model import *  # noqa: F403 - re-exported: the names model.__all__ lists
from airflow_provider_pglogical.pipeline.model import PipelineSpec
from airflow_provider_pglogical.pipeline.validation import SpecValidator

# The spec's public face: the dataclasses live in model.py (which the validator imports), the
# loading here; ``parse_size`` lives beside the slot checks (hooks/sizes.py).
__all__ = ["load_spec", "parse_size", "parse_spec"]
__all__ += model.__all__


def load_spec(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Read and validate a spec file (YAML, or JSON which YAML also reads)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec ({exc.strerror or exc})") from exc
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML/JSON{where}") from exc
    return parse_spec(raw, origin=str(path), env=env)


class _DuplicateKeyError(ValueError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (two targets or tables of one name): plain
    YAML keeps the last silently, and half a spec would be ignored."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # an unhashable key: the validator reports it
            if key in seen:
                mark = key_node.start_mark
                raise _DuplicateKeyError(f"key {key!r} is given twice in one mapping (line {mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_spec(raw: Any, *, origin: str = "<spec>", env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Validate a decoded spec document; every problem found is reported in one SpecError."""
    v = SpecValidator(os.environ if env is None else env)
    spec = v.pipeline(raw, origin)
    if v.errors:
        # All problems at once: fixing a spec one error per run is tedious.
        raise SpecError(f"{origin}: " + "; ".join(v.errors))
    if spec is None:  # the validator reports why it built nothing; this is a safety net
        raise SpecError(f"{origin}: not a valid pipeline spec")
    return spec
