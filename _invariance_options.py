"""Every setting of an invariance check, declared once: names, aliases, defaults, help, parsing.

This module imports nothing but the standard library (no torch, no invariance package), so that
the pytest plugin can declare its options in every pytest session without loading torch, and the
CLI can build its parser before anything heavy loads. Both faces call :func:`add_options`
(pytest-benchmark's pattern: one function taking ``addoption`` and a prefix):

- argparse: ``add_options(parser.add_argument)`` gives ``--dtype``, ``--budget`` ...;
- pytest: ``add_options(group.addoption, "invariance-")`` gives ``--invariance-dtype`` ...

A face then turns what the user typed into keyword arguments of :func:`invariance.check` with
:func:`collect`; :class:`invariance.CheckSpec` validates them (types, ranges, what the backend
and the device can do). See ARCHITECTURE.md, "Layers".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DTYPE_ALIASES",
    "DTYPE_NAMES",
    "FEATURE_KEYS",
    "KV_DTYPE_ALIASES",
    "KV_DTYPE_NAMES",
    "OPTIONS",
    "Option",
    "OptionError",
    "add_options",
    "canonical_dtype",
    "canonical_kv_dtype",
    "check_int",
    "collect",
    "dtype_names",
    "feature_settings",
    "parse_feature",
]

#: The dtypes the toolkit knows, by their public names, in the order reports show them.
DTYPE_NAMES: tuple[str, ...] = ("float16", "bfloat16", "float32")
#: Accepted spellings of those names (``torch.`` prefixes are stripped first).
DTYPE_ALIASES: dict[str, str] = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
}


class OptionError(ValueError):
    """A setting that cannot be parsed: names the setting, the expected and the actual value."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def canonical_dtype(value: object, *, what: str = "dtype") -> str:
    """The public name of a dtype given as a name, an alias or a ``torch.dtype``."""
    name = str(value).strip().removeprefix("torch.")
    name = DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_NAMES:
        raise OptionError(f"{what}: expected one of {', '.join(DTYPE_NAMES)} (or an alias: "
                          f"{', '.join(DTYPE_ALIASES)}), got {_show(value)}")
    return name


def dtype_names(values: object, *, what: str = "dtype") -> list[str]:
    """Public names of one dtype or a sequence of them, deduplicated, in the given order."""
    items: Iterable[object] = (values if isinstance(values, (list, tuple)) else [values])
    names = [canonical_dtype(v, what=what) for v in items]
    if not names:
        raise OptionError(f"{what}: expected at least one dtype, got none")
    return list(dict.fromkeys(names))


#: KV cache dtypes other than the query's, by their public names (``--kv-dtype``).
KV_DTYPE_NAMES: tuple[str, ...] = ("fp8_e4m3",)
#: Accepted spellings of those names.
KV_DTYPE_ALIASES: dict[str, str] = {
    "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "fp8e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3", "float8_e4m3": "fp8_e4m3",
}


def canonical_kv_dtype(value: object, *, what: str = "kv_dtype") -> str:
    """The public name of a KV cache dtype (``"fp8_e4m3"``) given as a name or an alias."""
    name = str(value).strip().removeprefix("torch.").lower()
    name = KV_DTYPE_ALIASES.get(name, name)
    if name not in KV_DTYPE_NAMES:
        raise OptionError(f"{what}: expected one of {', '.join(KV_DTYPE_NAMES)} (or an alias: "
                          f"{', '.join(KV_DTYPE_ALIASES)}), got {_show(value)}")
    return name


#: The keys of ``--feature KEY[=VALUE]`` / ``features={...}`` and what each takes:
#: ``window`` (``window_left``: an int >= 0, a query at position p sees keys
#: ``[p - window, p]``), ``sinks`` (per-head attention-sink logits: a switch), ``softcap`` (the
#: logit soft-cap: a finite float > 0), ``kv_scale`` (the FP8 KV cache's dequantization scales:
#: ``tensor``, one per cache, or ``head``, one per KV head; with ``--kv-dtype`` only).
FEATURE_KEYS: dict[str, str] = {
    "window": "window=N (an int >= 0)",
    "sinks": "sinks (or sinks=true|false)",
    "softcap": "softcap=X (a finite float > 0)",
    "kv_scale": "kv_scale=tensor|head",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _feature_value(key: str, value: object) -> object:
    """``value`` of feature ``key`` checked and typed (text from a face, or a typed value)."""
    expected = FEATURE_KEYS[key]
    text = value.strip().lower() if isinstance(value, str) else None
    if key == "sinks":
        if isinstance(value, bool):
            return value
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    elif key == "window":
        number: object = value
        if text is not None and text.lstrip("+").isdigit():
            number = int(text)
        if isinstance(number, int) and not isinstance(number, bool) and number >= 0:
            return number
    elif key == "softcap":
        cap: object = value
        if text is not None:
            try:
                cap = float(text)
            except ValueError:
                cap = None
        if isinstance(cap, (int, float)) and not isinstance(cap, bool) and (
                cap == cap and abs(cap) != float("inf") and cap > 0):
            return float(cap)
    elif key == "kv_scale" and (text if text is not None else value) in ("tensor", "head"):
        return text if text is not None else value
    raise OptionError(f"feature {key}: expected {expected}, got {_show(value)}")


def parse_feature(text: str) -> tuple[str, object]:
    """One ``--feature`` item, ``KEY`` or ``KEY=VALUE`` (:data:`FEATURE_KEYS`), as ``(key,
    value)``; a bare ``KEY`` is a switch (``sinks``)."""
    key, sep, value = (part.strip() for part in str(text).partition("="))
    key = key.lower()
    if key not in FEATURE_KEYS:
        raise OptionError(f"feature: expected one of {', '.join(FEATURE_KEYS.values())}, got "
                          f"{_show(text)}")
    if not sep:
        if key != "sinks":
            raise OptionError(f"feature {key}: expected {FEATURE_KEYS[key]}, got "
                              f"{_show(text)}")
        return key, True
    return key, _feature_value(key, value)


def feature_settings(values: object) -> dict[str, object]:
    """Features as a dict ``{key: value}`` from what a face or an API caller gave: a mapping,
    ``KEY[=VALUE]`` strings, ``(key, value)`` pairs, or a list mixing them. A key given twice
    is an error (repeated ``--feature`` flags combine; they never override each other)."""
    items: list[tuple[str, object]] = []
    if isinstance(values, Mapping):
        for key, value in values.items():
            name = str(key).strip().lower()
            if name not in FEATURE_KEYS:
                raise OptionError(f"feature: expected one of {', '.join(FEATURE_KEYS)}, got "
                                  f"{_show(key)}")
            items.append((name, _feature_value(name, value)))
    elif isinstance(values, (str, list, tuple)):
        for item in [values] if isinstance(values, str) else values:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                name = item[0].strip().lower()
                if name not in FEATURE_KEYS:
                    raise OptionError(f"feature: expected one of {', '.join(FEATURE_KEYS)}, "
                                      f"got {_show(item[0])}")
                items.append((name, _feature_value(name, item[1])))
            elif isinstance(item, str):
                items += [parse_feature(t) for t in item.split(",") if t.strip()]
            else:
                raise OptionError(f"features: expected KEY[=VALUE] strings, got {_show(item)}")
    else:
        raise OptionError(f"features: expected a dict or KEY[=VALUE] strings, got "
                          f"{_show(values)}")
    out: dict[str, object] = {}
    for key, value in items:
        if key in out:
            raise OptionError(f"feature {key}: given twice ({_show(out[key])} and "
                              f"{_show(value)})")
        out[key] = value
    return out


#: Smallest allowed value of each integer setting (:class:`invariance.CheckSpec` enforces them
#: for API calls too).
MINIMUM: dict[str, int] = {"budget": 1, "seed": 0, "accuracy_rows": 1, "max_violations": 0}


def check_int(name: str, value: object) -> int:
    """``value`` as a setting ``name`` (an int, not a bool, >= its minimum), else OptionError."""
    minimum = MINIMUM[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{name}: expected an int >= {minimum}, got {_show(value)}")
    return value


def _int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        return check_int(name, value if value is not None else text)
    return parse


def _word(name: str, choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = text.strip()
        if word not in choices:
            raise OptionError(f"{name}: expected one of {', '.join(choices)}, got {_show(text)}")
        return word
    return parse


def _text(name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.strip():
            raise OptionError(f"{name}: expected a non-empty value, got {_show(text)}")
        return text.strip()
    return parse


@dataclass(frozen=True)
class Option:
    """One check setting.

    - ``name``: the keyword of :func:`invariance.check` (``perturbations``) and the ini key.
    - ``flag``: the command-line spelling after the prefix (``perturb`` -> ``--perturb``).
    - ``parse``: text -> value; raises :class:`OptionError` naming the option.
    - ``multiple``: repeatable and comma-separated; the value is a list.
    - ``switch``: a flag without a value that sets ``switch_value``.
    - ``combine``: for a ``multiple`` option, turns the parsed list into the setting's value
      (``features``: one dict).
    """

    name: str
    flag: str
    help: str
    metavar: str = ""
    parse: Callable[[str], Any] = str
    multiple: bool = False
    switch: bool = False
    switch_value: Any = None
    combine: Callable[[list[Any]], Any] | None = None

    def parse_all(self, values: object) -> Any:
        """Parse what a face collected (a string, a list of strings, or a typed value)."""
        if self.switch:
            return self.switch_value if values else None
        if self.multiple:
            items = values if isinstance(values, (list, tuple)) else [values]
            texts = [v.strip() for item in items for v in str(item).split(",")]
            if not any(texts):
                raise OptionError(f"{self.name}: expected at least one value, got "
                                  f"{_show(','.join(map(str, items)))}")
            # Once each, in the given order: --dtype float32 --dtype fp32 is one dtype.
            parsed = [self.parse(t) for t in texts if t]
            if self.combine is not None:
                return self.combine(parsed)
            return list(dict.fromkeys(parsed))
        return self.parse(str(values))


OPTIONS: tuple[Option, ...] = (
    Option("backend", "backend", "backend name (see 'invariance list'), or 'module:attr' "
           "(a callable AttentionBatch -> AttentionResult | (out, lse))",
           "NAME|module:attr", _text("backend")),
    Option("dtype", "dtype", "float16, bfloat16, float32 (aliases fp16, bf16, fp32, ...); "
           "repeatable or comma-separated (default: all three on cuda, float32 on cpu)",
           "DTYPE", canonical_dtype, multiple=True),
    Option("perturbations", "perturb", "a perturbation name or 'all' (see 'invariance list'); "
           "repeatable or comma-separated (default: all)", "NAME", _text("perturbations"),
           multiple=True),
    Option("budget", "budget", "multiplies the schedule pairs per perturbation (>= 1; "
           "default: 1)", "N", _int("budget")),
    Option("seed", "seed", "seed of workloads and schedules; the same seed gives the same "
           "cases (>= 0; default: 0)", "N", _int("seed")),
    Option("device", "device", "cpu or cuda (default: cuda when available, else cpu)",
           "DEVICE", _word("device", ("cpu", "cuda"))),
    Option("heads", "heads", "query heads, KV heads, head dim (default: 4:2:64 at small "
           "scale, 32:8:128 at large)", "Hq:Hkv:D", _text("heads")),
    Option("scale", "scale", "case sizes: small (CPU, interpreter) or large (production "
           "shapes) (default: small on cpu, large on cuda)", "SCALE",
           _word("scale", ("small", "large"))),
    Option("accuracy_rows", "accuracy-rows", "rows per schedule compared against the float64 "
           "reference (>= 1; default: 16)", "N", _int("accuracy_rows")),
    Option("max_violations", "max-violations", "violations kept per cell, all are counted "
           "(>= 0; default: 3)", "N", _int("max_violations")),
    Option("shrink", "no-shrink", "do not shrink failing cases to a minimal reproducer",
           switch=True, switch_value=False),
    Option("isolate", "isolate", "run each cell in a child process: a crash of the backend "
           "(segfault, CUDA illegal address) becomes an error cell and the run goes on (the "
           "check is sent by value: a lambda or a closure is refused before the run)",
           switch=True, switch_value=True),
    Option("features", "feature", "an attention feature to check with: window=N (sliding "
           "window, window_left), sinks (attention sinks), softcap=X (logit soft-cap), "
           "kv_scale=tensor|head (FP8 scales); repeatable or comma-separated, they combine "
           "(default: none)", "KEY[=VALUE]", parse_feature, multiple=True,
           combine=feature_settings),
    Option("kv_dtype", "kv-dtype", "KV cache dtype: fp8_e4m3 (an FP8 cache with "
           "dequantization scales; queries float16/bfloat16) (default: the query dtype)",
           "DTYPE", canonical_kv_dtype),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def add_options(addoption: Callable[..., Any], prefix: str = "", *,
                exclude: Iterable[str] = ()) -> None:
    """Declare every option through ``addoption`` (argparse's ``add_argument`` or pytest's
    ``group.addoption``) as ``--{prefix}{flag}``, with ``dest`` = ``{prefix_}{name}``.

    Defaults are ``None`` ("not given"), so a face can tell an explicit value from its own
    fallbacks (pytest: the ini file); :func:`invariance.check` owns the real defaults.
    """
    dest = prefix.replace("-", "_")
    skip = set(exclude)
    for o in OPTIONS:
        if o.name in skip:
            continue
        if o.switch:
            addoption(f"--{prefix}{o.flag}", dest=f"{dest}{o.name}", action="store_true",
                      default=None, help=o.help)
        else:
            addoption(f"--{prefix}{o.flag}", dest=f"{dest}{o.name}", default=None,
                      metavar=o.metavar, help=o.help,
                      action="append" if o.multiple else "store")


def collect(values: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the given (not ``None``) settings into keyword arguments of
    :func:`invariance.check`. ``values`` maps option names (``"perturbations"``) to what a face
    read: strings, lists of strings, or already-typed values."""
    kwargs: dict[str, Any] = {}
    for name, raw in values.items():
        option = _BY_NAME.get(name)
        if option is None:
            raise OptionError(f"unknown setting {name!r}; expected one of "
                              f"{', '.join(_BY_NAME)}")
        if raw is None or (option.switch and not raw):
            continue
        kwargs[name] = option.parse_all(raw) if isinstance(raw, (str, list, tuple)) or \
            option.switch else raw
    return kwargs


def option(name: str) -> Option:
    """The option called ``name`` (its keyword name)."""
    return _BY_NAME[name]
