"""The library: ``iron_spec.load(...)`` gives a model a Python user drives.

    import iron_spec
    model = iron_spec.load("llama3", "path/to/smollm2-135m-instruct")
    model.generate("The capital of France is", max_new_tokens=8)   # greedy: " Paris. ..."
    for piece in model.stream("Once upon a time", temperature=0.8, seed=1):
        print(piece, end="")
    chat = model.chat(system="You are terse.")
    chat.send("What is the capital of France?")

A causal spec loads as a ``Model`` (``generate``, ``complete``, ``stream``, ``chat``), an
encoder spec as an ``EncoderModel`` (``embed``). The CLI's ``run`` and ``embed`` call exactly
this. Sampling defaults are the checkpoint's generation_config.json, as transformers'.

Not for: checking a spec (``check``), measuring speed (``bench``).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from iron_spec.operators.native import threads as native_threads
from iron_spec.operators.threads import set_threads
from iron_spec.runtime.files import named
from iron_spec.runtime.session import Busy, Session
from iron_spec.runtime.tokenizer import PIECE

from iron_spec.runtime.engine import Engine, Request
from iron_spec.runtime.generation import (SETTINGS, Completion, Stream, busy_message,
                                          read_generation_config, sampler_for, setting)
from iron_spec.spec import arguments
from iron_spec.spec.build import (DECODE_WEIGHTS, KV_CACHES, PREFILL_WEIGHTS, WEIGHTS, Loaded,
                                  load_model)
from iron_spec.spec.encoder import load_encoder
from iron_spec.spec.loader import load_spec
from iron_spec.spec.registry import find, picked_by
from iron_spec.spec.towers import load_towers

from . import multimodal, tasks
from .embedding import embed_texts
from .progress import COMPILING, COMPILING_ENCODER, LOADING, Bar, Callback, Progress, reporter

log = logging.getLogger("iron_spec")

#: Tokens a generation draws when neither the caller nor generation_config.json says.
DEFAULT_NEW_TOKENS = 64
#: Tokens a chat reply draws at most by default (it ends at the end of its turn).
DEFAULT_REPLY_TOKENS = 512
# Two threads asking for a model's engine at once get one engine.
_ENGINE_LOCK = threading.Lock()


def load(spec: str | Path | None = None, checkpoint: str | Path | None = None, *,
         max_seq_len: int | None = None, threads: int | None = None,
         allow_unread_config: bool = False, random_weights: int | None = None,
         toy: bool = False, prefill_chunk: int | None = None, decode_weights: str = "float32",
         prefill_weights: str = "float32", max_tokens: int | None = None,
         progress: Progress = None,
         kv_cache: str = "float32", weights: str = "stored") -> "Model | EncoderModel":
    """A model of ``spec`` on ``checkpoint``'s config and weights (or drawn ones).

    Args:
        spec: a spec's name (``"llama3"``, as ``iron-spec list`` shows), a path to a spec
            YAML, or None: the spec serving ``checkpoint``'s config.json ``architectures``.
            Names are looked up in ``IRON_SPEC_SPECS`` where set, else the shipped specs.
        checkpoint: a directory (config.json, model.safetensors or a sharded index,
            tokenizer.json) or a Hugging Face hub id (its cache and ``HF_HUB_OFFLINE``).
        max_seq_len: the context in tokens (default: the checkpoint's own where the model
            and its KV caches fit this host's memory, else the most that fits).
        threads: threads for the kernels (default: ``OPENBLAS_NUM_THREADS``, else every core).
        allow_unread_config: load although config.json holds keys the spec neither reads
            nor ignores (refused otherwise, every such key named).
        random_weights: draw the weights at this seed instead of reading them.
        toy: the spec's tiny ``toy`` shape (with ``random_weights``: no files at all).
        prefill_chunk: ids a prompt call holds (default: the spec's).
        decode_weights: ``"float32"``, ``"bfloat16"``, ``"bfloat16-rounded"`` or ``"int8"`` (the decode step's projections: build.DECODE_WEIGHTS).
        prefill_weights: ``"float32"`` or ``"bfloat16"`` (the prompt chunk's projections,
            their inputs rounded to bfloat16 too: build.PREFILL_WEIGHTS).
        max_tokens: an encoder's ids per text (default: the spec's).
        progress: None (the default): a progress bar (tqdm's) where someone watches, a
            terminal's stderr or a Jupyter notebook, else nothing; True: a bar; False:
            nothing; or a callable ``progress(stage, done, total)`` called as each stage
            advances: ``"loading weights"`` (0 of 1 as it starts, then tensors read of the
            checkpoint's; drawn weights: 1 of 1 when drawn), then
            ``"compiling the decode step"`` and ``"compiling the prompt chunk"`` (an
            encoder: ``"compiling the encoder"``), each 0 of 1 as it starts and 1 of 1 when
            done (``iron_spec.library.progress``).
        kv_cache: ``"float32"`` or ``"bfloat16"`` (what the KV caches hold, each key and
            value rounded to nearest as written: build.KV_CACHES).
        weights: what the projections' and embeddings' matrices are held as
            (build.WEIGHTS, ``runtime.holding``): ``"stored"`` (as the checkpoint stores
            them: bfloat16 safetensors memory-mapped and read in place, a GGUF file's
            blocks), ``"float32"``, or a conversion at load (``"bfloat16"``, ``"q8_0"``,
            ``"q4_0"``, ...).

    Returns:
        ``Model`` for a ``model: causal`` spec, ``EncoderModel`` for ``model: encoder``.

    Raises:
        FileNotFoundError: no such spec (the valid names listed), checkpoint or config.json.
        SpecError: the spec is invalid or does not fit the config, or config.json holds a
            key the spec neither reads nor ignores.
        CheckpointError: the weights do not fit the model (every tensor named).
        TypeError: an argument of the wrong type (a bool or float for a count or a seed,
            a str for a flag), or one the spec's kind of model has no use for
            (``max_tokens`` for a causal model; ``max_seq_len``, ``prefill_chunk``,
            ``decode_weights``, ``prefill_weights``, ``kv_cache`` for an encoder); each
            named, before anything loads.
        ValueError: an argument out of its range (a seed < 0, a count < 1, ``max_tokens`` <
            2, ``decode_weights`` none of ``build.DECODE_WEIGHTS``, ``prefill_weights`` none
            of ``build.PREFILL_WEIGHTS``, ``kv_cache`` none of ``build.KV_CACHES``,
            ``weights`` none of ``build.WEIGHTS``),
            ``max_seq_len``
            past the model's own context, or a generation_config.json id that is no token
            (a file that cannot be read is a warning: nothing comes from it).
    """
    for name, value in (("spec", spec), ("checkpoint", checkpoint)):
        if value is not None and not isinstance(value, (str, Path)):
            raise TypeError(f"load: {name} is {type(value).__name__}, not a str or Path")
    # Every argument is checked before anything loads or changes (the threads included).
    random_weights = arguments.whole(random_weights, "random_weights", 0,
                                     what="the seed weights are drawn at")
    max_seq_len = arguments.whole(max_seq_len, "max_seq_len", what="the context in tokens")
    prefill_chunk = arguments.whole(prefill_chunk, "prefill_chunk",
                                    what="ids a prompt call holds")
    max_tokens = arguments.whole(max_tokens, "max_tokens", 2, what="an encoder's ids per text")
    threads = arguments.whole(threads, "threads", what="threads for the kernels")
    toy = arguments.flag(toy, "toy")
    allow_unread_config = arguments.flag(allow_unread_config, "allow_unread_config")
    report = reporter(progress)
    for name, value, choices in (("decode_weights", decode_weights, DECODE_WEIGHTS),
                                 ("prefill_weights", prefill_weights, PREFILL_WEIGHTS),
                                 ("kv_cache", kv_cache, KV_CACHES),
                                 ("weights", weights, WEIGHTS)):
        if not isinstance(value, str):
            raise TypeError(f"{name} is {value!r}; it is one of {', '.join(map(repr, choices))}")
        if value not in choices:
            raise ValueError(f"{arguments.said(name, value)} is not one of {', '.join(choices)}")
    if isinstance(checkpoint, (str, Path)) and str(checkpoint).startswith("~"):
        checkpoint = Path(checkpoint).expanduser()
    if spec is None and checkpoint is None:  # the library's words, not the CLI's
        raise TypeError("load() needs a spec (a name, as `iron-spec list` shows, or a YAML "
                        "path) or a checkpoint whose config.json names its architecture: "
                        "load('NAME', 'path/to/checkpoint')")
    path = find(spec, checkpoint)
    if spec is None:  # which spec runs, where the caller did not say (INFO, as the rest of load)
        log.info("[spec %s: %s, picked by the checkpoint's %s]", path.stem, path,
                 picked_by(checkpoint, path))
    parsed = load_spec(path)
    if parsed.get("model") == "encoder":
        arguments.only_for("encoder", {
            "max_seq_len": (max_seq_len, None, "a causal model's context (an encoder's "
                            "ids per text are max_tokens)"),
            "prefill_chunk": (prefill_chunk, None, "a causal model's prompt calls"),
            "decode_weights": (decode_weights, "float32", "a causal model's decode step"),
            "prefill_weights": (prefill_weights, "float32", "a causal model's prompt chunk"),
            "kv_cache": (kv_cache, "float32", "a causal model's KV caches"),
            "weights": (weights, "stored", "a causal model's held weights (an encoder's are "
                        "float32)")},
            str(path))
        with _threads(threads), _closed(report):
            with _loading(report) as read:
                loaded = load_encoder(parsed, checkpoint=checkpoint,
                                      random_weights=random_weights, toy=toy,
                                      max_tokens=max_tokens, progress=read,
                                      allow_unread_config=allow_unread_config)
            _compiled(report, COMPILING_ENCODER, loaded.model.version)
            return EncoderModel(loaded, path)
    arguments.only_for("causal", {"max_tokens": (max_tokens, None, "an encoder's ids per "
                                                 "text (a causal model's context is "
                                                 "max_seq_len)")}, str(path))
    with _threads(threads), _closed(report):
        with _loading(report) as read:
            loaded = load_model(path, checkpoint=checkpoint, random_weights=random_weights,
                                toy=toy, max_seq_len=max_seq_len, prefill_chunk=prefill_chunk,
                                progress=read, decode_weights=decode_weights,
                                prefill_weights=prefill_weights,
                                allow_unread_config=allow_unread_config, kv_cache=kv_cache,
                                weights=weights)
            # A composite checkpoint's towers (its spec's towers:), beside the text model.
            loaded.towers = load_towers(loaded, allow_unread_config)
        # Both versions compiled now, each reported: the first generation then runs at once.
        for prompt in (False, True):
            _compiled(report, COMPILING[prompt], lambda: loaded.lm.version(prompt))
        return Model(loaded, path)


@contextmanager
def _loading(report: Callback | None) -> Iterator[Callable[[int, int], None] | None]:
    """The ``loading weights`` stage around the ``with`` block: 0 of 1 as it starts, the
    loader's ``(tensors read, tensors)`` calls as they come (the progress it yields), and
    done when the block ends (weights drawn, not read, report no count between)."""
    if report is None:
        yield None
        return
    last = [0, 1]

    def read(done: int, total: int) -> None:
        last[:] = done, total
        report(LOADING, done, total)
    report(LOADING, 0, 1)
    yield read
    if last[0] < last[1]:
        report(LOADING, last[1], last[1])


def _compiled(report: Callback | None, stage: str, compile: Callable[[], Any]) -> None:
    """``compile()``, reported as ``stage``: 0 of 1 as it starts, 1 of 1 when done."""
    if report is not None:
        report(stage, 0, 1)
    compile()
    if report is not None:
        report(stage, 1, 1)


@contextmanager
def _closed(report: Callback | None) -> Iterator[None]:
    """A bar of ours closed however the load ends (a refusal mid-load leaves none behind)."""
    try:
        yield
    finally:
        if isinstance(report, Bar):
            report.close()


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """The kernels on ``n`` threads (None: as they are) from here on; put back as they were
    where the block raises, so a refused load changes nothing (the threads are set first:
    loading may start the decode pool, which keeps the count it starts with)."""
    if n is None:
        yield
        return
    var, before = os.environ.get("OPENBLAS_NUM_THREADS"), native_threads()
    set_threads(n)
    try:
        yield
    except BaseException:
        set_threads(before)
        if var is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = var
        raise


class Model:
    """A causal language model, loaded.

    Attributes:
        spec: the spec file's path. config: config.json as read (a dict; the toy's for a
        toy). tokenizer: ``runtime.tokenizer.Tokenizer`` (None without tokenizer.json).
        max_seq_len: the context in tokens. generation_config: generation_config.json (a
        dict, {} where absent). loaded: the ``build.Loaded`` underneath (module tree, report).

    A prompt is text (encoded as transformers' ``tokenizer(text)``: a BOS where the
    tokenizer puts one), a list of messages (``{"role", "content"}``, rendered by the chat
    template with the assistant's turn opened), or token ids (a sequence of ints).

    Threads: a model may be shared. ``generate``, ``complete``, ``stream`` and ``chat`` from
    any threads each give what they give alone: a generation runs on the model's own session
    (its KV cache kept for the next call that begins the same way) where no other is
    running on it, else on a session of its own; every model call runs under the model's
    lock (``runtime.session`` says what is locked). A chat takes one turn at a time: a turn
    sent while another of the same chat runs is refused (``runtime.session.Busy``).
    """

    def __init__(self, loaded: Loaded, spec: Path):
        self.loaded, self.spec = loaded, spec
        self.config: dict = loaded.config_json
        self.tokenizer = loaded.tokenizer
        self.generation_config, self._gen_path = read_generation_config(
            loaded.directory, loaded.lm.config.vocab_size)
        self._session = Session(loaded.lm)
        # The towers' soft tokens placed at their placeholders (None: a text model).
        self.multimodal = multimodal.multimodal(loaded)
        self._engine: Engine | None = None
        self._engine_options: dict = {}

    @property
    def max_seq_len(self) -> int:
        return self.loaded.lm.config.max_seq_len

    @property
    def _own_context(self) -> tuple[int, str]:
        """The model's own context (its max_position_embeddings field) and its source
        (``config.json: max_position_embeddings``): the most ``max_seq_len`` can be."""
        resolved = self.loaded.expanded.resolved
        return (resolved.values["max_position_embeddings"],
                resolved.sources["max_position_embeddings"])

    def __getattr__(self, name: str):
        raise _other_kind(self, name, "EncoderModel", ENCODER_METHODS, CAUSAL_METHODS)

    @property
    def eos_ids(self) -> frozenset[int]:
        """The ids a generation ends at (the tokenizer's, generation_config.json's and
        config.json's eos_token_id); none without a tokenizer."""
        return self.tokenizer.eos_ids if self.tokenizer is not None else frozenset()

    def encode(self, prompt: str | Sequence[dict] | Sequence[int] | np.ndarray) -> list[int]:
        """The ids of ``prompt`` (text, messages or ids, as the class says).

        Raises:
            TypeError: ``prompt`` is none of these.
            ValueError: text or messages without a tokenizer, text that encodes to no
                tokens or is not UTF-8, a checkpoint with no chat template for messages.
            IndexError: an id outside the vocabulary.
        """
        if multimodal.has_images(prompt):
            return multimodal.encode(self, prompt)[0]
        if _messages(prompt):
            for i, m in enumerate(prompt):
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise TypeError(f"message {i} is {m!r}: each message is a mapping with a "
                                    "text 'role' and a text 'content'")
        if isinstance(prompt, str) or _messages(prompt):
            if self.tokenizer is None:
                where = self.loaded.directory
                raise ValueError("a text prompt needs the checkpoint's tokenizer, and " +
                                 (f"{where / 'tokenizer.json'} is missing" if where is not None
                                  else "a toy has none: give token ids"))
            self._within_bound(prompt if isinstance(prompt, str) else
                               "\n".join(m["content"] for m in prompt))
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else \
                self.tokenizer.chat(list(prompt))
            if not ids:
                raise ValueError("the prompt encodes to no tokens; give some text")
            return ids
        if isinstance(prompt, (list, tuple)) and not prompt:
            raise ValueError("the prompt holds no token ids")
        try:
            ids = np.asarray(prompt)
        except (TypeError, ValueError):
            ids = None
        if ids is None or ids.ndim != 1 or ids.dtype.kind not in "iu" or (
                isinstance(prompt, (list, tuple)) and any(isinstance(t, bool) for t in prompt)):
            held = f"{type(prompt).__name__} of {', '.join(sorted({type(t).__name__ for t in prompt}))}" \
                if isinstance(prompt, (list, tuple)) and len(prompt) else type(prompt).__name__
            raise TypeError("a prompt is text, a list of {role, content} messages, or a "
                            f"sequence of integer token ids (not booleans); not {held}")
        if ids.size == 0:
            raise ValueError("the prompt holds no token ids")
        V = self.loaded.lm.config.vocab_size
        bad = np.flatnonzero((ids < 0) | (ids >= V))
        if bad.size:
            raise IndexError(f"token id {int(ids[bad[0]])} at position {int(bad[0])} is "
                             f"outside the vocabulary [0, {V})")
        return ids.astype(np.int64).tolist()

    def max_prompt_bytes(self) -> int | None:
        """The most bytes of text a prompt may hold: ``max_seq_len`` tokens of this
        tokenizer's longest (``Tokenizer.most_bytes``); None where the tokenizer bounds no
        such figure (a text is then counted in pieces: ``_within_bound``)."""
        return None if self.tokenizer is None else self.tokenizer.most_bytes(self.max_seq_len)

    def _within_bound(self, text: str) -> None:
        """Refuse ``text`` (a prompt, or a conversation's messages) that cannot fit the
        context, before it is tokenized whole (~165 bytes of memory a byte): past
        ``max_prompt_bytes``, or where its first pieces alone encode to more than
        ``max_seq_len`` tokens (``Tokenizer.surely_past``). A text of at most
        ``runtime.tokenizer.PIECE`` characters is tokenized as it is.

        Raises:
            ContextFull: naming its size, the bound and the context.
        """
        if len(text) <= PIECE:
            return
        L, size = self.max_seq_len, len(text.encode("utf-8", "surrogatepass"))
        most = self.max_prompt_bytes()
        if most is not None and size > most:
            raise _context_full(
                f"the prompt's {size} bytes of text (more than {most}: {L} tokens of at most "
                f"{self.tokenizer.longest} bytes, this tokenizer's longest token; refused "
                "before it is tokenized)", L, self._own_context, "give a shorter prompt")
        if self.tokenizer.surely_past(text, L):
            raise _context_full(
                f"the prompt's {size} bytes of text (its first pieces alone encode to more "
                f"than {L} tokens; refused before the rest is tokenized)", L,
                self._own_context, "give a shorter prompt")

    def sampler(self, *, seed: int | None = None, **settings: Any):
        """The ``operators.Sampler`` for ``settings`` (None: generation_config.json's), as
        ``generation.sampler_for``; ``seed`` None draws a fresh one (``sampler.seed``)."""
        return sampler_for(self.generation_config, self._gen_path, seed=seed, **settings)

    def stream(self, prompt, *, max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = None,
               top_p: float | None = None, min_p: float | None = None,
               repetition_penalty: float | None = None, presence_penalty: float | None = None,
               frequency_penalty: float | None = None,
               stop: str | Sequence[str] | None = None, seed: int | None = None,
               logprobs: bool = False, session: Session | None = None,
               on_finish=None, images: Sequence | None = None,
               audio: Sequence | None = None) -> Stream:
        """A generation after ``prompt``, run as it is iterated: text pieces as drawn.

        Args:
            max_new_tokens: most tokens to draw (default: generation_config.json's
                ``max_new_tokens``, else 64), cut to the room the context leaves when not
                given (the ``Completion`` then says ``context``).
            temperature: 0 is greedy; top_k, top_p, min_p, repetition_penalty: as
                transformers' warpers and processors (``operators.sampling``); each None is
                generation_config.json's (greedy unless it says ``do_sample``).
            presence_penalty: subtracted from every token drawn so far (OpenAI/vLLM).
            frequency_penalty: subtracted from every token drawn so far once for each time
                it was drawn (OpenAI/vLLM).
            stop: text that ends the generation; the text stops before it. A piece that
                could begin one is held back until the next token decides.
            seed: the sampler's seed; None draws a fresh one (``result.seed`` says which).
            logprobs: record each drawn token's log-probability (``result.logprobs``).
            session: the history whose KV cache to resume from and extend (default: the
                model's own): a ``runtime.session.Session(model.loaded.lm)``; a call whose
                prompt begins with what the session last ran re-runs only the rest.
            images, audio: a model with towers: the images (paths, PIL images or uint8
                arrays) and sounds (paths, or samples at the feature extractor's rate) of a
                text prompt's markers, in order; messages hold theirs as transformers' chat
                messages do (``library.multimodal``). Each input's tower runs once; a later
                call holding the same input reuses its soft tokens and, where the session
                held it, its KV cache.

        Returns:
            A ``Stream``: iterate it for ``str`` pieces; ``.result`` is the ``Completion``
            once it is exhausted; ``.text()`` runs it to the end.

        Raises (before anything runs):
            ValueError: a bad setting, an empty stop string; as ``encode`` for the prompt.
            ContextFull: a ValueError, the prompt and the tokens to draw do not fit
                ``max_seq_len``.
            TypeError: ``session`` is not a Session over this model; as ``encode``.
            IndexError: as ``encode``.
        """
        logprobs = arguments.flag(logprobs, "logprobs")
        arguments.callable_or_none(on_finish, "on_finish", "the Completion once it ends")
        if session is not None and (not isinstance(session, Session)
                                    or session.lm is not self.loaded.lm):
            over = "over another model" if isinstance(session, Session) else ""
            raise TypeError(f"session is a {type(session).__name__}{over and ' ' + over}, not "
                            "a Session over this model: give None (the model's own), or make "
                            "one with `from iron_spec.runtime.session import Session; session "
                            "= Session(model.loaded.lm)` (it keeps its own history's KV cache "
                            "from call to call)")
        inputs = {}
        if images is not None or audio is not None or multimodal.has_images(prompt):
            ids, inputs = multimodal.encode(self, prompt, {"image": images, "audio": audio})
        else:
            ids = self.encode(prompt)
        n, sampler, stops, bound = self._prepare(
            ids, max_new_tokens, dict(seed=seed, temperature=temperature, top_k=top_k,
                                      top_p=top_p, min_p=min_p,
                                      repetition_penalty=repetition_penalty,
                                      presence_penalty=presence_penalty,
                                      frequency_penalty=frequency_penalty), stop)
        busy = "share" if session is not None else "own"
        session = session if session is not None else self._session
        placed = ids
        if self.multimodal is not None:
            ids = self.multimodal.lookup(ids)  # a placeholder past the vocabulary read as 0
        session.check(ids, more=n - 1)  # refused here, before anything runs
        stream = Stream(session, ids, n, sampler, self.eos_ids, self.tokenizer, stops,
                        logprobs, bound, on_finish, busy=busy)
        if self.multimodal is not None:
            # Each image's soft tokens at its placeholders (its tower run once per image, here:
            # refused before anything runs), placed in the session the stream runs on once
            # it is claimed, its caches forgotten from the first image that changed.
            placement, towers = self.multimodal.placement(placed, inputs), self.multimodal
            stream.prepare = lambda s: towers.adopt(s, placement)
        return stream

    def _prepare(self, ids, max_new_tokens, settings: dict, stop):
        """A generation's tokens to draw, sampler, stop strings and whether the count was
        cut to the context, every argument checked (``stream``'s errors)."""
        sampler = self.sampler(**settings)
        stops = _stops(stop)
        room = self.max_seq_len - len(ids) + 1
        if max_new_tokens is not None:
            n = arguments.whole(max_new_tokens, "max_new_tokens", what="most tokens to draw")
            bound = False
        else:
            default = setting(self.generation_config, self._gen_path, "max_new_tokens",
                              DEFAULT_NEW_TOKENS, DEFAULT_NEW_TOKENS)
            n, bound = max(1, min(default, room)), default > room
        if len(ids) + n - 1 > self.max_seq_len:
            raise _context_full(f"{len(ids)} token{'s' * (len(ids) != 1)}" + (
                f" and {n - 1} more to draw" if n > 1 else ""), self.max_seq_len,
                self._own_context, "give a shorter prompt" + (
                    f", or draw at most {room} token{'s' * (room != 1)}" if n > 1 and room >= 1 else ""))
        return n, sampler, stops, bound

    def request(self, prompt, *, max_new_tokens: int | None = None,
                stop: str | Sequence[str] | None = None, seed: int | None = None,
                top_logprobs: int | None = None, on_piece=None, on_finish=None,
                **settings) -> Request:
        """A ``runtime.engine.Request`` for ``prompt``, for ``engine().submit``: its
        arguments as ``stream``'s (the sampling settings by name), every one checked here;
        ``top_logprobs``: None for no log-probabilities, else how many of the most likely
        tokens each piece names beside the drawn one's (``runtime.engine.TokenLogprob``).

        Raises:
            As ``stream``.
        """
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise TypeError(f"request() got an unexpected keyword argument "
                            f"{sorted(unknown)[0]!r} (the sampling settings: "
                            f"{', '.join(SETTINGS)})")
        if top_logprobs is not None:
            top_logprobs = arguments.whole(top_logprobs, "top_logprobs", 0,
                                           what="most likely tokens named beside each")
        if multimodal.has_images(prompt):
            raise ValueError("the engine runs text prompts: messages whose content is a list "
                             "of parts (images, sounds) run through stream() one at a time")
        ids = self.encode(prompt)
        n, sampler, stops, bound = self._prepare(ids, max_new_tokens,
                                                 dict(seed=seed, **settings), stop)
        self._session.check(ids, more=n - 1)  # refused here, before the engine holds it
        return Request(ids, n, sampler, self.eos_ids, self.tokenizer, stops, top_logprobs,
                       bound, on_piece, on_finish)

    def engine(self, **options) -> Engine:
        """The model's ``runtime.engine.Engine`` (made at the first call, with ``options``:
        ``max_batch`` (8), ``held_sessions``, ``held_bytes``, ``prefill_tokens``,
        ``batched``): it runs the requests submitted to it together, a decode step over
        all of them at once, and keeps finished requests' sessions for requests that begin
        the same way. ``generate``/``complete`` of a list of prompts run on it.

        Raises:
            ValueError: options given once the engine exists, other than its own.
        """
        with _ENGINE_LOCK:
            if self._engine is None:
                self._engine = Engine(self.loaded.lm, **options)
                self._engine_options = options
            elif options and options != self._engine_options:
                raise ValueError(f"the engine runs with {self._engine_options or 'defaults'} "
                                 f"already; it cannot take {options}")
            return self._engine

    def _many(self, prompts, caller: str, options: dict) -> list[Completion]:
        """Each of ``prompts`` generated on the engine, together; each Completion as the
        prompt alone gives it."""
        if "session" in options:
            raise TypeError(f"{caller}() of a list of prompts runs them on the model's engine, "
                            "each on a session of its own: no session=")
        logprobs = arguments.flag(options.pop("logprobs", False), "logprobs")
        _stream_options(self.stream, caller, options)
        on_finish = options.pop("on_finish", None)
        arguments.callable_or_none(on_finish, "on_finish", "each Completion once it ends")
        requests = []
        for i, p in enumerate(prompts):  # every prompt checked before any runs
            try:
                requests.append(self.request(p, top_logprobs=0 if logprobs else None, **options))
            except (TypeError, ValueError, IndexError) as e:
                raise named(e, f"prompt {i} (of {len(prompts)}, counted from 0)") from e
        engine = self.engine()
        tickets = [engine.submit(r) for r in requests]
        try:
            results = [t.wait() for t in tickets]
        except BaseException:
            for t in tickets:
                t.cancel()
            raise
        if on_finish is not None:
            for r in results:
                on_finish(r)
        return results

    def complete(self, prompt, **options) -> "Completion | list[Completion]":
        """The whole generation as a ``Completion`` (text, token ids, finish reason,
        log-probabilities, seed, timings); options and errors as ``stream``. A list of
        prompts (texts, lists of ids, or lists of messages) gives a list of Completions,
        generated together on the model's engine (``engine``), each the one its prompt
        gives alone (the same tokens, bit for bit, with the same seed)."""
        if _many(prompt):
            return self._many(prompt, "complete", options)
        s = self.stream(prompt, **_stream_options(self.stream, "complete", options))
        s.text()
        return s.result

    def generate(self, prompt, **options) -> "str | list[str]":
        """The text drawn after ``prompt``; options and errors as ``stream``. A list of
        prompts gives a list of texts, generated together (``complete``)."""
        if _many(prompt):
            return [c.text for c in self._many(prompt, "generate", options)]
        return self.stream(prompt, **_stream_options(self.stream, "generate", options)).text()

    def forward(self, prompt, *, output_hidden_states: bool = False) -> "Forward":
        """The model over ``prompt`` (text, messages or ids, as ``encode``) at every position,
        as transformers' ``model(ids, output_hidden_states=...)``: a ``Forward`` whose
        ``logits`` are ``(n, vocab)`` float32 (row ``i`` the scores of token ``i + 1``) and,
        where asked, ``hidden_states`` a tuple of ``num_hidden_layers + 1`` arrays ``(n,
        hidden_size)`` float32: the embeddings (the first layer's input), each layer's
        output, the last after the final norm (transformers' ``last_hidden_state``).

        Raises:
            ContextFull: the prompt does not fit ``max_seq_len``.
            ValueError: hidden states of a model whose layers run on several streams (AltUp)
                or a recurrent schedule; as ``encode``.
            TypeError, IndexError: as ``encode``.
        """
        output_hidden_states = arguments.flag(output_hidden_states, "output_hidden_states")
        ids = self.encode(prompt)
        if len(ids) > self.max_seq_len:
            raise _context_full(f"{len(ids)} tokens", self.max_seq_len, self._own_context,
                                "give a shorter prompt")
        logits, hidden = Session(self.loaded.lm).forward(ids, hidden=output_hidden_states)
        return Forward(logits, None if hidden is None else tuple(hidden))

    def logits(self, prompt) -> np.ndarray:
        """Every position's logits ``(n, vocab)`` float32 (``forward(prompt).logits``)."""
        return self.forward(prompt).logits

    def hidden_states(self, prompt) -> tuple[np.ndarray, ...]:
        """The hidden states of ``prompt`` (``forward(prompt, output_hidden_states=True)
        .hidden_states``): ``num_hidden_layers + 1`` arrays ``(n, hidden_size)``."""
        return self.forward(prompt, output_hidden_states=True).hidden_states

    def chat(self, system: str | None = None) -> "Conversation":
        """A conversation: each turn's reply resumes from the KV cache of the turns before.

        Raises:
            TypeError: ``system`` is not text (nor None).
            ValueError: the checkpoint has no tokenizer or no chat template.
            jinja2.TemplateError: the chat template is not valid jinja (named with its line).
        """
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system is {type(system).__name__}; it is the system message's "
                            "text, or None for none")
        if self.tokenizer is None or self.tokenizer.chat_template is None:
            raise ValueError("a chat needs the checkpoint's tokenizer.json and a chat template "
                             "(tokenizer_config.json's chat_template or chat_template.jinja)")
        self.tokenizer.check_chat_template()
        return Conversation(self, system)


@dataclass
class Forward:
    """``Model.forward``'s result: ``logits`` ``(n, vocab)``, ``hidden_states`` (None unless
    asked), as transformers' ``CausalLMOutputWithPast``."""

    logits: np.ndarray
    hidden_states: tuple[np.ndarray, ...] | None = None


class ContextFull(ValueError):
    """A prompt (a chat turn with the turns before it) and the tokens to draw that do not fit
    the context: refused before anything runs, nothing changed (a conversation stays as it
    was). The message names the context's argument as the caller spells it (``max_seq_len=``
    of ``iron_spec.load``; ``--max-seq-len`` in the CLI: ``arguments.said``)."""


def _context_full(what: str, L: int, own: tuple[int, str], instead: str) -> ContextFull:
    """``what`` past the context ``L``: a larger context where the model's ``own`` (its
    max_position_embeddings and where it came from) is larger, else ``instead`` (the model's
    limit is reached: a larger max_seq_len would only be refused)."""
    limit, source = own
    if L < limit:
        return ContextFull(f"{what} do not fit max_seq_len {L}, the context this model was "
                           f"loaded with (a larger {arguments.said('max_seq_len')} raises it, "
                           f"up to the model's own context {limit})")
    return ContextFull(f"{what} do not fit max_seq_len {L}, the model's own context "
                       f"({source}; no larger one can be loaded): {instead}")


class Conversation:
    """Messages so far and a session over them: ``send(text)`` adds a user turn and returns
    the reply; ``stream(text)`` the same, piece by piece (the turn is kept once the stream
    ends by itself; an interrupted one, closed early or stopped by an interrupt, is dropped and the
    conversation stays as it was: the next turn resumes from the turns before, their KV cache
    kept). ``messages`` is the list of ``{"role", "content"}`` the template renders."""

    def __init__(self, model: Model, system: str | None = None):
        self.model = model
        self.messages: list[dict] = [] if system is None else [{"role": "system",
                                                                 "content": system}]
        self.session = Session(model.loaded.lm)
        # Turns kept: a stream made before the last one ended is refused. Read with the
        # messages, and changed with them, under one lock (another thread's turn may end
        # between the two).
        self._turns = 0
        self._kept = threading.Lock()

    def stream(self, text: str, images: Sequence | None = None,
               audio: Sequence | None = None, **options) -> Stream:
        """The reply to ``text`` as it is drawn; options as ``Model.stream`` (by default at
        most 512 tokens, ending at the end of the assistant's turn). ``images`` (a model
        with towers): images the turn shows, before its text (as transformers' chat
        messages, ``{"type": "image", "image": ...}`` items); ``audio``: sounds it plays,
        likewise (``{"type": "audio", "audio": ...}``).

        Raises:
            ContextFull: the conversation with this turn leaves no room to draw a token
                (nothing changes: the next turn may be shorter).
            Busy: a turn of this chat is running (its stream not finished or closed, on
                this thread or another); raised here, or at the first piece where that
                turn started after this stream was made. Nothing changes.
            ValueError, IndexError, TypeError: as ``Model.stream``; TypeError too for a
                ``session`` (a chat has its own).
        """
        if not isinstance(text, str):
            raise TypeError(f"a turn is text, not {type(text).__name__}")
        if self.session.claimed:
            raise Busy(busy_message("this chat"))
        if "session" in options:  # found by a new user's trial: a TypeError from inside
            raise TypeError("a chat runs on its own session (chat.session), the one its "
                            "messages are in; it takes no session= (Model.stream does)")
        then = options.pop("on_finish", None)
        arguments.callable_or_none(then, "on_finish", "the Completion once it ends")
        content = self._content(text, images, audio)
        with self._kept:
            made, turn = self._turns, self.messages + [{"role": "user", "content": content}]
        ids = self.model.encode(turn)
        L = self.model.max_seq_len
        room = L - len(ids) + 1
        if room < 1:
            own, source = self.model._own_context
            raise ContextFull(f"this turn makes the conversation {len(ids)} tokens, past "
                              f"max_seq_len {L}; it is refused, the conversation kept as it "
                              "was (" + (
                                  f"send a shorter one, or load with a larger "
                                  f"{arguments.said('max_seq_len')}, up to the model's own "
                                  f"context {own})" if L < own else
                                  f"max_seq_len {L} is the model's own context ({source}; no "
                                  "larger one can be loaded): send a shorter turn, or start a "
                                  "new conversation)"))
        if options.get("max_new_tokens") is None:
            options["max_new_tokens"] = min(DEFAULT_REPLY_TOKENS, room)
            context_bound = DEFAULT_REPLY_TOKENS > room
        else:
            context_bound = False

        def keep(result: Completion) -> None:
            if result.finish_reason == "interrupted":  # dropped: the conversation as it was
                return
            with self._kept:
                self.messages[:] = turn + [{"role": "assistant",
                                            "content": self._content(result.text)}]
                self._turns += 1
            if context_bound and result.finish_reason == "length":
                result.finish_reason = "context"
            if then is not None:  # the caller's, after the conversation holds the reply
                then(result)

        stream = self.model.stream(turn, session=self.session, on_finish=keep, **options)
        # Not started yet: a turn of this chat begun before its first piece, or ended since
        # this one was made (its turn follows messages that are no longer the last), refuses
        # it then.
        def ready() -> None:
            if self._turns != made:
                raise Busy("this chat took another turn after this stream was made (on this "
                           "thread or another): its turn would follow messages that are no "
                           "longer the conversation's, so it is refused and nothing changed. "
                           "Send it again")
        stream.busy, stream.what, stream.ready = "refuse", "this chat", ready
        return stream

    def _content(self, text: str, images: Sequence | None = None,
                 audio: Sequence | None = None):
        """A message's content: its text, or for a model with towers a list of items
        (images first, then the text), as transformers' chat messages give them to a
        processor's template (LLaVA's reads items alone)."""
        if self.model.multimodal is None:
            given = {k: v for k, v in (("image", images), ("audio", audio)) if v}
            if given:  # as generate refuses them: never dropped unread
                multimodal.refuse_missing(self.model, (), given)
            return text
        return [{"type": "image", "image": im} for im in images or []] + \
            [{"type": "audio", "audio": a} for a in audio or []] + \
            [{"type": "text", "text": text}]

    def send(self, text: str, images: Sequence | None = None,
             audio: Sequence | None = None, **options) -> str:
        """The reply to ``text``; as ``stream``."""
        return self.stream(text, images, audio, **options).text()


class EncoderModel:
    """An encoder, loaded: ``embed(texts)`` gives one vector per text; where the checkpoint
    holds a task head (``task``), ``fill_mask``, ``classify`` or ``classify_tokens`` run it
    as transformers' pipelines do.

    Attributes: spec (path), config (config.json as read), tokenizer (``encoder.TextIds``),
    loaded (the ``build.Loaded`` underneath).
    """

    def __init__(self, loaded: Loaded, spec: Path):
        self.loaded, self.spec = loaded, spec
        self.config: dict = loaded.config_json
        self.tokenizer = loaded.tokenizer

    def __getattr__(self, name: str):
        raise _other_kind(self, name, "Model", CAUSAL_METHODS, ENCODER_METHODS)

    def embed(self, texts: str | Iterable[str], lang: int | None = None) -> np.ndarray:
        """The spec's pooled embedding of each text, ``(len(texts), hidden_size)`` float32
        (one row for a single string); each text truncated to the model's ``max_tokens``,
        a warning on the ``iron_spec`` logger saying how many were. ``lang``: the texts'
        language id where the model has language embeddings (XLMModel's ``langs``, ids as
        config.json's ``lang2id``; None: the spec's default, ``lang_id``).

        Raises:
            ValueError: no tokenizer, a pooling of ``none``, no texts, a text that is not
                UTF-8, or a ``lang`` outside the language table (or for a model without
                one).
            TypeError: a text that is not a str.
        """
        return embed_texts(self.loaded, _texts(texts, "embed"), lang)

    @property
    def task(self) -> str | None:
        """The task of the head the checkpoint holds: ``"fill-mask"`` (a ``*ForMaskedLM``),
        ``"text-classification"`` (``*ForSequenceClassification``),
        ``"token-classification"`` (``*ForTokenClassification``); None for a bare encoder."""
        return tasks.task(self.loaded)

    def fill_mask(self, text: str, top_k: int = 5) -> list:
        """transformers' ``pipeline("fill-mask")`` on ``text``: for its mask token
        (``[MASK]``, ``<mask>``: the tokenizer's), the ``top_k`` likeliest tokens as dicts
        ``{"score", "token", "token_str", "sequence"}`` (score: the softmax over the
        vocabulary, float), likeliest first; a list of such lists for several masks.

        Raises:
            ValueError: the checkpoint holds no masked-LM head (a *ForMaskedLM's), no
                tokenizer, a text without a mask token, ``top_k`` below 1.
            TypeError: ``text`` is not a str, ``top_k`` not an int.
        """
        _text(text, "fill_mask")
        if top_k is None:
            raise TypeError("top_k is None; it is the tokens given per mask, a whole number")
        return tasks.fill_mask(self.loaded, text, arguments.whole(top_k, "top_k", what="tokens "
                                                            "given per mask"))

    def classify(self, texts: str | Iterable[str], top_k: int | None = 1,
                 function_to_apply: str | None = None) -> list:
        """transformers' ``pipeline("text-classification")`` on ``texts``: per text, its
        likeliest class ``{"label", "score"}`` (``top_k`` 1), or its ``top_k`` classes as a
        list of those, likeliest first (None: all); labels as config.json's ``id2label``,
        scores through ``function_to_apply`` (``"softmax"``, ``"sigmoid"``, ``"none"``;
        default the pipeline's by ``problem_type`` and the number of labels).

        Raises:
            ValueError: the checkpoint holds no sequence-classification head, no tokenizer,
                no texts, ``top_k`` below 1, an unknown ``function_to_apply``.
            TypeError: a text that is not a str.
        """
        texts = _texts(texts, "classify")
        if top_k is not None:
            top_k = arguments.whole(top_k, "top_k", what="classes given per text")
        return tasks.classify(self.loaded, texts, top_k, function_to_apply)

    def classify_tokens(self, text: str) -> list[dict]:
        """transformers' ``pipeline("token-classification")`` on ``text`` (no aggregation):
        each token whose likeliest label is not ``O``, as ``{"entity", "score", "index",
        "word", "start", "end"}``, in the text's order.

        Raises:
            ValueError: the checkpoint holds no token-classification head, or no tokenizer.
            TypeError: ``text`` is not a str.
        """
        _text(text, "classify_tokens")
        return tasks.classify_tokens(self.loaded, text)


def _text(text, call: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{call} takes a str, not {type(text).__name__}")


def _texts(texts, call: str) -> list[str]:
    """``texts`` as a list of str (one for a single str).

    Raises:
        TypeError: neither a str nor an iterable of str.
        ValueError: no texts.
    """
    if not isinstance(texts, str) and not isinstance(texts, Iterable):
        raise TypeError(f"{call} takes a str or an iterable of str, not {type(texts).__name__}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError("give at least one text")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
    return texts


CAUSAL_METHODS = ("generate", "complete", "stream", "chat", "encode", "forward", "logits",
                  "hidden_states", "engine")
ENCODER_METHODS = ("embed", "fill_mask", "classify", "classify_tokens")


def _other_kind(model, name: str, other: str, theirs: tuple, ours: tuple) -> AttributeError:
    """The AttributeError for ``model.name``: where the other kind of model (``other``) has
    ``name``, saying which kind of spec gives it and what this one offers (a bare
    "'Model' object has no attribute 'embed'" says neither)."""
    kind = type(model).__name__
    if name in theirs:
        spec_kind = "encoder" if other == "EncoderModel" else "causal"
        return AttributeError(
            f"{kind}.{name}: {name}() is {arguments.article(other)} {other}'s, loaded from a model: {spec_kind} spec; "
            f"{model.__dict__.get('spec')} is a model: "
            f"{'causal' if spec_kind == 'encoder' else 'encoder'} spec, whose {kind} offers "
            f"{', '.join(m + '()' for m in ours)}")
    return AttributeError(f"{kind!r} object has no attribute {name!r}")


def _stream_options(stream, caller: str, options: dict) -> dict:
    """``options`` where ``stream`` takes them all; else the TypeError Python would raise,
    naming ``caller`` (the method the user called) and the options there are."""
    takes = [n for n, p in inspect.signature(stream).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = [k for k in options if k not in takes]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r} "
                        f"(it takes {', '.join(takes)})")
    return options


def _many(prompt) -> bool:
    """Whether ``prompt`` is a list of prompts: a list or tuple of texts, or of sequences
    (each a list of ids or of messages); a list of ids or of messages is one prompt."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and (
        all(isinstance(p, str) for p in prompt) or
        all(isinstance(p, (list, tuple, np.ndarray)) for p in prompt))


def _messages(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and \
        all(isinstance(m, dict) for m in prompt)


def _stops(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if not isinstance(stop, (str, list, tuple)):
        raise TypeError(f"stop is text or a list of texts, not {type(stop).__name__}")
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    for s in stops:
        if not isinstance(s, str):
            raise TypeError(f"a stop string is text, not {type(s).__name__}")
        if not s:
            raise ValueError("an empty stop string would stop before anything; give some text")
    return stops
