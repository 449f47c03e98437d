"""Backend registry: names, module:attr, entry points, availability listing."""

from __future__ import annotations

import sys
import types
from importlib.metadata import EntryPoint

import pytest

import invariance.backends as registry
from invariance.backends import BUILTIN, available, resolve


def test_builtin_names_resolve() -> None:
    for name in ("reference", "sdpa", "torch-batch-variant"):
        b = resolve(name)
        assert b.name == name and callable(b.fn)


def test_module_attr_and_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("user_kernels_mod")

    def attn(batch: object) -> object:
        return batch

    mod.attn = attn  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "user_kernels_mod", mod)
    assert resolve("user_kernels_mod:attn").fn is attn
    assert resolve(attn).name.endswith("attn")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        resolve("user_kernels_mod:nope")
    with pytest.raises(ValueError, match="cannot import module"):
        resolve("no_such_module_xyz:attn")


def test_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = EntryPoint("fancy", "invariance.backends.reference:reference_backend",
                    registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep])
    assert resolve("fancy").name == "fancy"
    names = [b.name for b in available()]
    assert "fancy" in names and set(BUILTIN) <= set(names)


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"expected one of \[.*'reference'"):
        resolve("nope")


def test_available_says_why_not() -> None:
    infos = {b.name: b for b in available()}
    assert infos["reference"].importable and infos["reference"].reason == ""
    for b in infos.values():
        assert b.importable or b.reason
