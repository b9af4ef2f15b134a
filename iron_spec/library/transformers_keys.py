"""What transformers reads of a config.json, for one model type: recorded beside a golden
(its meta's ``config_keys``) and gathered into ``keys.json`` (``iron_spec.keys``), so a
load tells a key that changes the model from one transformers never reads.

A key is *read* where transformers' config class holds it or its model code asks for it:

- a field the config class declares (its dataclass fields, ``__init__``'s parameters for a
  class written without fields); the fields every class inherits from PreTrainedConfig
  (``return_dict``, ``id2label``, ``chunk_size_feed_forward``, ``architectures``) only
  where code below reads them, as any other attribute (they shape outputs, task heads and
  provenance, which no code of a family's model reads as it computes);
- an alias in the class's ``attribute_map`` (ExaoneConfig's ``num_layers`` for
  ``num_hidden_layers``);
- a keyword the config classes take out of their ``**kwargs`` and keep
  (``kwargs.pop("torch_dtype")`` into ``dtype``, ``rope_scaling`` into
  ``rope_parameters``), found in the family's configuration module, PreTrainedConfig's
  ``__post_init__`` and the RoPE mixin (its keywords only for a class holding
  ``rope_parameters``, the only one it converts them for); a pop whose value is dropped
  (``_commit_hash``) is no read;
- an attribute the model code reads off a config: ``config.X``, ``self.config.X``,
  ``text_config.X`` (any name ending in ``config``), ``getattr(config, "X", ...)``,
  ``hasattr(config, "X")``, found by a static scan (Python's ``ast``) of the module of
  the model class transformers builds for the model type, the modules of its bases, and
  the modules every model runs through (``SHARED``). A key config.json holds that no
  field takes is set on the config as an attribute, so such a read sees it.

Not read: keys starting with ``_`` (transformers' bookkeeping: ``_name_or_path``,
``_commit_hash``), generation settings (``GenerationConfig``'s, which PreTrainedConfig
pops and drops: ``cache_implementation``, ``max_length``), and every other key no field,
alias or read names (``auto_map``, legacy names such as Falcon's
``apply_residual_connection_post_layernorm``). The scan is a superset by design: a read
in a branch a model never takes still counts, so a key is only ever called unread where
no code of the family's names it. Generation code (``generation/``) is not scanned: what
it reads chooses tokens, not logits.

Only golden recording imports this module (it imports transformers).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
from pathlib import Path
from typing import Any

# Modules every model runs through, relative to transformers' package folder.
SHARED = ("modeling_utils.py", "modeling_rope_utils.py", "masking_utils.py", "cache_utils.py",
          "modeling_layers.py", "integrations/sdpa_attention.py")
# Where every config class takes keywords out of **kwargs as it is built: PreTrainedConfig's
# __post_init__ and the RoPE mixin (its other methods load files: their keywords are
# from_pretrained's, no config.json key's).
ROPE_MIXIN = "RotaryEmbeddingConfigMixin"
CONFIG_SHARED = {"configuration_utils.py": "PreTrainedConfig.__post_init__",
                 "modeling_rope_utils.py": ROPE_MIXIN}
# transformers 4's RoPE keys, which PreTrainedConfig.__post_init__ hands to the mixin.
ROPE_KEYWORDS = frozenset({"rope_scaling", "rope_theta", "partial_rotary_factor"})


def _configish(node: ast.AST) -> bool:
    """An expression naming a config: a name or attribute ending in ``config``."""
    if isinstance(node, ast.Name):
        return node.id.endswith("config")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("config")
    return False


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@functools.lru_cache(maxsize=None)
def scan(path: str) -> frozenset[str]:
    """The config attributes the Python module at ``path`` reads: ``<config>.X`` loaded (not
    called, not assigned), ``getattr(<config>, "X"[, d])`` and ``hasattr(<config>, "X")``;
    names starting with ``_`` left out."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and \
                _configish(n.value) and id(n) not in called:
            out.add(n.attr)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                n.func.id in ("getattr", "hasattr") and len(n.args) >= 2 and \
                _configish(n.args[0]) and _literal(n.args[1]) is not None:
            out.add(_literal(n.args[1]))
    return frozenset(k for k in out if not k.startswith("_"))


@functools.lru_cache(maxsize=None)
def kept_keywords(path: str, within: str | None = None) -> frozenset[str]:
    """The keywords a configuration module (its class or method ``within`` alone, where given
    as ``Class`` or ``Class.method``) takes
    out of ``kwargs`` and keeps: ``kwargs.pop("X", ...)`` or ``kwargs.get("X", ...)``
    whose value is used (a pop that is a statement of its own drops it), and
    ``getattr(self, "X", ...)``."""
    tree: ast.AST = ast.parse(Path(path).read_text(encoding="utf-8"))
    for name in (within or "").split(".") if within else []:
        tree = next(n for n in ast.iter_child_nodes(tree) if isinstance(
            n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)
    dropped = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    out = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call) or not n.args:
            continue
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in ("pop", "get") and \
                isinstance(f.value, ast.Name) and f.value.id == "kwargs" and \
                _literal(n.args[0]) is not None and id(n) not in dropped:
            out.add(_literal(n.args[0]))
        elif isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and \
                len(n.args) >= 2 and isinstance(n.args[0], ast.Name) and \
                n.args[0].id == "self" and _literal(n.args[1]) is not None:
            out.add(_literal(n.args[1]))
    return frozenset(out)


def fields(config_class) -> list[str]:
    """The config class's fields: its dataclass fields, else ``__init__``'s parameters."""
    try:
        return [f.name for f in dataclasses.fields(config_class)]
    except TypeError:
        params = inspect.signature(config_class.__init__).parameters.values()
        return [p.name for p in params if p.name != "self"
                and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _package() -> Path:
    import transformers
    return Path(transformers.__file__).resolve().parent


def _model_modules(model_class) -> list[Path]:
    """The modules of ``model_class`` and of its bases that transformers' models define."""
    root = _package() / "models"
    out = []
    for cls in inspect.getmro(model_class):
        try:
            path = Path(inspect.getfile(cls)).resolve()
        except TypeError:
            continue
        if root in path.parents and path not in out:
            out.append(path)
    return out


def record(config_class, model_class) -> dict[str, Any]:
    """What transformers reads of a config.json of ``config_class`` when it builds
    ``model_class``: ``{"class", "model", "model_type", "transformers", "fields",
    "aliases", "kwargs", "modeling"}``; ``fields`` the class's own, sorted (not
    PreTrainedConfig's), ``aliases`` the class's
    ``attribute_map`` (alias -> field), ``kwargs`` the keywords the config classes keep
    (``kept_keywords``) that are no field, ``modeling`` each key the family's model code
    reads (``scan``) that is neither a field nor an alias, with the modules reading it
    (relative to transformers' package), ``shared`` each of the ``SHARED`` modules with the
    keys it reads that are neither."""
    import transformers

    from transformers import PreTrainedConfig

    root = _package()
    # PreTrainedConfig's own fields (return_dict, id2label, chunk_size_feed_forward ...) are
    # every class's: read where some code scanned reads them, as any other attribute.
    base = set(fields(PreTrainedConfig))
    own = [f for f in fields(config_class) if f not in base]
    aliases = dict(getattr(config_class, "attribute_map", {}) or {})
    config_modules = [Path(inspect.getfile(c)).resolve() for c in inspect.getmro(config_class)
                      if c.__module__.startswith("transformers.")
                      and Path(inspect.getfile(c)).resolve() != root / "configuration_utils.py"]
    kwargs = set()
    for path in config_modules:
        kwargs |= kept_keywords(str(path))
    for path, within in CONFIG_SHARED.items():
        kwargs |= kept_keywords(str(root / path), within)
    if "rope_parameters" not in own:
        # RoPE's keywords are taken (into rope_parameters) only by a class holding it
        # (PreTrainedConfig.__post_init__: hasattr(self, "rope_parameters")); elsewhere such
        # a key is an attribute like any other, read where the model code reads it.
        kwargs -= kept_keywords(str(root / "modeling_rope_utils.py"), ROPE_MIXIN) | ROPE_KEYWORDS
    modeling: dict[str, list[str]] = {}
    for path in _model_modules(model_class):
        for key in scan(str(path)):
            if key not in own and key not in aliases:
                modeling.setdefault(key, []).append(str(path.relative_to(root)))
    shared = {p: sorted(k for k in scan(str(root / p)) if k not in own and k not in aliases)
              for p in SHARED}
    return {"class": config_class.__name__, "model": model_class.__name__,
            "model_type": config_class.model_type, "transformers": transformers.__version__,
            "fields": sorted(own), "aliases": dict(sorted(aliases.items())),
            "kwargs": sorted(k for k in kwargs if k not in own and k not in aliases
                             and not k.startswith("_")),
            "modeling": {k: sorted(v) for k, v in sorted(modeling.items())},
            "shared": shared}
