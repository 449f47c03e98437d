"""Models without downloads: what ``invariance model MODEL`` accepts and how it is built.

``MODEL`` is one of:

- a shipped configuration of a popular family with random weights (:data:`CONFIGS`: ``llama``,
  ``qwen2-sliding``, ``mixtral``), tiny by default, any field overridden as
  ``name:key=value,...`` (``llama:hidden_size=1024,num_hidden_layers=8``); needs
  ``transformers`` (``pip install 'invariance[models]'``);
- ``module:attr`` or ``path/file.py:attr`` naming a ``torch.nn.Module``, a callable returning
  one (called with no arguments, under the check's seed), or a ``transformers`` config;
- a local directory holding a Hugging Face ``config.json`` (with its weights when present,
  else random weights), or a ``config.json`` file;
- from Python, the module, callable or config object itself.

Nothing is ever fetched from a hub: ``HF_HUB_OFFLINE=1`` is set before ``transformers`` is
imported and every load passes ``local_files_only=True``. Random weights come from a fixed
seed, drawn on the CPU (so every device gets the same weights) inside ``torch.random.fork_rng``
(the caller's random state is left alone).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CONFIGS", "LoadedModel", "ModelSpec", "load_model", "model_name"]

#: A model as :func:`load_model` takes it.
ModelSpec = Any

_BASE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 64, "max_position_embeddings": 512, "tie_word_embeddings": False}

#: Shipped configurations: name -> (transformers config class, fields, description). Head dim
#: 64 so that ``--attention kernels`` can run them (the kernels take head dims 64, 128, 256).
CONFIGS: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama": ("LlamaConfig", dict(_BASE),
              "Llama-like dense decoder: GQA (2 query heads, 1 KV head, head dim 64), RoPE, "
              "RMSNorm, SwiGLU MLP; 2 layers, hidden 64"),
    "qwen2-sliding": ("Qwen2Config", {
        **_BASE, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
        "layer_types": ["full_attention", "sliding_attention"]},
        "Qwen2-like decoder whose second layer attends through a sliding window of 4 tokens "
        "(Gemma-2/3 and Mistral use such windows); 2 layers, hidden 64"),
    "mixtral": ("MixtralConfig", {**_BASE, "num_local_experts": 4, "num_experts_per_tok": 2},
                "Mixtral-like sparse mixture of experts: 4 experts, top-2 routing per token; "
                "2 layers, hidden 64"),
}


@dataclass
class LoadedModel:
    """A built model: the module (in eval mode, on its device and dtype), the name reports and
    reproducers use (``None`` when it cannot be rebuilt from a name: a module object), and
    where it came from."""

    module: torch.nn.Module
    name: str | None
    source: str
    huggingface: bool


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise ValueError("model: this model needs transformers (pip install "
                         "'invariance[models]'), which is not installed") from None
    return transformers


def _is_hf_config(obj: object) -> bool:
    return any(c.__name__ == "PretrainedConfig" or c.__name__ == "PreTrainedConfig"
               for c in type(obj).__mro__)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _split_options(spec: str, text: str) -> dict[str, Any]:
    """``key=value,key=value`` (values as JSON when they parse, lists kept whole)."""
    out: dict[str, Any] = {}
    depth, start, items = 0, 0, []
    for i, ch in enumerate(text):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"model {spec!r}: expected config overrides as key=value[,...], "
                             f"got {item.strip()!r}")
        out[key] = _value(value)
    return out


def _from_config(config: Any, seed: int, weights: Path | None = None) -> torch.nn.Module:
    tf = _transformers()
    causal = any(str(a).endswith("ForCausalLM") for a in (getattr(config, "architectures", None)
                                                            or ["ForCausalLM"]))
    auto = tf.AutoModelForCausalLM if causal else tf.AutoModel
    if weights is not None:
        return auto.from_pretrained(str(weights), local_files_only=True)  # type: ignore[no-any-return]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return auto.from_config(config)  # type: ignore[no-any-return]


def _shipped(spec: str, name: str, overrides: str | None, seed: int) -> LoadedModel:
    tf = _transformers()
    cls_name, fields, _ = CONFIGS[name]
    cls = getattr(tf, cls_name)
    given = _split_options(spec, overrides) if overrides else {}
    known = cls().to_dict()
    unknown = sorted(k for k in given if k not in known)
    if unknown:
        raise ValueError(f"model {spec!r}: {cls_name} has no field {unknown[0]!r}; expected "
                         f"some of {', '.join(sorted(k for k in known if not k.startswith('_')))}")
    values = {**fields, **given}
    try:
        config = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model {spec!r}: {cls_name} rejects the overrides: {exc}") from None
    return LoadedModel(_from_config(config, seed), spec, f"{cls_name}, random weights "
                       f"(seed {seed})", True)


def _local(spec: str, path: Path, seed: int) -> LoadedModel:
    tf = _transformers()
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        got = "a directory without one" if path.is_dir() else "no such file"
        raise ValueError(f"model {spec!r}: expected a directory with a config.json or a "
                         f"config .json file, got {got}")
    try:
        config = tf.AutoConfig.from_pretrained(str(config_file.parent if path.is_dir() else path),
                                               local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"model {spec!r}: cannot read its config: {exc}") from None
    weights = path.is_dir() and any(
        p.suffix in (".safetensors", ".bin") for p in path.iterdir())
    module = _from_config(config, seed, path if weights else None)
    what = "its weights" if weights else f"random weights (seed {seed})"
    return LoadedModel(module, spec, f"{type(config).__name__} from {path}, {what}", True)


def _import_target(spec: str) -> Any:
    """The object ``module:attr`` or ``path/file.py:attr`` names."""
    import importlib
    import importlib.util
    import sys

    split = spec.rpartition if ".py:" in spec else spec.partition
    module_name, _, attr = split(":")
    if not module_name or not attr:
        raise ValueError(f"model: expected 'module:attr' or 'path/file.py:attr', got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ImportError(f"no file {module_name}")
            loader_spec = importlib.util.spec_from_file_location(
                f"_invariance_model_{path.stem}", path)
            if loader_spec is None or loader_spec.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[loader_spec.name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model {spec!r}: cannot import module {module_name!r}: {exc}"
                         ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"model {spec!r}: module {module_name!r} has no attribute "
                             f"{attr!r}") from None
    return obj


def _build(obj: Any, name: str | None, seed: int, what: str) -> LoadedModel:
    if isinstance(obj, torch.nn.Module):
        return LoadedModel(obj, name, f"{type(obj).__name__} object", _is_hf_model(obj))
    if _is_hf_config(obj):
        return LoadedModel(_from_config(obj, seed), name, f"{type(obj).__name__}, random "
                           f"weights (seed {seed})", True)
    if callable(obj):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = obj()
        if not isinstance(built, torch.nn.Module):
            raise ValueError(f"model {what}: expected the callable to return a "
                             f"torch.nn.Module, got {type(built).__name__}")
        return LoadedModel(built, name, f"built by {name or what} (seed {seed})",
                           _is_hf_model(built))
    raise ValueError(f"model {what}: expected a torch.nn.Module, a callable returning one or a "
                     f"transformers config, got {type(obj).__name__}")


def _is_hf_model(module: torch.nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)


def model_name(obj: object) -> str | None:
    """A name that rebuilds ``obj`` in another process (``module:attr`` or
    ``path/file.py:attr``), or ``None`` for an object that cannot be named (a module
    instance)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, torch.nn.Module) or _is_hf_config(obj) or not callable(obj):
        return None
    from invariance.backends import _callable_name

    name = _callable_name(obj)
    return name if ":" in name else None


def load_model(spec: ModelSpec, *, seed: int = 0, device: torch.device | None = None,
               dtype: torch.dtype | None = None) -> LoadedModel:
    """Build the model ``spec`` names (module docstring) in eval mode, on ``device`` and, when
    given, cast to ``dtype``. ``ValueError`` naming ``model`` for a spec that names nothing
    buildable."""
    loaded: LoadedModel
    if isinstance(spec, str):
        if not spec.strip():
            raise ValueError("model: expected a name, 'module:attr', 'path/file.py:attr' or a "
                             "local directory, got ''")
        head, sep, rest = spec.partition(":")
        if head in CONFIGS:
            loaded = _shipped(spec, head, rest if sep else None, seed)
        elif (path := Path(spec)).exists() and (path.is_dir() or path.suffix == ".json"):
            loaded = _local(spec, path, seed)
        elif ":" in spec:
            loaded = _build(_import_target(spec), spec, seed, repr(spec))
        else:
            raise ValueError(
                f"model: expected one of {', '.join(CONFIGS)} (optionally name:key=value,...), "
                f"'module:attr', 'path/file.py:attr' or a local directory with a config.json, "
                f"got {spec!r}")
    else:
        loaded = _build(spec, model_name(spec), seed, f"object {type(spec).__name__}")
    module = loaded.module
    module.eval()
    if dtype is not None:
        module.to(dtype=dtype)
    if device is not None:
        module.to(device=device)
    return loaded
