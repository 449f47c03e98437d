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
    "OPTIONS",
    "Option",
    "OptionError",
    "add_options",
    "canonical_dtype",
    "check_int",
    "collect",
    "dtype_names",
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
    """

    name: str
    flag: str
    help: str
    metavar: str = ""
    parse: Callable[[str], Any] = str
    multiple: bool = False
    switch: bool = False
    switch_value: Any = None

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
            return list(dict.fromkeys(self.parse(t) for t in texts if t))
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
