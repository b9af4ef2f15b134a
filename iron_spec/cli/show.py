"""``iron-spec show``: the model a spec expands to, and where each of its weights comes from.

On a checkpoint's config.json (``--checkpoint``) or the spec's toy one (``--toy``, the
default): every config field's value and source, the layer pattern (each run of alike
layers: kind, window, RoPE table), a ``recurrence:`` schedule (its stacks, states and
steps, repeats with their counts), the RoPE tables, the module tree with each parameter's
shape and dtype (given a checkpoint, the form a load holds it in: ``held_forms``) and,
given a checkpoint, the tensor it loads from after renames; then the
tensors nothing loads and the parameters nothing fills; a composite checkpoint's towers
(the spec's ``towers:`` for its architecture) likewise, each after the text model. Only the
checkpoint's headers are read, never its weights. ``--format json`` gives the same for scripts.

Not for: checking a spec (``lint``), running one (``cli run``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from iron_spec.runtime.blocks.experts import Experts
from iron_spec.runtime.checkpoint import FLOATS, Checkpoint, Placement, TensorInfo, place, renamed
from iron_spec.runtime.holding import held_stored
from iron_spec.runtime.host import checkpoint_directory
from iron_spec.runtime.module import Module, Param
from iron_spec.runtime.parts import moved, subtree

from iron_spec.spec import gguf_files, parts
from iron_spec.spec.arguments import said
from iron_spec.spec.build import (checkpoint_names, read_config, refuse_other_architecture,
                                  weights_source)
from iron_spec.spec.accounting import account
from iron_spec.spec.config import ALLOW_UNREAD, ALLOW_UNREAD_HELP, resolve
from iron_spec.spec.loader import Spec, load_spec
from iron_spec.spec.options.recurrence import outline
from iron_spec.spec.shapes import fields_of
from iron_spec.spec.tree import build_tree
from iron_spec.spec.options.towers import entries as tower_entries, held
from iron_spec.spec.towers import tower_tree

from .command import (CHECKPOINT_HELP, CHECKPOINT_METAVAR, EXPECTED, SPEC_HELP, UsageError,
                      pick_spec, refuse)

FORMATS = ("text", "json")
PARAM_DTYPE = "float32"  # a parameter's dtype on no checkpoint (drawn weights: float32)
_ITEMSIZE = {"float32": 4}


def _tied(tree: Module) -> dict[str, str]:
    """Each tied param name and the name it shares a param with."""
    return place(tree, {}, {}).tied


@dataclass
class View:
    """Everything ``show`` prints, gathered once for both formats."""

    spec: Spec
    on: str  # what the config came from
    config: dict[str, dict[str, Any]]
    tree: Module
    layers: list[dict[str, Any]]
    ropes: dict[str, dict[str, Any]]
    checkpoint: Optional[str] = None
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    placement: Optional[Placement] = None
    recurrence: list[str] = field(default_factory=list)  # recurrence.outline's lines
    # config.json keys read by neither the spec nor transformers (accounting.Accounted):
    # (key, value, why), loaded as they are; and those read by transformers and not the
    # spec that --allow-unread-config let through (key, value).
    unread: list[tuple[str, Any, str]] = field(default_factory=list)
    allowed: list[tuple[str, Any]] = field(default_factory=list)
    # A composite checkpoint's towers, each a view of its own (no towers of their own).
    towers: list["View"] = field(default_factory=list)
    name: Optional[str] = None  # a tower's name (the spec's towers[].name)
    renames: dict[str, str] = field(default_factory=dict)  # as the config resolves them
    # Given a checkpoint, the form each param is held in under --weights stored (the
    # default), by the param's id (a tied one shares its param's): ``held_forms``.
    held: dict[int, str] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Every tensor placed and every parameter filled, the towers' too."""
        return (self.placement is None or self.placement.fits) \
            and all(t.fits for t in self.towers)


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def gather(spec_path: Path, checkpoint: Optional[str], allow_unread_config: bool = False) -> View:
    """The view of ``spec_path`` on ``checkpoint``'s config.json and headers, or on its toy;
    a config.json key the spec neither reads nor ignores is refused unless
    ``allow_unread_config`` (``accounting.account``).

    Raises:
        FileNotFoundError: no spec, checkpoint or config.json there.
        SpecError: the spec does not load or expand, or leaves a config.json key unread.
        CheckpointError: the checkpoint's headers are malformed.
        ValueError: the expanded model does not build.
    """
    spec = load_spec(spec_path)
    directory = None
    weights_source(checkpoint, None, False)  # a checkpoint of '' names nothing
    if checkpoint is not None:
        directory = checkpoint_directory(checkpoint, said("checkpoint", str(checkpoint)))
        if gguf_files.is_gguf(directory):  # its config.json is built from its metadata
            config_json, on, source = gguf_files.config_json(spec, directory), str(directory), \
                "config.json"
        else:
            config_json, on, source = read_config(directory), str(directory / "config.json"), \
                "config.json"
    else:
        toy = spec.get("toy", "config")
        if not isinstance(toy, dict):
            raise spec.error((), "this spec has no toy: section; give --checkpoint DIR")
        config_json, on, source = toy, f"{spec.file} toy.config", "toy.config"
    part = parts.find(spec, config_json) if directory is not None else None
    whole = config_json
    if part is not None:  # a part of a bigger checkpoint: its config, its tensors
        config_json, on = parts.config_of(spec, part, config_json, on, allow_unread_config)
        source = f"{source}: {part.config}" if part.config else source
    else:
        refuse_other_architecture(spec, config_json, on)
    accounted = account(spec, config_json, on, allow_unread_config)
    renames: dict = {}  # as this config resolves them: a {when: ...} target chosen
    tree = build_tree(spec, config_json, on, part, renames)
    resolved = resolve(spec, config_json, source)
    options = getattr(tree, "config", None)
    view = View(spec, on, {n: {"value": v, "source": resolved.sources[n]}
                           for n, v in resolved.values.items()}, tree,
                [_flat(lo) for lo in getattr(options, "layers", ())],
                {n: dataclasses.asdict(r) for n, r in (getattr(options, "ropes", None) or {}).items()},
                unread=accounted.unread, allowed=accounted.allowed)
    schedule = getattr(options, "recurrence", None)
    if schedule is not None:
        view.recurrence = outline(spec, resolved, schedule, resolved.values["num_hidden_layers"])
    if directory is not None:
        view.checkpoint = str(directory)
        view.renames = renames
        read = gguf_files.checkpoint(
            spec, directory, config_json, checkpoint_names(tree, renames),
            checkpoint_names(tree, renames, transposed=True)) \
            if gguf_files.is_gguf(directory) else Checkpoint(directory)
        view.tensors = read.tensors
        left = []
        if part is not None:
            view_part = subtree(Checkpoint(directory), part.tensors, part.unused)
            view.tensors, left = view_part.tensors, view_part.left
        unused = spec.get("checkpoint", "unused", default=[]) or []
        view.placement = place(tree, {n: t.shape for n, t in view.tensors.items()}, renames,
                               unused)
        if part is not None:  # shown by the file's own names
            view.tensors = _by_own_names(view.placement, view.tensors, view_part.source)
        view.placement.unused += left
        if not gguf_files.is_gguf(directory):  # a GGUF's quantized types are dequantized
            view.placement.not_float = [s for s in view.placement.sources.values()
                                        if view.tensors[s].dtype not in FLOATS]
        # A part's tensors go by the whole file's names now: its forms are the whole's.
        view.held = held_forms(tree, view.placement, view.tensors, read.stored_form)
        if part is not None and not gguf_files.is_gguf(directory):
            view.towers = [_tower(spec, e, whole, directory, options.hidden_size,
                                  allow_unread_config)
                           for e in tower_entries(spec) if held(e, whole)]
            theirs = {n for t in view.towers for n in t.tensors}
            # The text part leaves the towers' tensors unread; the towers read them.
            view.placement.unused = [n for n in view.placement.unused if n not in theirs]
    return view


def _by_own_names(placement: Placement, tensors: dict[str, TensorInfo],
                  own: Callable[[str], str]) -> dict[str, TensorInfo]:
    """A part's placement renamed in place to the whole file's tensor names (``own``: the
    part's ``source``), and its tensors by those names."""
    placement.sources = {k: own(v) for k, v in placement.sources.items()}
    placement.ignored = [own(n) for n in placement.ignored]
    placement.unused = [own(n) for n in placement.unused]
    placement.unplaced = [(own(a), b) for a, b in placement.unplaced]
    placement.misshaped = [(own(a), b) for a, b in placement.misshaped]
    return {own(n): t for n, t in tensors.items()}


def _tower(spec: Spec, entry, whole: dict, directory: Path, hidden: int,
           allow_unread_config: bool) -> View:
    """The view of ``entry``'s tower in the composite checkpoint at ``directory`` (its
    config ``whole``): config fields, encoder layers, tree, and its tensors placed by the
    file's own names (as ``spec.towers`` loads them).

    Raises:
        SpecError: as ``spec.towers.tower_tree``.
    """
    built = tower_tree(spec, entry, whole, directory, hidden, allow_unread_config)
    ex = built.expanded
    whole_ckpt = Checkpoint(directory)
    others = [n for n in whole_ckpt.tensors if moved(n, entry.tensors) is None]
    sub = subtree(whole_ckpt, entry.tensors, others)
    placement = place(built.tree, {n: t.shape for n, t in sub.tensors.items()}, ex.renames,
                      ex.unused)
    tensors = _by_own_names(placement, sub.tensors, sub.source)
    placement.not_float = [s for s in placement.sources.values()
                           if tensors[s].dtype not in FLOATS]
    layers = getattr(getattr(built.options, "encoder", None), "layers", ())
    return View(built.entry.spec, f"{directory / 'config.json'}: {entry.source_key}",
                {n: {"value": v, "source": ex.resolved.sources[n]}
                 for n, v in ex.resolved.values.items()},
                built.tree, [_flat(lo) for lo in layers if dataclasses.is_dataclass(lo)], {},
                checkpoint=str(directory), tensors=tensors, placement=placement,
                name=entry.name,
                held=held_forms(built.tree, placement, tensors, whole_ckpt.stored_form))


def held_forms(tree: Module, placement: Placement, tensors: dict[str, TensorInfo],
               stored_form: Callable[[str], Optional[str]]) -> dict[int, str]:
    """The form each placed param of ``tree`` is held in under ``--weights stored`` (the
    default), by the param's id, from the checkpoint's headers alone: as
    ``runtime.checkpoint.load`` holds it (``holding.held_stored``: a holdable matrix in
    its stored form, ``stored_form(tensor)``, where that is one a kernel reads, else F32),
    a mixture's expert stacks as ``Experts.held_as_stored`` says (each stack's tensors
    by their stored forms: one BF16 or F16 form kept, else F32)."""
    names = {id(p): n for n, p in tree.named_params()}
    out: dict[int, str] = {}
    todo = [tree]
    while todo:
        m = todo.pop()
        if isinstance(m, Experts):
            params = m.stack_params()
            sources = [placement.sources.get(names.get(id(p), "")) for p in params]
            form = "F32" if None in sources else m.held_as_stored(
                [getattr(tensors[s], "stored", tensors[s].dtype) for s in sources])
            out.update((id(p), form) for p in params)
        todo += [child for _, child in m.children()]
    for name, param in tree.named_params():
        if id(param) not in out and name in placement.sources:
            out[id(param)] = held_stored(param, stored_form(placement.sources[name]))
    return out


def sizes(view: View) -> dict[str, Any]:
    """The parameters widened to float32 (``--weights float32``), a tied one once:
    ``{"count", "bytes", "by_dtype": {dtype: {"count", "bytes"}}}``; given a checkpoint,
    ``"stored"``: its tensors by the dtype they are stored in, bytes as in its files (what
    ``--weights stored``, the default, holds of the weights)."""
    held: dict[str, dict[str, int]] = {}
    seen: set[int] = set()
    for _, param in view.tree.named_params():
        if id(param) in seen:
            continue
        seen.add(id(param))
        n = math.prod(param.shape)
        row = held.setdefault(PARAM_DTYPE, {"count": 0, "bytes": 0})
        row["count"] += n
        row["bytes"] += n * _ITEMSIZE[PARAM_DTYPE]
    out: dict[str, Any] = {"count": sum(r["count"] for r in held.values()),
                           "bytes": sum(r["bytes"] for r in held.values()), "by_dtype": held}
    if view.placement is not None:
        stored: dict[str, dict[str, int]] = {}
        for t in view.tensors.values():
            n = math.prod(t.shape)
            # a GGUF tensor's own type (Q4_1), not the float dtype it reads as
            row = stored.setdefault(getattr(t, "stored", t.dtype), {"count": 0, "bytes": 0})
            row["count"] += n
            row["bytes"] += t.end - t.begin
        out["stored"] = stored
    return out


def _amount(count: int, nbytes: int, dtype: str) -> str:
    return f"{count:,} {dtype} ({nbytes:,} bytes, {nbytes / 2**20:.1f} MiB)"


def _runs(layers: list[dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    """Consecutive alike layers as (first, last, options)."""
    runs: list[tuple[int, int, dict[str, Any]]] = []
    for i, lo in enumerate(layers):
        if runs and runs[-1][2] == lo:
            runs[-1] = (runs[-1][0], i, lo)
        else:
            runs.append((i, i, lo))
    return runs


def _pattern_columns(layers: list[dict[str, Any]]) -> list[str]:
    """The options a reader looks for (kind, window, RoPE table), then any that vary."""
    # Every layer's keys, in order: a layer holding a mixture of experts has the experts'
    # own, layers of another token mixer hold other options.
    keys = list(dict.fromkeys(k for lo in layers for k in lo))
    shown = [k for k in keys if k.rsplit(".", 1)[-1] in ("kind", "window", "rope", "placement")
             and not k.startswith(("norm.", "mlp.", "experts."))]
    varying = [k for k in keys if k not in shown and not k.startswith("experts.")
               and len({repr(lo.get(k)) for lo in layers}) > 1]
    # A mixture of experts is one column: its count and top-k, or the dense MLP.
    moe = ["experts"] if any("experts.count" in lo for lo in layers) else []
    return shown + varying + moe


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def render_text(view: View) -> str:
    out = [f"spec      {view.spec.file} ({view.spec.get('name')}, model "
           f"{view.spec.get('model')})", f"config    {view.on}"]
    if view.checkpoint:
        out.append(f"weights   {view.checkpoint} ({len(view.tensors)} tensors, headers only)")
    out += _body(view)
    for t in view.towers:
        out += ["", "", f"tower     {t.name} ({type(t.tree).__name__})", f"config    {t.on}",
                f"weights   {len(t.tensors)} tensors of {t.checkpoint}"] + _body(t)
    return "\n".join(out)


def _body(view: View) -> list[str]:
    """A view's lines after its header: sizes, config fields, layers, tree, placement."""
    out = []
    size = sizes(view)
    out.append("params    " + ", ".join(_amount(r["count"], r["bytes"], d)
                                       for d, r in size["by_dtype"].items())
               + " widened (--weights float32)"
               + (f" ({size['count']:,} in all)" if len(size["by_dtype"]) > 1 else ""))
    if "stored" in size:
        out.append("stored    " + ", ".join(_amount(r["count"], r["bytes"], d)
                                           for d, r in size["stored"].items())
                   + " in the checkpoint's files, held so by --weights stored (the default;"
                   " norms and biases float32)")
    out += ["", "config fields"]
    width = max(map(len, view.config), default=0)
    for name, c in view.config.items():
        out.append(f"  {name:<{width}}  {_short(c['value']):<24}  {c['source']}")
    if view.unread or view.allowed:
        out += ["", "config.json keys unread"]
        width = max(len(k) for k, *_ in view.unread + view.allowed)
        out += [f"  {k:<{width}}  {_short(v):<24}  read by neither the spec nor transformers"
                for k, v, _ in view.unread]
        out += [f"  {k:<{width}}  {_short(v):<24}  read by transformers, not the spec "
                "(--allow-unread-config)" for k, v in view.allowed]
    if view.layers:
        cols = _pattern_columns(view.layers)
        out += ["", f"layers ({len(view.layers)})"]
        for a, b, lo in _runs(view.layers):
            which = f"{a}" if a == b else f"{a}-{b}"
            parts = []
            for k in cols:
                if k == "experts":
                    parts.append(f"experts {lo['experts.count']} (top {lo['experts.router.top_k']}"
                                 f"{', shared' if lo.get('experts.shared_size') else ''})"
                                 if "experts.count" in lo else "dense mlp")
                    continue
                if k not in lo:  # an option of another token mixer's layers
                    continue
                v = lo[k]
                if k.endswith("window"):
                    parts.append("full attention" if v is None else f"sliding window {v}")
                elif k.endswith("rope"):
                    parts.append("no rope" if v is None else f"rope {v}")
                else:
                    parts.append(f"{k} {v}")
            out.append(f"  {which:<7} {', '.join(parts)}")
    if view.recurrence:
        out += ["", "recurrence"] + [f"  {line}" for line in view.recurrence]
    if view.ropes:
        out += ["", "rope tables"]
        for name, r in view.ropes.items():
            out.append(f"  {name}: " + ", ".join(f"{k} {_short(v)}" for k, v in r.items()))
    out += ["", "modules and parameters" + (" (held as by --weights stored, the default; <- "
                                             "checkpoint tensor as stored)"
                                             if view.placement else "")]
    out += _tree_lines(view, view.tree, type(view.tree).__name__, 1)
    if view.placement is not None:
        out += [""] + _summary(view)
    return out


def _tree_lines(view: View, module: Module, label: str, depth: int) -> list[str]:
    pad = "  " * depth
    lines = [f"{pad[2:]}{label}"]
    p = view.placement
    for attr, value in vars(module).items():
        if not isinstance(value, Param):
            continue
        name = module.where(attr)
        shape = "[" + ", ".join(map(str, value.shape)) + "]"
        line = f"{pad}{attr:<8} {shape:<14} {_held(view, value):<7}"
        if p is not None:
            if name in p.tied:
                line += f"  tied: shares {p.tied[name]}"
            elif name in p.sources:
                t = view.tensors[p.sources[name]]
                line += f"  <- {p.sources[name]} ({getattr(t, 'stored', t.dtype)} {list(t.shape)})"
            else:
                line += "  <- NOTHING: no tensor fills it"
        lines.append(line)
    for name, child in module.children():
        lines += _tree_lines(view, child, f"{name}  {type(child).__name__}", depth + 1)
    return lines


def _held(view: View, param: Param) -> str:
    """What ``param`` is held as: on a checkpoint its form under --weights stored (a param
    nothing fills: float32, as drawn), else float32."""
    return view.held.get(id(param), PARAM_DTYPE)


def _summary(view: View) -> list[str]:
    p = view.placement
    assert p is not None
    n = len(view.tensors)
    out = [f"checkpoint: {len(p.sources)} of {n} tensors placed, "
           f"{len(p.ignored)} ignored (tied), {len(p.unused)} unused (checkpoint.unused), "
           f"{len(p.unplaced)} left over; {len(p.unfilled)} parameters unfilled, "
           f"{len(p.misshaped)} mis-shaped" +
           (f", {len(p.not_float)} not float" if p.not_float else "")]
    for name, first in p.tied.items():
        state = "its tensor ignored" if any(renamed(s, view.renames) == name
                                            for s in p.ignored) else "no tensor of its own"
        out.append(f"  tied: {name} -> {first} ({state})")
    out += [f"  unused: {s}" for s in p.unused]
    out += [f"  left over: {s}" + (f" (renamed {t})" if t != s else "") for s, t in p.unplaced]
    out += [f"  unfilled: {name}" for name in p.unfilled]
    out += [f"  not float: checkpoint tensor {s} is {view.tensors[s].dtype}; weights are "
            f"{', '.join(FLOATS)}" for s in p.not_float]
    values = {n: f["value"] for n, f in view.config.items()}
    for s, t in p.misshaped:
        stored = p.params[t].stored_shape
        out.append(f"  mis-shaped: checkpoint tensor {s} in "
                   f"{getattr(view.tensors[s], 'file', view.checkpoint)} is "
                   f"{list(view.tensors[s].shape)}; the spec expects {t} to be {list(stored)}"
                   + (" stored transposed (checkpoint.transposed)" if p.params[t].transposed
                      else "") + fields_of(tuple(stored), values))
    return out


def render_json(view: View) -> str:
    return json.dumps(_data(view), indent=2, default=str)


def _data(view: View) -> dict[str, Any]:
    p = view.placement
    tied = _tied(view.tree)
    rows = []
    for name, param in view.tree.named_params():
        row: dict[str, Any] = {"name": name, "shape": list(param.shape), "dtype": PARAM_DTYPE,
                               "held": view.held.get(id(param)) if p is not None else None,
                               "tied_to": tied.get(name), "source": None}
        if p is not None and name in p.sources:
            t = view.tensors[p.sources[name]]
            row.update(source=p.sources[name], source_dtype=getattr(t, "stored", t.dtype),
                       source_shape=list(t.shape))  # a GGUF tensor's block form, as the text
        rows.append(row)
    data: dict[str, Any] = {
        "spec": view.spec.file, "name": view.spec.get("name"), "model": view.spec.get("model"),
        "config_from": view.on, "config": view.config,
        "unread": [{"key": k, "value": v, "why": why} for k, v, why in view.unread],
        "allowed_unread": [{"key": k, "value": v} for k, v in view.allowed],
        "layers": view.layers,
        "ropes": view.ropes, "recurrence": _recurrence_json(view.tree), "params": rows, "parameters": sizes(view), "checkpoint": None}
    if p is not None:
        data["checkpoint"] = {
            "path": view.checkpoint, "tensors": len(view.tensors), "placed": len(p.sources),
            "tied": p.tied, "ignored": p.ignored, "unused": p.unused,
            "unplaced": [s for s, _ in p.unplaced], "unfilled": p.unfilled,
            "misshaped": [s for s, _ in p.misshaped], "not_float": p.not_float,
            "fits": p.fits}
    if view.name is None:
        data["towers"] = [{"tower": t.name, **_data(t)} for t in view.towers]
    return data


def _recurrence_json(tree: Module) -> Optional[dict[str, Any]]:
    """The schedule as the model runs it (repeats unrolled), None without one."""
    schedule = getattr(getattr(tree, "config", None), "recurrence", None)
    if schedule is None:
        return None
    return {"stacks": [{"name": n, "final_norm": f} for n, f in schedule.stacks],
            "states": [{"name": n, "init": i} for n, i in schedule.states],
            "runs": [{"inputs": [{"state": s, "norm": normed} for s, normed in run.inputs],
                      "into": run.into, "stack": run.stack, "begin": run.begin, "end": run.end}
                     for run in schedule.runs],
            "output": schedule.output}


def command(
    spec: Optional[str] = typer.Argument(None, metavar="[SPEC]", help=SPEC_HELP),
    checkpoint: Optional[str] = typer.Option(None, metavar=CHECKPOINT_METAVAR,
                                             help=CHECKPOINT_HELP + ": its config.json, and its "
                                             "tensors placed (headers only)"),
    toy: bool = typer.Option(False, "--toy", help="the spec's toy config (the default without "
                                                  "--checkpoint)"),
    format: str = typer.Option("text", "--format", help="text | json"),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
) -> None:
    """Show the model SPEC expands to: config fields and their sources, layer pattern, module
    tree, and each parameter's checkpoint tensor. Exit 1 where the spec or checkpoint does
    not fit, or a file is refused."""
    if format not in FORMATS:
        raise typer.BadParameter(f"{format!r} is not one of {', '.join(FORMATS)}",
                                 param_hint="--format")
    if toy and checkpoint is not None:
        raise UsageError("--toy shows the spec's toy config; it takes no --checkpoint")
    try:
        spec = pick_spec(spec, checkpoint)  # a name or a path, from any folder; or picked
        view = gather(spec, checkpoint, allow_unread_config)
    except EXPECTED as e:
        refuse(e)
    typer.echo(render_json(view) if format == "json" else render_text(view))
    raise typer.Exit(0 if view.fits else 1)
