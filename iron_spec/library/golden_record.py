"""Recording goldens from transformers' own model, in float32, on the same weights, and
the same model in float64 teacher-forced on the float32 run's tokens (``add_float64``).

transformers' float64 model is not float64 throughout: every *RotaryEmbedding.forward
computes its cos/sin under ``.float()`` (float32), Gemma's RMSNorm normalizes ``x.float()``,
and some eager attentions take their softmax in float32. Those islands set the float64
floor (docs/writing-a-spec.md, "What float64 sees").

Only this module imports torch and transformers (the ``golden`` extra); reading a golden
needs neither (``runtime.golden``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from typing import Any
from pathlib import Path

import numpy as np

from iron_spec.runtime.encoder_golden import EncoderGolden
from iron_spec.runtime.golden import Golden, config_digest
from iron_spec.runtime.parts import under
from iron_spec.runtime.renames import Pattern, matching, source

from iron_spec.spec.build import Loaded

from . import config_defaults

GOLDEN_STEPS = 40
# Texts an encoder golden of a real checkpoint is recorded on (its tokenizer's ids).
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.",
         "The girl is carrying a baby.", "A man is riding a horse.",
         "Der Himmel ist BLAU, oder? 42 €"]


def hugging_face(loaded: Loaded, auto: str = "AutoModelForCausalLM", dtype: str = "float32"):
    """transformers' own model in ``dtype`` (float32, float64) on ``loaded``'s weights,
    through the Auto class ``auto`` (the causal LM by default; ``AutoModel``, the bare
    encoder, for an encoder), or through the model class of that name (``encoder_class``).

    A real checkpoint directory loads as it is; drawn weights are written with the config
    to a temporary checkpoint first, so transformers renames and ties them as it loads any.
    A part of a bigger checkpoint (the text model of a ``*ForConditionalGeneration``) is
    written under the whole file's names and config.json; transformers draws the other
    parts (the names under the part's ``unused`` prefixes) itself.

    Raises:
        ImportError: torch or transformers is not installed (the ``golden`` extra).
        ValueError: transformers' model lacks (but for names the spec's checkpoint.unused
            declares unread, or a part's other parts hold) or does not take some of the
            weights.
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    if loaded.part is not None:  # a part of a bigger checkpoint: the class config.json names
        auto = named_class(loaded) or auto
    cls = getattr(transformers, auto)
    dtype = getattr(torch, dtype)
    # A mixture of experts runs transformers' eager loop over the experts hit (its default,
    # grouped_mm, sums in another order): the semantics its modeling file writes out.
    extra = {"experts_implementation": "eager"} if has_experts(loaded) else {}
    if loaded.directory is not None and loaded.random_weights is None:
        model = cls.from_pretrained(loaded.directory, dtype=dtype, **extra)
        return model.eval()
    with tempfile.TemporaryDirectory() as d:
        # A part's drawn weights go in under the whole checkpoint's names, with the whole
        # config.json: transformers builds the whole model and draws the other parts'
        # tensors itself (the towers: text alone never reads them).
        Path(d, "config.json").write_text(json.dumps(loaded.whole_config))
        # np.array, not ascontiguousarray: a 0-d tensor (a buffer) stays 0-d.
        state = {k: torch.from_numpy(np.array(v, order="C")) for k, v in
                 loaded.checkpoint_tensors().items()}
        save_file(state, str(Path(d, "model.safetensors")))
        model, info = cls.from_pretrained(d, dtype=dtype, output_loading_info=True, **extra)
    # A name the spec declares unused (checkpoint.unused) is one the model never reads: the
    # drawn weights do not hold it, and transformers keeps its own (a buffer, such as the
    # quantization state of I-BERT's Quant* modules, unread where quant_mode is off).
    # A tied name (lm_head's, a shared block's later uses) by the checkpoint's name too: a
    # checkpoint holds the shared param under its first name alone, and transformers reports
    # the others missing before it ties them.
    tied, unused = set(loaded.report.tied), loaded.expanded.unused
    tied |= {source(name, loaded.expanded.renames) for name in loaded.report.tied}
    others = [] if loaded.part is None else [Pattern(u) for u in loaded.part.part.unused]
    missing = [k for k in info["missing_keys"] if k not in tied and not matching(k, unused)
               and not any(under(k, o) is not None for o in others)]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise ValueError(misfit(type(model).__name__, loaded.expanded.spec.file, missing,
                                info["unexpected_keys"], info.get("mismatched_keys") or []))
    return model.eval()


def misfit(cls: str, spec: str, missing, unexpected, mismatched) -> str:
    """What does not fit between the weights written from the spec's model and transformers'
    ``cls`` loading them, each side named: ``missing`` are tensors ``cls`` holds that the
    spec's model has none of (transformers' ``missing_keys``: it would keep them random),
    ``unexpected`` tensors the spec's model wrote that ``cls`` has no place for,
    ``mismatched`` (name, written shape, ``cls``'s shape) triples."""
    parts = []
    if missing:
        parts.append(f"transformers' {cls} holds {', '.join(sorted(missing))}, which the "
                     f"spec's model neither has nor declares unread (a tensor {cls} holds "
                     f"and the model never reads goes in {spec}'s checkpoint.unused)")
    if unexpected:
        parts.append(f"the spec's model has {', '.join(sorted(unexpected))}, which "
                     f"transformers' {cls} does not take (a rename missing in {spec}'s "
                     "checkpoint.renames, or another class?)")
    for m in mismatched:
        name, *shapes = m if isinstance(m, (list, tuple)) else (m,)
        said = f" is {list(shapes[0])} in the spec's model, {list(shapes[1])} in {cls}" \
            if len(shapes) == 2 else " is shaped otherwise in each"
        parts.append(f"{name}{said}")
    return f"the weights do not fit transformers' {cls}: " + "; ".join(parts)


def recorded_from(loaded: Loaded, model) -> dict[str, Any]:
    """What a golden's meta says it was recorded from, beside its fingerprint: the versions,
    transformers' class (``model``), config.json's ``model_type``, the spec's name and
    config.json's own digest (``runtime.golden.Inputs``: what tells a golden of another
    model from a stale one), transformers' config class defaults (``config_defaults.of``)
    and which config.json keys transformers reads for it (``transformers_keys.record``:
    ``iron_spec.keys`` gathers them)."""
    import torch
    import transformers

    from . import transformers_keys
    config = model.config  # the part's config class where the model is a part of the whole
    key = None if loaded.part is None else loaded.part.part.config
    if key is not None:
        config = getattr(config, key)
    whole = loaded.whole_config
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "model": type(model).__name__, "model_type": whole.get("model_type"),
            "spec": loaded.expanded.spec.get("name"), "config": config_digest(whole),
            "config_defaults": config_defaults.of(type(config)),
            "config_keys": transformers_keys.record(type(config), type(model))}


def has_experts(loaded: Loaded) -> bool:
    """Whether any layer of ``loaded``'s causal model holds a mixture of experts."""
    layers = getattr(getattr(loaded.model, "config", None), "layers", ())
    return any(getattr(lo, "experts", None) is not None for lo in layers)


def routing(model, history: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """transformers' routing on ``history`` (one call of the whole of it): for each router
    call of the forward, in order, the experts it chose ``(positions, k)`` ascending and its
    logits ``(positions, experts)`` (``output_router_logits``, the router's first output as
    transformers records it). The experts are what the forward handed its experts module
    (``top_k_index``: every ``...Experts`` taking one); a family whose experts take none
    (Llama4TextExperts, JetMoE's) chose them by its logits' top-k, which is read off them.

    Raises:
        ValueError: the model returns no router logits.
    """
    import torch

    taken: list[np.ndarray] = []

    def hook(module, args, kwargs):
        index = kwargs.get("top_k_index", kwargs.get("router_indices"))
        if index is None and len(args) >= 2 and torch.is_tensor(args[1]) \
                and not args[1].dtype.is_floating_point:
            index = args[1]
        if index is not None:
            taken.append(np.sort(index.detach().numpy().reshape(-1, index.shape[-1]), axis=-1))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
               for m in model.modules() if type(m).__name__.endswith("Experts")]
    try:
        with torch.no_grad():
            out = model(torch.tensor([history]), use_cache=False, output_router_logits=True)
    finally:
        for h in handles:
            h.remove()
    logits = [np.asarray(l.detach().float().numpy()).reshape(len(history), -1)
              for l in (getattr(out, "router_logits", None) or ())]
    if not logits:
        raise ValueError(f"transformers' {type(model).__name__} returns no router logits")
    if len(taken) != len(logits):
        # A composite's (Llama4ForConditionalGeneration's) is its text config's.
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
            else model.config
        k = [text.num_experts_per_tok] * len(logits)
        taken = [np.sort(np.argsort(-l, axis=-1, kind="stable")[:, :kk], axis=-1)
                 for l, kk in zip(logits, k)]
    return [(t.astype(np.int16), l.astype(np.float32)) for t, l in zip(taken, logits)]


def sees_call(loaded: Loaded) -> bool:
    """Whether ``loaded``'s attention lets a row see its whole call (``attention.sees:
    call``): what it computes then depends on how a sequence is split into calls, so its
    golden is recorded through transformers' cache on the calls a session makes
    (``through_cache``), not as one call per step."""
    return any(lo.attention.sees == "call" for lo in loaded.lm.config.layers)


def through_cache(loaded: Loaded, model, prompt: list[int], steps: int,
                  forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray]]:
    """transformers' ``model`` called as a ``runtime.session.Session`` calls ours: the
    prompt in calls ending at the prompt-chunk boundaries (multiples of ``prefill_chunk``
    positions, the model's prefix counted: the first call holds the prefix and the first
    ``prefill_chunk - len(prefix)`` ids), then one id a call, each call through the one
    transformers cache (``DynamicCache``) and given the whole history, as its ``generate``
    does (CpmAntForCausalLM's forward slices off what the cache holds). Returns the tokens
    (the prompt, then each draw: the greedy token, or ``forced``'s, teacher-forced) and the
    last row's logits after the prompt and after each of ``steps - 1`` more tokens,
    ``(vocab,)`` each in the model's dtype."""
    import torch
    from transformers.cache_utils import DynamicCache

    C, P = loaded.lm.config.prefill_chunk, len(loaded.lm.config.prefix)
    n, tokens, rows = len(prompt), list(prompt), []
    cache = DynamicCache(config=model.config)
    ends = [min(k * C - P, n) for k in range(1, -(-(n + P) // C) + 1)]

    def call(upto: int) -> np.ndarray:
        ids = torch.tensor([tokens[:upto]])
        return model(ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].numpy()

    for end in ends:
        row = call(end)
    rows.append(row)
    for i in range(1, steps):
        tokens.append(int(np.argmax(rows[-1])) if forced is None else int(forced[n + i - 1]))
        rows.append(call(len(tokens)))
    return tokens, rows


def record(loaded: Loaded, prompt: list[int], steps: int = GOLDEN_STEPS) -> Golden:
    """transformers' distributions after ``prompt`` and then each of its own greedy tokens,
    ``steps`` of them, as a Golden keyed by ``loaded``'s fingerprint: each step one call of
    the whole history, or where the model sees its calls (``sees_call``) the calls a
    session makes, through transformers' cache (``through_cache``; the meta's ``calls``
    says which)."""
    import torch

    model = hugging_face(loaded)
    tokens = list(prompt)
    rows = []
    with torch.no_grad():
        if sees_call(loaded):
            tokens, rows = through_cache(loaded, model, prompt, steps)
            rows = [r.astype(np.float32) for r in rows]
            tokens.append(int(np.argmax(rows[-1])))
        else:
            for _ in range(steps):
                out = model(torch.tensor([tokens]), use_cache=False, logits_to_keep=1).logits[0, -1]
                row = out.numpy().astype(np.float32)
                rows.append(row)
                tokens.append(int(np.argmax(row)))
    meta = {**recorded_from(loaded, model), "dtype": "float32", "steps": steps}
    if sees_call(loaded):
        meta["calls"] = {"prefill_chunk": loaded.lm.config.prefill_chunk,
                         "prefix": len(loaded.lm.config.prefix),
                         "through": "transformers' cache, as a session calls"}
    golden = Golden.from_logits(loaded.fingerprint(), tokens[:-1], len(prompt),
                                np.stack(rows), meta)
    if has_experts(loaded):
        golden.routing = routing(model, list(tokens[:-1]))
        golden.meta["routing"] = {"routers": len(golden.routing),
                                  "positions": len(tokens) - 1,
                                  "experts_implementation": "eager"}
    return add_float64(loaded, golden)


@contextlib.contextmanager
def _default_float64():
    """torch's default dtype float64 while transformers' float64 model runs: a tensor it
    makes without a dtype is then float64 as its weights are (XGLMAttention's
    ``torch.full((), finfo(float64).min)`` overflows float32 otherwise)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def float64_arrays(golden: Golden | EncoderGolden) -> dict[str, np.ndarray]:
    """The arrays a golden's float64 part is stored as (``runtime.golden.add_arrays``)."""
    if isinstance(golden, EncoderGolden):
        return golden.float64_arrays()
    return {"top_logprobs64": golden.top_logprobs64, "tail64": golden.tail64}


def add_float64(loaded: Loaded, golden: Golden) -> Golden:
    """``golden`` with transformers' float64 rows added: its model loaded in float64 on
    ``loaded``'s weights, teacher-forced on the golden's own tokens one step at a time (a
    model seeing its calls through transformers' cache, ``through_cache``), as
    the float32 rows were run (a longrope table is chosen by the length of each history).
    Every float32 array of ``golden`` is kept as it is; its meta gains ``steps`` and
    ``float64``."""
    import torch

    model = hugging_face(loaded, dtype="float64")
    rows = []
    with torch.no_grad(), _default_float64():
        if sees_call(loaded):
            forced = [int(t) for t in golden.history(golden.steps - 1)]
            _, rows = through_cache(loaded, model, forced[:golden.prompt_len], golden.steps,
                                    forced)
        else:
            for i in range(golden.steps):
                history = torch.from_numpy(golden.history(i).astype(np.int64))[None]
                rows.append(model(history, use_cache=False,
                                  logits_to_keep=1).logits[0, -1].numpy())
    return golden.with_float64(np.stack(rows), {
        "steps": golden.steps,
        "float64": {"dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                    "model": type(model).__name__, "teacher_forced": "the golden's tokens"}})


def encoder_probes(loaded: Loaded) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """The (ids, types) an encoder golden is recorded on: ``TEXTS`` through the checkpoint's
    tokenizer where there is one; else drawn at seed 0, of 11 ids, of the most a call holds
    (its second half of token type 1 where there are two types) and of 1 id. Where
    config.json names a ``pad_token_id`` in the vocabulary, the first two drawn probes hold
    it inside them, so positions that count around padding are judged too; where it names a
    ``mask_token_id``, they hold that too (two of the first's 11, one of the second's), so
    embeddings rescaled for the share of masked tokens (token dropout) are judged. A model
    whose calls hold a fixed number of rows (``Encoder.call_rows``: landmark attention's
    segment) is probed on three drawn texts of that many ids, tokenizer or not."""
    o, fixed = loaded.model.config, loaded.model.call_rows
    if loaded.tokenizer is not None and fixed is None:
        out = []
        for text in TEXTS:
            ids, types = loaded.tokenizer(text)
            out.append((np.asarray(ids, np.int32),
                        np.asarray(types, np.int32) if o.token_types else None))
        return out
    rng = np.random.default_rng(0)
    L = o.max_tokens if fixed is None else fixed
    short, one = (11, 1) if fixed is None else (fixed, fixed)
    probes = [(rng.integers(0, o.vocab_size, short), np.zeros(short, np.int64)),
              (rng.integers(0, o.vocab_size, L), (np.arange(L) >= L // 2).astype(np.int64)),
              (rng.integers(0, o.vocab_size, one), np.zeros(one, np.int64))]
    pad = loaded.config_json.get("pad_token_id")
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < o.vocab_size:
        probes[0][0][3] = pad
        probes[1][0][L // 3] = pad
    mask = loaded.config_json.get("mask_token_id")
    if isinstance(mask, int) and not isinstance(mask, bool) and 0 <= mask < o.vocab_size:
        probes[0][0][[5, 8]] = mask
        if L > 2:
            probes[1][0][L // 3 + 1] = mask
    return [(ids.astype(np.int32), types.astype(np.int32) if o.token_types >= 2 else
             (np.zeros_like(types, np.int32) if o.token_types else None))
            for ids, types in probes]


def global_masks(loaded: Loaded, probes) -> list[np.ndarray] | None:
    """Each probe's global attention mask ``(rows,)`` int32 where the model's attention reads
    global tokens (else None): the first probe's first and sixth ids global, the second's
    first, middle and last, the third none (the window alone)."""
    if not any(lo.global_tokens for lo in loaded.model.config.layers):
        return None
    masks = [np.zeros(len(ids), np.int32) for ids, _ in probes]
    for k, marks in enumerate(masks[:2]):
        n = len(marks)
        marks[[i for i in ((0, 5) if k == 0 else (0, n // 2, n - 1)) if i < n]] = 1
    return masks


def named_class(loaded: Loaded) -> str | None:
    """The class config.json's ``architectures`` names first, where the spec serves it (or
    reads it as a part: ``parts``) and transformers has it; else None."""
    import transformers

    named = (loaded.whole_config.get("architectures") or [None])[0]
    served = list(loaded.expanded.spec.get("architectures", default=[]) or [])
    if loaded.part is not None:
        served += loaded.part.part.architectures
    return named if named in served and hasattr(transformers, named) else None


def encoder_class(loaded: Loaded) -> str:
    """The transformers class an encoder golden is recorded through: the one config.json's
    ``architectures`` names first (``named_class``: a DPRContextEncoder, which ``AutoModel``
    builds as a DPRQuestionEncoder under another prefix; a ``*ForMaskedLM`` whose head's
    scores the golden holds too), else ``AutoModel``."""
    return named_class(loaded) or "AutoModel"


def record_encoder(loaded: Loaded) -> EncoderGolden:
    """transformers' own encoder (``encoder_class``, float32) on ``encoder_probes``, each fed
    with an all-ones attention mask as a tokenizer feeds one unpadded text: its last
    hidden states, and the spec's pooling of them (BertPooler's ``pooler_output`` for
    pooling ``pooler``), as an EncoderGolden keyed by ``loaded``'s fingerprint.

    Raises:
        ImportError: torch or transformers is not installed.
        ValueError: transformers' model lacks or does not take some of the weights, or has
            no pooler where the spec pools through one.
    """
    model = hugging_face(loaded, encoder_class(loaded))
    pooling = loaded.model.config.pooling
    probes = encoder_probes(loaded)
    lang = _language(loaded)
    masks = global_masks(loaded, probes)
    head = loaded.model.head is not None
    hidden, pooled, logits = _encode(model, probes, pooling, np.float32, lang, masks, head)
    meta = {**recorded_from(loaded, model), "dtype": "float32",
            "pooling": f"{pooling.kind}{', normalized' if pooling.normalize else ''}"}
    if head:
        meta["head"] = loaded.model.head.options.task
    if lang is not None:
        meta["langs"] = lang
    golden = EncoderGolden(loaded.fingerprint(), probes, pooled, hidden, "spec", meta,
                           global_masks=masks, logits=logits)
    return add_encoder_float64(loaded, golden)


def add_encoder_float64(loaded: Loaded, golden: EncoderGolden) -> EncoderGolden:
    """``golden`` with transformers' float64 outputs added (``hidden64``, ``pooled64``): its
    encoder loaded in float64 on ``loaded``'s weights, on the golden's own probes; the
    float32 arrays kept as they are.

    Raises:
        ValueError: as ``record_encoder``.
    """
    pooling = loaded.model.config.pooling
    if golden.pooling == "mean":
        # The older layouts pool by the mean over each probe's rows, unnormalized.
        pooling = dataclasses.replace(pooling, kind="mean", normalize=False)
    model = hugging_face(loaded, encoder_class(loaded), dtype="float64")
    # A golden stores zeros for the types of a model without a token-type table; fed none,
    # as the float32 run was (XLMModel adds embeddings(token_type_ids), word rows, where given).
    probes = golden.probes if loaded.model.config.token_types else \
        [(ids, None) for ids, _ in golden.probes]
    with _default_float64():
        hidden, pooled, logits = _encode(model, probes, pooling, np.float64, _language(loaded),
                                         golden.global_masks, golden.logits is not None)
    return dataclasses.replace(golden, hidden64=hidden, pooled64=pooled, logits64=logits, meta={
        **golden.meta, "float64": {"dtype": "float64", "model": type(model).__name__}})


def _language(loaded: Loaded) -> int | None:
    """The language every token of a probe is fed in (``langs``): the spec's default
    language, which a call of ours that names none takes; None where the model has no
    language table."""
    o = loaded.model.config
    return o.language if o.languages else None


def _encode(model, probes, pooling, dtype, lang: int | None = None, masks=None,
            head: bool = False
            ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray] | None]:
    """transformers' ``model``'s last hidden states and the spec's ``pooling`` of them on
    each probe, as ``dtype`` arrays (float32 pooling is computed in float64, then rounded);
    every token of a probe in language ``lang`` (XLMModel's ``langs``; None: none given);
    ``masks``: each probe's ``global_attention_mask`` (None: none given); with ``head``, its
    task head's ``logits`` too (``(rows, size)``, or ``(size,)`` for a text's classes;
    else None)."""
    import torch

    hidden, pooled, logits = [], [], []
    with torch.no_grad():
        for k, (ids, types) in enumerate(probes):
            # As a tokenizer feeds one unpadded text: every id attended (a model that masks
            # its padding id where given no mask, as DPRQuestionEncoder, then masks none).
            kwargs: dict[str, Any] = {"input_ids": torch.from_numpy(ids.astype(np.int64))[None],
                                      "attention_mask": torch.ones((1, len(ids)), dtype=torch.long)}
            if types is not None:
                kwargs["token_type_ids"] = torch.from_numpy(types.astype(np.int64))[None]
            if lang is not None:
                kwargs["langs"] = torch.full((1, len(ids)), lang, dtype=torch.long)
            if masks is not None:
                kwargs["global_attention_mask"] = torch.from_numpy(
                    masks[k].astype(np.int64))[None]
            out = model(**kwargs, output_hidden_states=True)
            # The last layer's states: an output without last_hidden_state (DPR's encoders
            # return pooler_output and hidden_states) holds them last in hidden_states.
            last = getattr(out, "last_hidden_state", None)
            h = (out.hidden_states[-1] if last is None else last)[0].numpy().astype(dtype)
            if pooling.kind == "pooler":
                if getattr(out, "pooler_output", None) is None:
                    raise ValueError(f"transformers' {type(model).__name__} has no pooler, and "
                                     "the spec pools through pooler.dense")
                p = out.pooler_output[0].numpy().astype(np.float64)
            elif pooling.kind == "cls":
                p = h[0].astype(np.float64)
            elif pooling.kind == "mean":
                p = h.astype(np.float64).mean(axis=0)
            else:
                p = None
            if p is not None and pooling.normalize:
                p = p / np.linalg.norm(p)
            hidden.append(h)
            pooled.append(h if p is None else p.astype(dtype))
            if head:
                logits.append(out.logits[0].numpy().astype(dtype))
    return hidden, pooled, logits if head else None
