"""From a spec and a checkpoint (or drawn weights) to a loaded model, ready to compile.

The one place the declarative layer meets the runtime: it reads config.json, expands the
spec, fits the context to the host, builds the module tree and fills its weights.
"""

from __future__ import annotations

import difflib

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from iron_spec.operators import native as decode_pool
from iron_spec.operators.attention import BLOCK as ATTENTION_BLOCK
from iron_spec.runtime.causal import CausalLM, CausalOptions
from iron_spec.runtime.checkpoint import (Checkpoint, LoadReport, distinct_ties, fill, load,
                                mark_transposed)
from iron_spec.runtime.parts import subtree
from iron_spec.runtime.renames import RenameError, source
from iron_spec.runtime.golden import fingerprint
from iron_spec.runtime.host import checkpoint_directory, fit, host_budget
from iron_spec.runtime import holding
from iron_spec.runtime.module import pack_tree
from iron_spec.runtime.blocks.experts import expert_stacks, hold_experts
from iron_spec.runtime.tokenizer import Tokenizer
from iron_spec.runtime.files import read_object
from iron_spec.runtime.generation import read_generation_config
from iron_spec.runtime.values import TOKEN_KEYS, architectures, token_ids
from iron_spec.runtime.weights import draw_weights

from . import gguf_files, keys, parts
from .accounting import account
from .arguments import said
from .errors import FlagError, NoWeights
from .interpreter import expand
from .shapes import explainer
from .loader import load_spec
from .parts import PartOf

Progress = Callable[[int, int], None]
log = logging.getLogger("iron_spec")


@dataclass
class Loaded:
    """A model ready to run: the tree with its weights (a CausalLM, or an encoder), its
    tokenizer (None without a checkpoint directory), what the spec expanded to, and where
    each weight came from."""

    model: Any
    tokenizer: Any
    expanded: Any
    report: LoadReport
    directory: Path | None
    config_json: dict
    random_weights: int | None = None
    checkpoint: Checkpoint | None = None
    part: PartOf | None = None  # the part of a bigger checkpoint the model is (parts)
    towers: list = field(default_factory=list)  # its towers (spec.towers.LoadedTower)

    def checkpoint_tensors(self) -> dict[str, np.ndarray]:
        """The weights as a checkpoint holds them: the files' tensors (their own names and
        dtypes, unread until touched), or drawn ones under the names and in the layouts a
        checkpoint would use (the spec's renames undone, ``runtime.renames.source``;
        transposed and row-ordered params turned back, ``Param.to_stored``).

        Raises:
            SpecError: the renames give a param from two names alike (which one a
                checkpoint holds is ambiguous).
        """
        if self.checkpoint is not None and self.random_weights is None:
            whole = getattr(self.checkpoint, "whole", self.checkpoint)  # a part: the file's
            return {name: whole.raw(name) for name in whole.tensors}
        params, renames = dict(self.model.named_params()), self.expanded.renames
        drawn = self.weights()
        if any(holding.held.is_held(t) for t in drawn.values()):
            # Converted at load (--weights): the drawn float32 values, drawn again (the same
            # seed gives the same tensors), are what transformers ran on.
            drawn = {name: t for name, t in draw_weights(self.model, self.random_weights).items()
                     if name in drawn}
        out = {}
        for name, t in drawn.items():
            try:
                stored = source(name, renames)
            except RenameError as e:
                raise self.expanded.spec.error(("checkpoint", "renames"), str(e)) from None
            if self.part is not None:
                stored = self.part.stored_name(stored)
            out[stored] = params[name].to_stored(t)
        return out

    @property
    def whole_config(self) -> dict:
        """The config.json the checkpoint holds: the model's own, or, where the model is a
        part of a bigger checkpoint, the whole file's (what a golden's inputs are)."""
        return self.config_json if self.part is None else self.part.whole

    @property
    def lm(self) -> CausalLM:
        """The model, a causal one."""
        return self.model

    def weights(self) -> dict[str, np.ndarray]:
        """The model's distinct weights (float32) by their model names; a tied one once."""
        params = dict(self.model.named_params())
        return {name: params[name].array for name in self.report.sources}

    def fingerprint(self) -> str:
        """What a golden is keyed by: the config.json and the checkpoint's tensors, the
        inputs transformers ran on; not the spec, which is what a golden judges."""
        return fingerprint(self.whole_config, self.checkpoint_tensors().items())


def read_config(directory: Path) -> dict:
    """``directory``'s config.json, a JSON object (``runtime.files.read_object``), its
    ``architectures`` (where given) a list of names.

    Raises:
        FileNotFoundError: there is none.
        FileError: not a regular file, not UTF-8 JSON, not an object, or ``architectures``
            that is not a list of text (the file and key named).
    """
    path = directory / "config.json"
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"{path}: no config.json (a checkpoint directory holds one)")
    data = read_object(path, what="config.json")
    architectures(data, str(path))
    return data


def _footprint(o: CausalOptions, decode_weights: str = "float32",
               prefill_weights: str = "float32", kv_cache: str = "float32",
               weight_bytes: float = 4.0, parts: dict | None = None) -> tuple[int, int]:
    """Bytes the model holds whatever its context, and bytes per position of context: the
    weights at ``weight_bytes`` a weight (as held: ``held_weight_bytes``); with reduced decode
    or prefill weights, the copies of the projections in that form too; the KV caches at
    ``kv_cache``'s bytes a value (a differential layer's float32 whatever it is).
    ``parts``, where given, gets ``weights``: the weights' bytes as held alone (what lint and
    a load both name: ``too_large``)."""
    E, V = o.hidden_size, o.vocab_size
    fixed = V * E * (1 if o.tied else 2) + E + o.positions * E
    per_position = 0
    cache_fixed = cache_per_position = 0  # bytes
    loops = o.recurrence
    # A recurrent schedule: each stack holds every layer's weights, each run of a layer a
    # cache of its own (runtime.recurrence).
    stacks = [name for name, _ in loops.stacks] if loops is not None else []
    runs = [sum(loops.calls(s, len(o.layers))[i] for s in stacks)
            for i in range(len(o.layers))] if loops is not None else [1] * len(o.layers)
    for i, lo in enumerate(o.layers):
        a, M = lo.attention, lo.mlp.intermediate_size
        held = a.kv_from is None  # a layer reading another's cache holds no k/v
        own = held * runs[i]
        weights = E * (a.heads + 2 * held * a.kv_heads) * a.head_dim + a.heads * a.head_dim * E
        value = 4 if a.differential is not None else KV_CACHE_BYTES[kv_cache]
        fixed += (weights + 3 * E * M + 2 * E) * max(1, len(stacks))
        # The layer's keys and values: a sliding window's ring of window + chunk - 1
        # positions at most (runtime.causal), unless a layer seeing further reads them.
        readers = [r.attention.window for r in o.layers if r.attention.kv_from == i]
        ring = a.window is not None and all(w is not None and w <= a.window for w in readers)
        if ring:
            cache_fixed += value * 2 * own * a.kv_heads * a.head_dim * (
                a.window + o.prefill_chunk - 1)
        else:
            cache_per_position += value * 2 * own * a.kv_heads * a.head_dim
    if o.per_layer_input is not None:
        p = o.per_layer_input
        fixed += (p.vocab_size + E + 2 * E) * len(o.layers) * p.size
    weights = fixed
    if parts is not None:
        parts["weights"] = int(weights * weight_bytes)
    if decode_weights != "float32":  # every weight so far again, in its reduced form (a
        fixed += int(weights * REDUCED_BYTES[decode_weights] / 4)  # bound: norms stay float32)
    if prefill_weights != "float32":  # and the prompt chunk's bfloat16 tiles
        fixed += weights * 2 // 4
    heads = max((lo.attention.heads for lo in o.layers), default=0)
    # Attention scores: a block of a prompt chunk's rows at a time (operators.attention),
    # and one row in the decode step.
    per_position += heads * (min(o.prefill_chunk, ATTENTION_BLOCK) + 2)
    per_position += 2 * sum(r.rotary_dim for r in o.ropes.values())  # cos and sin, as packed
    # The prompt chunk's activations: a generous dozen rows of the widest layer, and one
    # row of logits (the chunk's last row alone meets lm_head).
    widest = max([E] + [lo.mlp.intermediate_size for lo in o.layers])
    fixed += 12 * o.prefill_chunk * widest + V
    # The module tree, both recordings and plans: Python objects, ~165 KB a layer measured
    # on a 2000-layer toy (557 MB loaded, 703 MB compiled, 282 MB of it weights).
    held = int(weights * weight_bytes) - 4 * weights  # the weights as held, not as float32
    return (4 * fixed + held + cache_fixed + LAYER_OVERHEAD * len(o.layers),
            4 * per_position + cache_per_position)


def held_weight_bytes(directory: Path | None, random_weights: int | None, weights: str) -> float:
    """Bytes a weight takes as ``weights`` holds it (``runtime.holding``), about: a
    conversion's form's, or (``stored``) the checkpoint's own bytes per value, read from its
    header (drawn weights: float32's 4)."""
    form = holding.choice(weights)
    if form in holding.held.BLOCKS:
        block, nbytes = holding.held.BLOCKS[form]
        return nbytes / block
    if form is not None:
        return 4.0 if form == "F32" else 2.0
    if random_weights is not None or directory is None:
        return 4.0
    if gguf_files.is_gguf(directory):
        tensors = gguf_files.open_file(directory).tensors.values()
        values = sum(int(np.prod(t.shape)) for t in tensors)
        return sum(t.end - t.begin for t in tensors) / max(1, values)
    infos = [t for t in Checkpoint(directory).tensors.values()
             if t.dtype in ("F32", "F16", "BF16", "F64")]
    values = sum(int(np.prod(t.shape)) for t in infos)
    stored = sum(min(t.end - t.begin, 4 * int(np.prod(t.shape))) for t in infos)  # F64: float32
    return stored / max(1, values)


LAYER_OVERHEAD = 200 * 1024  # bytes


def too_large(expanded, source: str, weights: int, need: int, budget: int, what: str,
              held: str = "as float32") -> str:
    """Why a model does not fit this host's memory, as lint and a load both say it: the
    weights' bytes as held (the same figure, whatever the context or chunk; ``held`` says
    how: ``as_held``), the config.json sizes that make them (each with its key), and
    ``need``, the bytes with ``what`` (the module tree and a prompt chunk's activations, a
    context's KV cache)."""
    resolved, sizes = expanded.resolved, []
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
        if k not in resolved.values:
            continue
        where = resolved.sources.get(k, "the spec")
        sizes.append(f"{where.removeprefix(source + ': ')} {resolved.values[k]}"
                     if where.startswith(source + ": ") else f"{k} {resolved.values[k]} ({where})")
    return (f"the model on {source} holds {weights / 2**30:.1f} GiB of weights {held} "
            f"({', '.join(sizes)}), {need / 2**30:.1f} GiB with {what}: past this host's "
            f"{budget / 2**30:.1f} GiB budget (its memory less what is kept free)")


def as_held(weights: str, weight_bytes: float) -> str:
    """How ``too_large`` says the weights are held: ``as float32`` at 4 bytes a weight (lint,
    which reads no checkpoint, counts them so), else the ``--weights`` choice and the bytes
    a weight takes held (``held_weight_bytes``), e.g. ``as stored (2 bytes a weight)``."""
    if weight_bytes == 4.0:
        return "as float32"
    return f"as {weights} ({weight_bytes:.3g} bytes a weight)"


def _size(n: int) -> str:
    """``n`` bytes in MiB, or GiB from 1 GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


WEIGHTS = tuple(holding.WEIGHTS)
WEIGHTS_HELP = ("what the weights are held as: stored (the default: as the checkpoint stores "
                "them; a bfloat16 or float16 safetensors file memory-mapped and read in place, "
                "a GGUF file's blocks); float32; or converted at load: bfloat16, float16 "
                "(rounded to nearest), q8_0, q4_0, q4_1, q5_0, q5_1 (GGML's blocks, by its "
                "reference quantizers). check judges a conversion by its KL gate")
DECODE_WEIGHTS = ("float32", "bfloat16", "bfloat16-rounded", "int8")
# Bytes a weight takes in each reduced decode form: Q8_0 blocks hold 32 in 34 bytes (a
# bfloat16 count here put int8's copy at 1.9x its size, found by a new user's trial).
REDUCED_BYTES = {"bfloat16": 2, "bfloat16-rounded": 2, "int8": 34 / 32}
DECODE_WEIGHTS_HELP = ("a copy of the projection weights the decode step alone reads, beside "
                       "the weights as held (--weights): float32 (none: the held weights); "
                       "bfloat16 (only where every value holds exactly); bfloat16-rounded; "
                       "int8 (Q8_0 blocks, x as 16-bit integers). check reports the KL the "
                       "rounding costs")
KV_CACHES = ("float32", "bfloat16")
KV_CACHE_BYTES = {"float32": 4, "bfloat16": 2}
KV_CACHE_HELP = ("what the KV caches hold: float32; bfloat16 (each key and value rounded to "
                 "nearest as written: half the cache's memory, and of the bytes a deep "
                 "decode step reads). check reports the KL the rounding costs")
PREFILL_WEIGHTS = ("float32", "bfloat16")
PREFILL_WEIGHTS_HELP = ("the prompt chunk's projection weights: float32; bfloat16 (rounded to "
                        "nearest, a bfloat16 checkpoint's as they are, and each projection's "
                        "input rounded too: float32 sums of bfloat16 products, on Intel AMX "
                        "where the CPU has it). check reports the KL the rounding costs")


EMPTY = "''"  # an empty argument, as a shell would quote it


def weights_source(checkpoint, random_weights: int | None, toy: bool) -> None:
    """Refuse a weights source that cannot be (``toy`` with a checkpoint, or without a seed),
    as every load does; a command calls it before it shows anything loading.

    Raises:
        FlagError: naming the arguments as the caller spells them (``arguments.said``); a
            checkpoint of ''.
    """
    if checkpoint is not None and str(checkpoint) == "":  # Path("") is the working folder
        raise FlagError(f"{said('checkpoint', placeholder=EMPTY)} names nothing: give a checkpoint "
                        "directory, a GGUF file or a hub id")
    if toy:
        if checkpoint is not None:
            raise FlagError(f"{said('toy', True)} draws a tiny shape; it takes no "
                            f"{said('checkpoint')}")
        if random_weights is None:
            raise FlagError(f"{said('toy', True)} needs "
                            f"{said('random_weights', placeholder='SEED')}: a toy has no "
                            "checkpoint")


def model_inputs(spec, checkpoint: str | Path | None, random_weights: int | None,
                 toy: bool, allow_unread_config: bool = False, say_unread: bool = True
                 ) -> tuple[dict, str, Path | None]:
    """``inputs``' config.json, its source and the checkpoint directory (the part's, where
    the checkpoint holds the model as a part of a bigger one)."""
    config_json, source, directory, _ = inputs(spec, checkpoint, random_weights, toy,
                                               allow_unread_config, say_unread)
    return config_json, source, directory


def inputs(spec, checkpoint: str | Path | None, random_weights: int | None, toy: bool,
           allow_unread_config: bool = False, say_unread: bool = True
           ) -> tuple[dict, str, Path | None, PartOf | None]:
    """The config.json a model is built on (a checkpoint's, or the spec's toy), where it came
    from, and the checkpoint directory (None for a toy); every key of it accounted for by
    the spec (``accounting.account``) unless ``allow_unread_config``; and, where config.json's
    ``architectures`` is one of the spec's ``parts``, that part (``parts.PartOf``): the
    config.json returned is then the part's (``parts.config_of``). The keys transformers
    leaves unread are said on the ``iron_spec`` logger (INFO) unless ``say_unread`` is False
    (a command's check before its load, which says them).

    Raises:
        FlagError: no weights source, or ``--toy`` with a checkpoint or without a seed.
        SpecError: ``--toy`` on a spec with no ``toy:`` section, a checkpoint whose
            ``architectures`` the spec does not serve (itself or as a part), or a config.json
            key the spec neither reads nor ignores (every such key named).
        FileNotFoundError: the checkpoint or its config.json is missing, or (no checkpoint
            given) the spec's example is neither cached nor reachable (``example``).
    """
    weights_source(checkpoint, random_weights, toy)
    if toy:
        if spec.get("toy") is None:
            raise spec.error((), "this spec has no toy: section for --toy")
        if not isinstance(spec.get("toy", "config"), dict):
            raise spec.error(("toy",), "toy: is not a mapping holding config: (a tiny "
                             "config.json) for --toy")
        config_json, source = dict(spec.get("toy", "config")), f"{spec.file} toy.config"
        account(spec, config_json, source, allow_unread_config)
        return config_json, source, None, None
    directory = checkpoint_directory(checkpoint, said("checkpoint", str(checkpoint))) \
        if checkpoint is not None else example(spec)
    if gguf_files.is_gguf(directory):  # its config.json is built from its metadata
        config_json, source = gguf_files.config_json(spec, directory), str(directory)
    else:
        config_json, source = read_config(directory), str(directory / "config.json")
    part = parts.find(spec, config_json)
    if part is not None:
        whole = config_json
        config_json, source = parts.config_of(spec, part, whole, source, allow_unread_config)
    else:
        refuse_other_architecture(spec, config_json, source)
    accounted = account(spec, config_json, source, allow_unread_config)
    if accounted.unread and say_unread:  # loaded as they are: transformers reads none either
        log.info("%s: unread, as transformers leaves them (iron-spec show lists them): %s",
                 source, ", ".join(k + _near(k, accounted.reads, config_json)
                                   for k, _, _ in accounted.unread))
    return config_json, source, directory, None if part is None else PartOf(part, whole)


def _near(key: str, reads, config_json: dict) -> str:
    """`` (did you mean X?)`` where ``key``, left unread, is one letter or two from a key
    transformers reads that config.json lacks (``rope_thetta``: its default is used, as
    transformers would, and a typo is the likelier story); else nothing."""
    if reads is None or key.startswith("_"):
        return ""
    known = [k for k in (*reads.fields, *reads.aliases) if k not in config_json]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
    return f" (did you mean {close[0]}?)" if close else ""


def other_architecture(spec, config_json: dict, source: str) -> str | None:
    """What says ``config_json`` is a model this spec does not serve: its ``architectures``
    (where it names some) share none with the spec's and its ``model_type`` is none the
    spec serves (``keys.serves``), each side's named with its ``model_type``
    (the spec's from its toy config); None where the spec serves it."""
    served, archs = spec.get("architectures", default=[]), config_json.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(served, list) or \
            set(archs) & set(served):
        return None
    if keys.serves(spec.get("name"), config_json.get("model_type")):
        return None  # transformers builds it by model type: a name only its checkpoints carry
    theirs, ours = config_json.get("model_type"), spec.get("toy", "config", "model_type")
    return (f"{source} is {', '.join(map(str, archs))}"
            + (f" (model_type {theirs})" if theirs is not None else "")
            + f"; this spec serves {', '.join(map(str, served))}"
            + (f" (model_type {ours}, as its toy config)" if ours is not None else "")
            + ": the architecture does not match (iron-spec list shows which spec serves it)")


def refuse_other_architecture(spec, config_json: dict, source: str) -> None:
    """Raises SpecError (at the spec's ``architectures``) where ``config_json`` is a model
    the spec does not serve (``other_architecture``), before its keys are accounted for: a
    Gemma config.json under a Llama spec is another model, not keys to map."""
    text = other_architecture(spec, config_json, source)
    if text is not None:
        raise spec.error(("architectures",), text)


def example(spec) -> Path:
    """The checkpoint directory of the first hub id the spec names under ``examples:``, for a
    command given no checkpoint: through ``huggingface_hub`` (its cache, ``HF_HUB_OFFLINE``
    and its download progress bar, as ``runtime.host.checkpoint_directory``), said in one
    log line.

    Raises:
        NoWeights: the spec names no example (give --checkpoint).
        SpecError: ``examples`` is not a list of hub ids (``example_ids``).
        FileNotFoundError: the example is neither in the hub cache nor reachable, saying
            where the cache is, why the hub was not asked or answered, and what to do.
    """
    examples = example_ids(spec)
    if not examples:
        raise NoWeights(f"give {said('checkpoint', placeholder='DIR')} (or a hub id), or "
                        f"{said('random_weights', placeholder='SEED')} {said('toy', True)} "
                        f"for a run with no files ({spec.file} names no examples:)")
    repo = examples[0]
    log.info("checkpoint %s, the spec's first example (examples:)", repo)
    try:
        return checkpoint_directory(repo)
    except FileNotFoundError:
        from huggingface_hub import constants
        why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else
               "the hub did not answer")
        raise FileNotFoundError(
            f"no {said('checkpoint')} given, and {spec.file}'s example {repo} is not in the hub "
            f"cache ({constants.HF_HUB_CACHE}) and cannot be downloaded ({why}): download it "
            f"where the hub is reachable (hf download {repo}), or give "
            f"{said('checkpoint', placeholder='DIR')}, or "
            f"{said('random_weights', placeholder='SEED')} {said('toy', True)} for a run with "
            "no files") from None


def example_ids(spec) -> list[str]:
    """The hub ids the spec's ``examples`` names (none where absent), each checked as the
    schema and huggingface_hub's ``validate_repo_id`` check one before any is used: an
    example is downloaded by its id, never read as a path.

    Raises:
        SpecError: at ``examples`` (or the item), naming what it holds and what is valid.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    examples = spec.get("examples", default=None)
    if examples is None:
        return []
    if not isinstance(examples, list):
        raise spec.error(("examples",), f"examples is {_shown(examples)}, not a list of Hugging "
                         "Face hub ids (org/name): the checkpoints a command given no "
                         "--checkpoint downloads", value=True)
    for i, repo in enumerate(examples):
        try:
            if not isinstance(repo, str) or repo.count("/") != 1:
                raise HFValidationError("not org/name")
            validate_repo_id(repo)
        except HFValidationError:
            raise spec.error(("examples", i), f"examples[{i}] is {_shown(repo)}, not a Hugging "
                             "Face hub id: org/name, each of letters, digits, '-', '_' and "
                             "'.', the name at most 96 characters (an example is downloaded "
                             "by its id, never read as a path: give --checkpoint DIR for a "
                             "directory)", value=True) from None
    return examples


def _shown(value: Any, most: int = 60) -> str:
    """``value`` as a message quotes it, cut to ``most`` characters with its length said."""
    text = repr(value)
    kind = type(value).__name__
    if len(text) > most:
        text = f"{text[:most]}... ({len(value) if hasattr(value, '__len__') else len(text)} " \
               "characters)"
    return f"{text} ({kind})" if not isinstance(value, str) else text


def fill_weights(model, directory: Path | None, random_weights: int | None, draw,
                 renames: dict, unused, progress: Progress | None, spec=None,
                 config_json: dict | None = None, fields: dict | None = None,
                 part: PartOf | None = None,
                 weights: str = "stored") -> tuple[LoadReport, Checkpoint | None]:
    """Fill ``model``'s params: drawn at ``random_weights`` by ``draw(model, seed)``, else read
    strictly from ``directory``'s checkpoint (``runtime.checkpoint.load``), or from a GGUF
    file's tensors as ``spec`` reads them (``gguf_files.checkpoint``, on its ``config_json``);
    a mis-shaped tensor's error names the config ``fields`` (resolved values) its expected
    shape equals. Returns the report and the checkpoint read (None when drawn)."""
    if random_weights is not None:
        report = fill(model, draw(model, random_weights))
        holding.hold_all(model, weights)  # drawn as float32: a conversion, where asked
        return report, None
    assert directory is not None, "a checkpoint directory, when nothing is drawn"
    if gguf_files.is_gguf(directory):
        checkpoint = gguf_files.checkpoint(spec, directory, config_json,
                                           checkpoint_names(model, renames),
                                           checkpoint_names(model, renames, transposed=True))
    else:
        checkpoint = Checkpoint(directory)
        if part is not None:  # the part's tensors, as the model reads them (runtime.parts)
            checkpoint = subtree(checkpoint, part.part.tensors, part.part.unused)
    shapes = {n: p.stored_shape for n, p in model.named_params()}
    report = load(model, checkpoint, renames, progress, unused,
                  explainer(fields or {}, shapes), weights,
                  lambda forms: _requantizing(forms, weights, directory))
    if part is not None:
        report.ignored = sorted(report.ignored + checkpoint.left)
    return report, checkpoint


def _requantizing(forms: dict[str, int], weights: str, where: Path) -> None:
    """Say, once a load, that ``weights`` converts matrices ``where`` already holds quantized
    (``forms``: stored form -> matrices, ``runtime.checkpoint.requantized``): done, as asked
    (the file is left as it is; llama.cpp's llama-quantize, which writes a file, refuses it
    without --allow-requantize), but lossier than converting the original weights."""
    n = sum(forms.values())
    log.warning(
        "%s converts %d matri%s from blocks %s already holds quantized (%s): each is "
        "widened and %s again, carrying both roundings, which costs more accuracy than "
        "converting the original (float16, bfloat16 or float32) weights would; convert "
        "from the original checkpoint for the least loss, or hold them as stored (%s)",
        said("weights", weights), n, "ces" if n != 1 else "x", where.name,
        ", ".join(f"{f}: {k}" for f, k in sorted(forms.items(), key=lambda kv: -kv[1])),
        "rounded" if holding.choice(weights) in ("BF16", "F16") else "quantized",
        said("weights", "stored"))


def checkpoint_names(model, renames: dict, transposed: bool = False) -> list[str]:
    """The checkpoint name of each of ``model``'s params (its renames undone), or its own
    where the renames lead to it from two (loading then says which); with ``transposed``,
    of those stored ``[in, out]`` alone (``checkpoint.transposed``)."""
    out = []
    for name, p in model.named_params():
        if transposed and not p.transposed:
            continue
        try:
            out.append(source(name, renames))
        except RenameError:
            out.append(name)
    return out


def load_model(spec_path: str | Path, *, checkpoint: str | Path | None = None,
               random_weights: int | None = None, toy: bool = False,
               max_seq_len: int | None = None, prefill_chunk: int | None = None,
               progress: Progress | None = None, decode_weights: str = "float32",
               prefill_weights: str = "float32", allow_unread_config: bool = False,
               context_at_most: int | None = None, kv_cache: str = "float32",
               weights: str = "stored") -> Loaded:
    """The model of ``spec_path`` on a checkpoint's config and weights, or drawn ones.

    Args:
        checkpoint: a checkpoint directory, a hub id (``runtime.host``) or a GGUF file
            (its config, tokenizer and tensors read from it: ``gguf_files``).
        random_weights: a seed; weights are drawn at it instead of read.
        toy: the spec's ``toy`` shape (with ``random_weights``, no files at all).
        max_seq_len: the context; default the checkpoint's own where it fits this host's
            memory, else the longest whole number of prompt chunks that does.
        context_at_most: with no ``max_seq_len``, the context is this or the model's own,
            the shorter (bench's: a context of its own size on any model).
        progress: called with (tensors loaded, tensors) while weights load.
        decode_weights: ``float32``; ``bfloat16``: the decode step streams its
            projections' weights as bfloat16, half the bytes, where every value holds
            exactly (a bfloat16 checkpoint's); ``bfloat16-rounded``: any weights rounded to
            the nearest bfloat16; ``int8``: llama.cpp's Q8_0 blocks (``operators.formats``),
            quantized once here. The prompt chunk's are ``prefill_weights``'.
        prefill_weights: ``float32``; ``bfloat16``: the prompt chunk's projections
            multiply bfloat16 weights (rounded to nearest) by their input rounded to
            bfloat16, summing in float32 (Intel AMX tiles where the CPU has them:
            ``operators/_cpu_tiles.h``); the head, on one row, stays float32.
        allow_unread_config: load although config.json holds keys the spec neither reads
            nor ignores (refused otherwise, every such key named).
        kv_cache: ``float32``; ``bfloat16``: every attention layer's keys and values are
            held rounded to the nearest bfloat16 (``CausalLM.use_kv_cache``), half the
            bytes a deep decode step reads, and half the cache's memory.
        weights: what the projections' and embeddings' matrices are held as
            (``runtime.holding.WEIGHTS``): ``stored`` (as the checkpoint stores them: a
            bfloat16 safetensors file memory-mapped and read in place, a GGUF file's
            blocks), ``float32``, or a conversion at load (``bfloat16``, ``q8_0``, ...).

    Raises:
        FileNotFoundError: the spec, checkpoint, config.json or tokenizer is missing.
        SpecError: the spec is invalid, does not fit the config, or leaves a config.json
            key unaccounted for.
        CheckpointError: the weights do not fit the model (every tensor named).
        FlagError: (a ValueError) no weights source, ``max_seq_len`` past the model's own
            context, a ``prefill_chunk`` past the context (a usage error in the CLI).
        ValueError: reduced decode weights without the decode pool, bfloat16 that would
            round a weight, int8 on rows not a multiple of 32 long, a ``kv_cache`` none of
            ``KV_CACHES``.
    """
    _refuse_decode_weights(decode_weights)
    _refuse_prefill_weights(prefill_weights)
    if weights not in WEIGHTS:
        raise ValueError(f"{said('weights', weights)} is not one of {', '.join(WEIGHTS)}")
    if kv_cache not in KV_CACHES:
        raise ValueError(f"{said('kv_cache', kv_cache)} is not one of {', '.join(KV_CACHES)}")
    spec = load_spec(spec_path)
    if spec.get("model") == "encoder":
        raise ValueError(f"{spec.file} is an encoder spec (model: encoder): it gives embeddings "
                         "(iron-spec embed), it does not generate")
    config_json, source, directory, part = inputs(spec, checkpoint, random_weights, toy,
                                                  allow_unread_config)
    asked = prefill_chunk
    if toy:
        prefill_chunk = prefill_chunk or spec.get("toy", "prefill_chunk")
    expanded = expand(spec, config_json, prefill_chunk=prefill_chunk, source=source)
    for key in TOKEN_KEYS:  # read by the tokenizer where there is one: checked either way
        token_ids(config_json.get(key), f"{source}: {key}", expanded.options.vocab_size)
    # Read before the weights, so a broken tokenizer.json fails in a second, not a minute.
    tokenizer = None
    if directory is not None and gguf_files.is_gguf(directory):
        tokenizer = gguf_files.tokenizer(directory)
    elif directory is not None and (directory / "tokenizer.json").exists():
        tokenizer = Tokenizer(directory)
    if tokenizer is not None:
        V = expanded.options.vocab_size
        past = sorted(i for i in tokenizer.eos_ids if i >= V)
        if past:
            raise ValueError(f"{tokenizer.eos_sources[past[0]]}: end-of-text id {past[0]} is "
                             f"outside the model's vocabulary 0..{V - 1} (vocab_size {V})")
    read_generation_config(directory, warn=True)  # a file that cannot be read: said once
    native = expanded.options.max_seq_len
    held_bytes = held_weight_bytes(directory, random_weights, weights)
    if max_seq_len is None and context_at_most is not None:
        max_seq_len = min(context_at_most, native)
    if max_seq_len is not None:
        if not 1 <= max_seq_len <= native:
            raise FlagError(f"{said('max_seq_len', max_seq_len)} is not within "
                            f"1..{native}, the model's own context")
        L = max_seq_len
        parts: dict = {}
        fixed, per_position = _footprint(expanded.options, decode_weights, prefill_weights,
                                         kv_cache, held_bytes, parts)
        need, budget = fixed + per_position * L, host_budget()
        if need > budget:  # numpy maps zeros lazily: refused here, not by the OOM killer
            raise ValueError(too_large(expanded, source, parts["weights"], need, budget,
                                       f"its module tree, a prompt chunk's activations and "
                                       f"the KV cache of max_seq_len {L}",
                                       as_held(weights, held_bytes)))
    else:
        parts = {}
        fixed, per_position = _footprint(expanded.options, decode_weights, prefill_weights,
                                         kv_cache, held_bytes, parts)
        C, budget = expanded.options.prefill_chunk, host_budget()
        if fixed + per_position * C > budget:  # not even one chunk: fit would refuse it
            raise ValueError(too_large(expanded, source, parts["weights"],
                                       fixed + per_position * C, budget,
                                       f"its module tree, a {C}-token prompt chunk's "
                                       "activations and its KV cache",
                                       as_held(weights, held_bytes)))
        L = fit(native, C, fixed, per_position)
    if asked is not None and asked > L:
        raise FlagError(f"{said('prefill_chunk', asked)} is past the context max_seq_len {L} "
                        "(a prompt call holds at most the context; it is not cut silently)")
    if L != native:
        expanded = expand(spec, config_json, max_seq_len=L, prefill_chunk=prefill_chunk,
                          source=source)
    lm = _tree(spec, lambda: CausalLM(expanded.options), source)
    # A GGUF file holds a head exactly where it is not tied (runtime.gguf.config).
    if random_weights is None and expanded.options.tied and not gguf_files.is_gguf(directory):
        expanded, lm = _untie(spec, expanded, lm, directory, source, part)
    lm.use_kv_cache(kv_cache)
    if lm.kv_cache != kv_cache:
        # Found by a new user's trial: diffllama was said to hold a bfloat16 cache and judged
        # by its loose gate, though every layer kept float32.
        log.warning("KV cache %s asked for, and no layer of this model can hold one (%s): it "
                    "holds %s", kv_cache, "differential attention's kernels read float32",
                    lm.kv_cache)
    now, most = lm.cache_bytes()
    rings = sum(s.ring is not None for _, s in lm.named_states()) // 2
    log.info("KV cache (%s) %s reserved now (%d positions); it grows with the sequence, %d "
             "positions at a time, to at most %s at max_seq_len %d%s", lm.kv_cache, _size(now),
             lm.reserved,
             lm.block, _size(most), L, f" ({rings} sliding-window layers hold a ring of their "
             "window)" if rings else "")
    mark_transposed(lm, expanded.transposed)
    pack_tree(lm)  # before the weights: they are read straight into the stacked arrays
    hold_experts(lm, weights, when_filled=True)  # each layer's as its tensors are read
    report, checkpoint = fill_weights(lm, directory, random_weights, draw_weights,
                                      expanded.renames, expanded.unused, progress, spec,
                                      config_json, expanded.resolved.values, part, weights)
    hold_experts(lm, weights, when_filled=False)  # drawn weights' (--weights)
    lm.decode_weights, lm.prefill_weights = decode_weights, prefill_weights
    lm.weights = weights
    held_now, seen = {}, set()
    for stack in expert_stacks(lm):  # a mixture's stacks (their experts' params are views)
        f = holding.held_form(stack)
        held_now[f] = held_now.get(f, 0) + stack.nbytes
    for _, p in lm.named_params():
        if p.holdable and p.array is not None and id(p) not in seen:  # a tied head once
            seen.add(id(p))
            f = holding.held_form(p.array)
            held_now[f] = held_now.get(f, 0) + holding.held.nbytes(p.array)
    lm.prompt_rounds = "Q8_0" in held_now  # bfloat16 rows round x only under --prefill-weights bfloat16
    log.info("weights held as %s (--weights %s)", ", ".join(
        f"{f} {_size(n)}" for f, n in sorted(held_now.items(), key=lambda kv: -kv[1])), weights)
    if decode_weights != "float32" or prefill_weights != "float32":
        # Said beside the KV cache's line (found by a new user's trial: run named the
        # cache's form alone).
        log.info("weights: the decode step's %s, the prompt chunk's %s", decode_weights,
                 prefill_weights)
    if decode_weights != "float32":
        lm.decode_step  # compiled now: a weight bfloat16 would round is refused before a run
    return Loaded(lm, tokenizer, expanded, report, directory, config_json, random_weights,
                  checkpoint, part)


def _refuse_decode_weights(decode_weights: str) -> None:
    """Raises ValueError where ``decode_weights`` is none of DECODE_WEIGHTS, or a reduced
    form without the decode pool that reads it."""
    if decode_weights not in DECODE_WEIGHTS:
        raise ValueError(f"{said('decode_weights', decode_weights)} is not one of "
                         f"{', '.join(DECODE_WEIGHTS)}")
    if decode_weights != "float32" and decode_pool.LIB is None:
        raise ValueError(f"{said('decode_weights', decode_weights)} needs the decode pool, and "
                         + ("IRON_SPEC_NATIVE turns it off" if decode_pool.BUILT else
                            decode_pool.STALE if decode_pool.STALE else
                            "operators._cpu is not built (reinstall with a C compiler)"))


def _refuse_prefill_weights(prefill_weights: str) -> None:
    """Raises ValueError where ``prefill_weights`` is none of PREFILL_WEIGHTS."""
    if prefill_weights not in PREFILL_WEIGHTS:
        raise ValueError(f"{said('prefill_weights', prefill_weights)} is not one of "
                         f"{', '.join(PREFILL_WEIGHTS)}")


def use_prefill_weights(loaded: Loaded, prefill_weights: str) -> None:
    """Compile ``loaded``'s prompt chunk on ``prefill_weights`` too, and go back to the
    weights it had: a bench then switches between them by ``lm.prefill_weights``.

    Raises:
        ValueError: as ``load_model`` does for these prefill weights.
    """
    _refuse_prefill_weights(prefill_weights)
    _compile_beside(loaded.lm, "prefill_weights", prefill_weights, prompt=True)


def use_decode_weights(loaded: Loaded, decode_weights: str) -> None:
    """Compile ``loaded``'s decode step on ``decode_weights`` too (its weights packed once,
    beside the forms it already holds), and go back to the weights it had: a bench then
    switches between them by ``lm.decode_weights``.

    Raises:
        ValueError: as ``load_model`` does for these decode weights.
    """
    _refuse_decode_weights(decode_weights)
    _compile_beside(loaded.lm, "decode_weights", decode_weights, prompt=False)


def _compile_beside(lm: CausalLM, attr: str, weights: str, prompt: bool) -> None:
    """The version (prompt chunk or decode step) of ``lm`` with ``attr`` set to ``weights``
    compiled, and ``attr`` put back as it was, whatever the compile raised."""
    before = getattr(lm, attr)
    setattr(lm, attr, weights)
    try:
        lm.version(prompt)
    finally:
        setattr(lm, attr, before)


def _untie(spec, expanded, lm: CausalLM, directory: Path, source: str,
           part: PartOf | None = None):
    """``expanded`` and ``lm`` with an untied head where the checkpoint holds the tied
    names' own tensors with other values (``runtime.checkpoint.distinct_ties``), as
    transformers loads such a checkpoint: each tensor its own param, and a warning."""
    checkpoint = Checkpoint(directory)
    if part is not None:
        checkpoint = subtree(checkpoint, part.part.tensors, part.part.unused)
    try:
        distinct = distinct_ties(lm, checkpoint, expanded.renames)
    finally:
        checkpoint.close()
    if not distinct:
        return expanded, lm
    log.warning("%s: %s; the checkpoint holds each with its own values, so they are not tied "
                "(as transformers; a config saying tie_word_embeddings: false says so)", source,
                ", ".join(f"{a} is tied to {b}" for a, b in distinct))
    expanded = replace(expanded, options=replace(expanded.options, tied=False))
    return expanded, _tree(spec, lambda: CausalLM(expanded.options), source)


def _tree(spec, build: Callable[[], Any], source: str):
    """``build()``, its refusal of a shape (heads that do not group, a rotary width past the
    head) said as the spec's error, naming the config it came from."""
    try:
        return build()
    except ValueError as e:
        raise spec.error(("config",), f"the model does not build on {source}: {e}") from None
