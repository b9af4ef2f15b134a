"""``iron-spec run``: generate from a spec, on the library (``iron_spec.library.api``) and nothing else.

The text streams to stdout as drawn (or, with ``--json``, one JSON object per generation);
stderr gets the seed of a sampled run, why the text ended where that is not plain (an
end-of-text token, the context full), the time to first token and the decode tokens/s.

Not for: checking a spec (``check``), measuring speed (``bench``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np
import typer

from iron_spec.operators import Sampler
from iron_spec.runtime.causal import drawn_ids
from iron_spec.runtime.generation import Completion, Stream, read_generation_config, sampler_for, setting
from iron_spec.runtime.host import checkpoint_directory
from iron_spec.runtime.tokenizer import utf8_text
from iron_spec.spec.build import (WEIGHTS, WEIGHTS_HELP, DECODE_WEIGHTS, DECODE_WEIGHTS_HELP, KV_CACHE_HELP, KV_CACHES,
                                  PREFILL_WEIGHTS, PREFILL_WEIGHTS_HELP, model_inputs, weights_source)
from iron_spec.spec.config import ALLOW_UNREAD, ALLOW_UNREAD_HELP
from iron_spec.spec.errors import FlagError, message
from iron_spec.spec.gguf_files import is_gguf
from iron_spec.spec.interpreter import MAX_PREFILL_CHUNK, expand
from iron_spec.spec.loader import load_spec
from iron_spec.spec.registry import find
from iron_spec.library.api import Model, load

from .command import (CHECKPOINT_HELP, CHECKPOINT_METAVAR, EXPECTED, REFUSED, SPEC_HELP,
                      choice, log_to_stderr, number, pick_spec, refuse, stages, whole)


def command(
    spec: Optional[str] = typer.Argument(None, metavar="[SPEC]", help=SPEC_HELP),
    checkpoint: Optional[str] = typer.Option(None, metavar=CHECKPOINT_METAVAR, help=CHECKPOINT_HELP),
    prompt: Optional[str] = typer.Option(None, help="the text to continue (with --chat, the first message); - reads it from stdin"),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="read the prompt from this file (- is stdin)"),
    chat: bool = typer.Option(False, "--chat", help="render messages with the checkpoint's chat template; without a prompt, read turns from stdin, one a line (a turn refused is skipped, the chat going on as it was; the exit status is then 1)"),
    system: Optional[str] = typer.Option(None, help="with --chat: the system message the conversation starts with"),
    num_tokens: Optional[int] = typer.Option(None, "--num-tokens", min=1, help="most tokens to draw per turn (default: generation_config.json's max_new_tokens, else 64, cut to the room the context leaves; in a chat 512, ending at the end of the turn)"),
    temperature: Optional[float] = typer.Option(None, callback=number(0), help="0 is greedy (default: generation_config.json's, else greedy)"),
    top_k: Optional[int] = typer.Option(None, min=0, help="keep the K most likely tokens (0: all)"),
    top_p: Optional[float] = typer.Option(None, callback=number(0, 1, low_open=True), help="keep the most likely tokens up to probability P"),
    min_p: Optional[float] = typer.Option(None, callback=number(0, 1), help="keep the tokens at least P times as likely as the most likely one"),
    repetition_penalty: Optional[float] = typer.Option(None, callback=number(0, low_open=True), help="divide the scores of tokens already in the text by this (multiply the negative ones), as transformers; 1 is none"),
    presence_penalty: Optional[float] = typer.Option(None, callback=number(-2, 2), help="subtract this from the scores of tokens already drawn, as the OpenAI API (-2 to 2, its range); 0 is none"),
    stop: Optional[List[str]] = typer.Option(None, "--stop", metavar="TEXT", help="end the text before this string (repeat for several)"),
    seed: Optional[int] = typer.Option(None, min=0, max=2**64 - 1, help="the sampler's seed, a whole number in 0..2**64-1 (numpy's SeedSequence takes it whole; default: a fresh one, printed on stderr)"),
    threads: Optional[int] = typer.Option(None, min=1, help="threads for the kernels (default: OPENBLAS_NUM_THREADS, else every core)"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON object per generation: text, token ids, per-token log-probabilities, finish reason, seed, timings"),
    max_seq_len: Optional[int] = typer.Option(None, min=1, help="context length (default: the checkpoint's own, fitted to this host's memory)"),
    prefill_chunk: Optional[int] = typer.Option(None, callback=whole(1, MAX_PREFILL_CHUNK, "ids a prompt call holds"), help="ids a prompt call holds (default: the spec's)"),
    random_weights: Optional[int] = typer.Option(None, min=0, help="draw weights at this seed instead of reading them"),
    toy: bool = typer.Option(False, "--toy", help="the spec's tiny shape (with --random-weights: no files at all)"),
    prompt_len: int = typer.Option(24, min=1, help="with --toy and no tokenizer, this many random prompt ids"),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", metavar="IDS", help="the token ids to continue, comma- or space-separated (\"1,2,3\"): no tokenizer needed (a checkpoint saved without tokenizer.json); the text drawn is shown as ids where there is no tokenizer"),
    weights: str = typer.Option("stored", "--weights", callback=choice(WEIGHTS), help=WEIGHTS_HELP),
    decode_weights: str = typer.Option("float32", "--decode-weights", callback=choice(DECODE_WEIGHTS), help=DECODE_WEIGHTS_HELP),
    prefill_weights: str = typer.Option("float32", "--prefill-weights", callback=choice(PREFILL_WEIGHTS), help=PREFILL_WEIGHTS_HELP),
    kv_cache: str = typer.Option("float32", "--kv-cache", callback=choice(KV_CACHES), help=KV_CACHE_HELP),
    allow_unread_config: bool = typer.Option(False, ALLOW_UNREAD, help=ALLOW_UNREAD_HELP),
    image: Optional[List[Path]] = typer.Option(None, "--image", metavar="FILE", help="an image the prompt shows (repeat for several; a checkpoint with an image tower): placed where the prompt's image markers are, else before its text (with --chat, the first turn's)"),
    audio: Optional[List[Path]] = typer.Option(None, "--audio", metavar="FILE", help="a sound the prompt plays (repeat for several; a checkpoint with an audio tower; any format libsndfile reads, resampled to the model's rate: the audio extra): as --image"),
) -> None:
    """Generate from SPEC: stream the text as drawn, then time to first token and tokens/s."""
    with log_to_stderr():
        try:
            if spec is None and checkpoint is None:
                raise FlagError("name a SPEC, or give --checkpoint DIR to pick one from its "
                                "config.json architectures")
            settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty,
                            presence_penalty=presence_penalty)
            # The flags are checked before anything loads (a refusal in a second, not a minute).
            Sampler(**{k: v for k, v in settings.items() if v is not None}, seed=seed or 0)
            if stop is not None and not all(stop):
                raise FlagError("--stop '' would stop before anything; give some text")
            if system is not None and not chat:
                raise FlagError("--system is the system message of a --chat; give --chat too")
            if prompt is not None and prompt_file is not None:
                raise FlagError("give --prompt or --prompt-file, not both")
            ids = _prompt_ids(prompt_ids)
            if ids is not None and (prompt is not None or prompt_file is not None or chat):
                raise FlagError("--prompt-ids is the prompt: give it without --prompt, "
                                "--prompt-file or --chat")
            text = _prompt_text(prompt, prompt_file)
            images = _images(image, ids is not None, "--image")
            sounds = _images(audio, ids is not None, "--audio")
            if system is not None:
                utf8_text(system, "--system")
            if (not chat and text is None and ids is None and checkpoint is not None
                    and random_weights is None and not toy):  # --toy's own refusal first
                raise FlagError("give --prompt TEXT (or --prompt-file F), --prompt-ids IDS "
                                "(no tokenizer needed), or --chat")
            if spec is not None or checkpoint is not None:
                # A missing or broken spec said before anything loads; one picked by the
                # checkpoint's config.json said on stderr.
                spec = str(pick_spec(spec, checkpoint, "--prompt"))
                if load_spec(spec).get("model") == "encoder":
                    raise ValueError(f"{spec} is an encoder spec (model: encoder): it gives "
                                     "embeddings (iron-spec embed), it does not generate")
            _before_loading(checkpoint, random_weights, toy, text is not None or chat, chat,
                            settings, num_tokens)
            # Turns piped on stdin: up to the first one read now, so a stdin holding none is
            # refused before a minute's load, as an empty --prompt - is.
            pending = _first_turn() if chat and text is None else []
            _within_context(spec, checkpoint, random_weights, toy, max_seq_len, prefill_chunk,
                            num_tokens, len(ids) if ids is not None else
                            None if text is not None or chat else prompt_len,
                            allow_unread_config, "the {} --prompt-ids" if ids is not None else
                            "--prompt-len {}", ids)
            model = _load(spec, checkpoint, random_weights, toy, max_seq_len, prefill_chunk,
                          decode_weights, prefill_weights, allow_unread_config, threads, kv_cache,
                          weights)
            gen = dict(settings, stop=stop, seed=seed, max_new_tokens=num_tokens,
                       logprobs=json_output)
            model.sampler(seed=0, **settings)  # a bad generation_config.json, before the prompt
            out = _Output(model, json_output)
            kinds = {t.modality: t for t in model.loaded.towers}
            for flag, given, kind in (("--image", images, "image"), ("--audio", sounds, "audio")):
                if given and kind not in kinds:
                    raise ValueError(f"{flag} needs a checkpoint with an {kind} tower (its "
                                     f"spec's towers:); {model.spec} serves none for this one")
            if chat:
                _chat(model, text, system, gen, out, images, sounds, pending)
                return
            if ids is not None:
                out.show(model.stream(ids, **gen), shown=None if model.tokenizer else
                         f"prompt ids: {' '.join(map(str, ids))}")
            elif model.tokenizer is None:
                if text is not None:
                    raise ValueError(
                        "--prompt needs the checkpoint's tokenizer, and "
                        f"{model.loaded.directory / 'tokenizer.json'} is missing"
                        if model.loaded.directory is not None else
                        "--prompt and --chat need a checkpoint's tokenizer.json; a --toy run "
                        "prompts with random ids")
                rng = np.random.default_rng(random_weights)
                ids = drawn_ids(model.loaded.lm.config, rng, prompt_len)
                out.show(model.stream(ids, **gen), shown=f"prompt ids: {' '.join(map(str, ids))}")
            elif text is None:
                raise FlagError("give --prompt TEXT (or --prompt-file F), --prompt-ids IDS, "
                                "or --chat")
            elif images or sounds:
                for kind, given in (("audio", sounds), ("image", images)):
                    marker = kinds[kind].prompt.marker if given else None
                    if marker is not None and marker not in text:  # before the text, each
                        text = marker * len(given) + text
                out.show(model.stream(text, images=images or None, audio=sounds or None, **gen))
            else:
                out.show(model.stream(text, **gen))
        except EXPECTED as e:
            refuse(e)


def _images(files: Optional[List[Path]], ids: bool, flag: str) -> list[Path]:
    """The ``--image`` (or ``--audio``) files, each one there, before anything loads.

    Raises:
        FlagError: files beside ``--prompt-ids`` (whose placeholders no processor wrote).
        FileNotFoundError: a file that is not there.
        ValueError: a file its front end cannot read (``_readable``).
    """
    files = list(files or [])
    if files and ids:
        raise FlagError(f"{flag} goes with --prompt or --chat (the processor places its soft "
                        "tokens), not --prompt-ids")
    for f in files:
        if f.expanduser().is_dir():  # found by a new user's trial: it said "no such file"
            raise FlagError(f"{flag} {f} is a directory, not a file")
        if not f.expanduser().is_file():
            raise FileNotFoundError(f"{flag} {f}: no such file")
        _readable(f.expanduser(), flag)
    return [f.expanduser() for f in files]


def _readable(path: Path, flag: str) -> None:
    """Refuse, before the weights load (minutes on a large model), a file the front end will
    not read: an image Pillow cannot decode, a sound libsndfile cannot, or holding no
    samples. Where the audio extra is missing, the front end says so when it runs.

    Raises:
        ValueError: naming the flag and the file.
    """
    from iron_spec.runtime.towers.audio import check_sound
    from iron_spec.runtime.towers.images import open_image

    try:
        if flag == "--image":
            open_image(path)
        else:
            check_sound(path)
    except ImportError:  # the front end says so when it runs
        return
    except ValueError as e:
        raise ValueError(f"{flag} {e}") from None


def _before_loading(checkpoint: Optional[str], random_weights: Optional[int], toy: bool,
                    text: bool, chat: bool, settings: dict, num_tokens: Optional[int]) -> None:
    """Refuse, before a weight is read, what a local checkpoint directory's own files already
    refuse (a load takes seconds to a minute): ``--toy`` without a seed; a text prompt or a
    chat without tokenizer.json; a generation_config.json setting this run would read that
    is out of range (``generation.sampler_for``, and its max_new_tokens where
    ``--num-tokens`` is not given outside a chat). A hub id or GGUF file is checked where it
    is read, after it is resolved.

    Raises:
        FlagError: ``--toy`` without ``--random-weights`` (or with a checkpoint, or with a
            text prompt or a chat).
        ValueError: the tokenizer is missing, or a setting is bad (file and key named).
        FileNotFoundError: the checkpoint is a file that is no GGUF file.
    """
    weights_source(checkpoint, random_weights, toy)
    if toy and text:  # flags that do not go together: a usage error, as --toy's own
        raise FlagError("--prompt and --chat need a checkpoint's tokenizer.json; a --toy run "
                        "prompts with random ids")
    directory = Path(checkpoint).expanduser() if checkpoint is not None else None
    if directory is not None and directory.exists() and not directory.is_dir():
        checkpoint_directory(directory, f"--checkpoint {checkpoint}")  # a file, not GGUF: refused
    if directory is None or not directory.is_dir() or is_gguf(directory):
        return
    if text and not (directory / "tokenizer.json").exists():
        raise ValueError(f"{'--chat' if chat else '--prompt'} needs the checkpoint's "
                         f"tokenizer, and {directory / 'tokenizer.json'} is missing")
    gen, path = read_generation_config(directory)
    sampler_for(gen, path, seed=0, **settings)
    if num_tokens is None and not chat:
        setting(gen, path, "max_new_tokens")


def _within_context(spec: Optional[str], checkpoint: Optional[str],
                    random_weights: Optional[int], toy: bool, max_seq_len: Optional[int],
                    prefill_chunk: Optional[int], num_tokens: Optional[int],
                    prompt_len: Optional[int], allow_unread_config: bool,
                    flag: str = "--prompt-len {}", ids: Optional[list[int]] = None) -> None:
    """Refuse, before a weight is read, a ``--num-tokens`` no context of this model holds
    (and with ``prompt_len`` random prompt ids, a ``--prompt-len`` with them): the context is
    ``--max-seq-len``, at most the model's own (config.json's, or the toy's, expanded as the
    load will). A hub id or GGUF file is judged where it is read, after it is resolved.

    Raises:
        FlagError: a prompt and the tokens to draw take more positions than the context.
        IndexError: one of ``ids`` (``--prompt-ids``) is past the vocabulary.
    """
    if num_tokens is None and prompt_len is None:
        return
    local = checkpoint is None or (Path(checkpoint).expanduser().is_dir()
                                   and not is_gguf(Path(checkpoint).expanduser()))
    if not local or (spec is None and checkpoint is None):
        return
    parsed = load_spec(spec if spec is not None else find(None, checkpoint))
    config_json, source, _ = model_inputs(parsed, checkpoint, random_weights, toy,
                                          allow_unread_config, say_unread=False)
    if toy:  # the chunk the load expands with: the toy's own, not the spec's runtime one
        prefill_chunk = prefill_chunk or parsed.get("toy", "prefill_chunk")
    options = expand(parsed, config_json, prefill_chunk=prefill_chunk, source=source).options
    own = options.max_seq_len
    past = [i for i, t in enumerate(ids or ()) if t >= options.vocab_size]
    if past:  # as the model refuses it, but before a weight is read
        raise IndexError(f"--prompt-ids: token id {ids[past[0]]} at position {past[0]} is "
                         f"outside the vocabulary [0, {options.vocab_size}) ("
                         + ("config.json's" if checkpoint is not None else "the toy's")
                         + " vocab_size)")
    L = own if max_seq_len is None else min(max_seq_len, own)  # past own: the load says so
    where = f"--max-seq-len {L}" if max_seq_len is not None and L == max_seq_len else \
        f"the model's own context {own}"
    larger = f", or a larger --max-seq-len (up to the model's own {own})" if L < own else ""
    if num_tokens is not None and prompt_len is None and num_tokens > L:
        raise FlagError(f"--num-tokens {num_tokens} does not fit {where}: a prompt and the "
                        f"tokens drawn after it take its tokens and {num_tokens - 1} more "
                        f"positions; give a --num-tokens of at most {L + 1} less the prompt's "
                        f"length in tokens{larger}")
    if num_tokens is not None and prompt_len is not None and prompt_len + num_tokens - 1 > L:
        raise FlagError(f"{flag.format(prompt_len)} and --num-tokens {num_tokens} do not fit "
                        f"{where}: the prompt and the tokens drawn after it take "
                        f"{prompt_len + num_tokens - 1} positions; give a --num-tokens of at "
                        f"most {L - prompt_len + 1}{larger}" if prompt_len <= L else
                        f"{flag.format(prompt_len)} does not fit {where}; give at most "
                        f"{L}{larger}")
    if prompt_len is not None and prompt_len > L:
        raise FlagError(f"{flag.format(prompt_len)} does not fit {where}; give at most "
                        f"{L}{larger}")


def _prompt_ids(given: Optional[str]) -> Optional[list[int]]:
    """``--prompt-ids``' ids: whole numbers >= 0, comma- or space-separated, at least one
    (their range is the vocabulary's, checked by the model). None where not given.

    Raises:
        FlagError: empty, an empty entry (``1,,2``), or an entry that is not a whole number
            >= 0 (naming it).
    """
    if given is None:
        return None
    if not given.replace(",", " ").split():
        raise FlagError("--prompt-ids is empty; give one id or more, as \"1,2,3\"")
    parts = re.split(r"\s*,\s*|\s+", given.strip())
    if "" in parts:  # "1,,2" or "1,2,": an id left out, not a separator to pass over
        raise FlagError(f"--prompt-ids {given!r}: an empty entry (two commas with no id "
                        "between, or a comma at an end); give them as \"1,2,3\" or \"1 2 3\"")
    for part in parts:
        if not part.isdigit():
            raise FlagError(f"--prompt-ids: {part!r} is not a token id (a whole number >= 0); "
                            "give them as \"1,2,3\" or \"1 2 3\"")
    return [int(p) for p in parts]


def _prompt_text(prompt: Optional[str], prompt_file: Optional[Path]) -> Optional[str]:
    """The prompt from ``--prompt`` (``-``: stdin) or ``--prompt-file`` (``-``: stdin), its
    bytes read as a command line's are (surrogateescape), so what is not UTF-8 is named. A
    file's or stdin's one trailing newline is not prompt text (llama.cpp's ``-f`` drops it too).

    Raises:
        FlagError: the prompt file is a directory, or the prompt is empty (a usage error,
            exit 2, as ``--stop ''``: said before anything loads, not after a minute's load
            as "encodes to no tokens").
        FileNotFoundError: no such prompt file.
        ValueError: the prompt is not UTF-8 text.
    """
    if prompt_file is not None:
        if str(prompt_file) == "-":
            text, what = _read_stdin(), "the prompt on stdin"
        else:
            if prompt_file.is_dir():
                raise FlagError(f"--prompt-file {prompt_file} is a directory; give the file "
                                "holding the prompt (or - for stdin)")
            if not prompt_file.exists():  # a device or a pipe (<(...)) is read as a file
                raise FileNotFoundError(f"--prompt-file {prompt_file}: no such file")
            what = f"--prompt-file {prompt_file}"
            with open(prompt_file, "rb") as f:
                text = _bounded(f, what).decode("utf-8", "surrogateescape")
    elif prompt == "-":
        text, what = _read_stdin(), "the prompt on stdin"
    elif prompt is not None:
        text, what = prompt, "--prompt"
    else:
        return None
    if what != "--prompt" and text.endswith("\n"):
        # A file's (or a pipe's) last line ends in a newline its writer never meant as prompt
        # text: llama.cpp's `-f` drops one, and so do we (only one: a blank line is kept).
        text = text[:-1]
    if not text.strip():  # white space alone encodes to nothing a prompt means
        stdin = prompt_file is None and prompt == "-" or str(prompt_file) == "-"
        raise FlagError(f"{what} is empty" + (" but for white space" if text else
                                              ", its end before any text" if stdin else "")
                        + "; give some text")
    return utf8_text(text, what)


#: Bytes of prompt text read at most (a file, stdin, a chat line): past it, refused unread
#: (no context holds it: a million tokens are ~4 MB of text). Once the model is loaded its
#: own bound is tighter (``Model.max_prompt_bytes``).
MAX_TEXT = 64 * 2**20


def _bounded(f, what: str, limit: int = MAX_TEXT) -> bytes:
    """At most ``limit`` bytes of the binary file ``f``, all of them.

    Raises:
        ValueError: ``f`` holds more (nothing more is read), naming ``what``.
    """
    data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what} holds more than {limit} bytes ({limit >> 20} MiB), more "
                         "text than any context holds: refused unread")
    return data


def _read_stdin() -> str:
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:
        return sys.stdin.read(MAX_TEXT + 1)
    return _bounded(raw, "the prompt on stdin").decode("utf-8", "surrogateescape")


def _load(spec, checkpoint, random_weights, toy, max_seq_len, prefill_chunk, decode_weights,
          prefill_weights, allow_unread_config, threads, kv_cache, weights="stored") -> Model:
    """The model through ``iron_spec.load``, both versions compiled, each stage shown
    (``command.stages``: a bar on a terminal, a line each when piped)."""
    with stages() as shown:  # the library's stages: loading, then each version compiled
        model = load(spec, checkpoint, random_weights=random_weights, toy=toy,
                     max_seq_len=max_seq_len, prefill_chunk=prefill_chunk,
                     progress=shown.reporter(), decode_weights=decode_weights,
                     prefill_weights=prefill_weights, allow_unread_config=allow_unread_config,
                     threads=threads, kv_cache=kv_cache, weights=weights)
    if not isinstance(model, Model):
        raise ValueError(f"{model.spec} is an encoder spec (model: encoder): it gives "
                         "embeddings (iron-spec embed), it does not generate")
    return model


class _Output:
    """One generation's text to stdout as drawn (or its JSON), its notices to stderr."""

    def __init__(self, model: Model, as_json: bool):
        self.model, self.as_json = model, as_json

    def show(self, stream: Stream, shown: Optional[str] = None) -> Completion:
        for piece in stream:
            if shown is not None:  # once the session has taken the prompt
                typer.echo(shown, err=True)
                shown = None
            if not self.as_json:
                sys.stdout.write(piece)
                sys.stdout.flush()
        r = stream.result
        if shown is not None and r.token_ids:
            typer.echo(shown, err=True)
        if self.as_json:
            sys.stdout.write(json.dumps(self.record(r), ensure_ascii=False) + "\n")
        else:
            sys.stdout.write("\n")
        self.notices(r)
        return r

    def record(self, r: Completion) -> dict:
        tok = self.model.tokenizer
        tokens = [{"id": t, "text": tok.decode([t], skip_special_tokens=False)
                   if tok is not None else None, "logprob": lp}
                  for t, lp in zip(r.token_ids, r.logprobs)]
        return {"text": r.text, "token_ids": r.token_ids, "tokens": tokens,
                "finish_reason": r.finish_reason, "stop": r.stop, "seed": r.seed,
                "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                "ttft_s": _number(r.ttft),
                "decode_tokens_per_s": _number(r.decode_tokens_per_s)}

    def notices(self, r: Completion) -> None:
        if r.seed is not None:
            typer.echo(f"[seed {r.seed}: --seed {r.seed} draws this text again]", err=True)
        if r.finish_reason == "eos":
            last = r.token_ids[-1]
            if len(r.token_ids) == 1:
                typer.echo(f"[end of text: the first token drawn was the end-of-text token "
                           f"{last}, so there is no text]", err=True)
            else:
                typer.echo(f"[end of text: the model drew its end-of-text token {last}]",
                           err=True)
        elif r.finish_reason == "context":
            L, (own, _) = self.model.max_seq_len, self.model._own_context
            typer.echo(f"[the text stopped where the context (max_seq_len {L}"
                       + (", the model's own" if L >= own else f"; --max-seq-len up to {own} "
                          "gives more") + ") is full]", err=True)
        cached = (f" ({r.prompt_tokens - r.cached_tokens} run, {r.cached_tokens} from the KV "
                  "cache)" if r.cached_tokens else "")
        typer.echo(f"\n[prefill] {r.prompt_tokens} token{'s' * (r.prompt_tokens != 1)}{cached}, "
                   f"time to first token {r.ttft:.3f} s", err=True)
        n = len(r.token_ids)
        if n > 1:
            typer.echo(f"[decode]  {n - 1} token{'s' * (n != 2)}, "
                       f"{r.decode_tokens_per_s:.1f} tokens/s", err=True)


def _number(x: float):
    return None if x != x else x  # NaN is not JSON


def _first_turn() -> list[tuple[str, int]]:
    """stdin's lines up to its first that holds text (or is past ``MAX_TEXT``), as
    ``_read_line`` gives them, read before the model loads, where stdin is no terminal (a
    terminal's user types turns once the model is ready): [] on a terminal.

    Raises:
        FlagError: stdin ends before any line of text (no turns): a usage error, as an empty
            ``--prompt -``.
    """
    if sys.stdin is None or sys.stdin.isatty():
        return []
    lines = []
    while True:
        line, past = _read_line()
        if not line and not past:
            raise FlagError("--chat: no turns on stdin (its end before any line of text); "
                            "give the turns one a line on stdin, or the first with --prompt")
        lines.append((line, past))
        if past or line.strip():
            return lines


def _chat(model: Model, first: Optional[str], system: Optional[str], gen: dict,
          out: _Output, images: Optional[list] = None, sounds: Optional[list] = None,
          pending: Optional[list] = None) -> None:
    """Turns from ``first`` or stdin, one a line; each reply ends at the end of the
    assistant's turn, at ``--num-tokens``, or where the context is full. A turn refused (too
    long for the context, not UTF-8, its template's refusal) is refused alone: said on
    stderr, the conversation goes on as it was (the ``--image``/``--audio`` files still wait
    for the first turn kept); so is a reply an interrupt (^C) stops. Once the input ends, a
    chat where a turn was refused ends as a refusal (exit 1, as a shell expects of a run
    where something failed), the count said on stderr.

    Raises:
        typer.Exit: ``REFUSED`` at the end of a chat where a turn was refused.
    """
    conversation = model.chat(system)
    if first is not None:
        out.show(conversation.stream(first, images or None, sounds or None, **gen))
        return
    lines, refused, most = 0, [], min(MAX_TEXT, model.max_prompt_bytes() or MAX_TEXT)
    while True:
        typer.echo("> ", nl=False, err=True)
        # pending: read before loading (each within MAX_TEXT; the turn refuses the rest)
        line, past = pending.pop(0) if pending else _read_line(most)
        if not line and not past:  # end of input ends the chat; an empty line is no turn
            break
        lines += 1
        if past:
            typer.echo(f"error: line {lines} is {past} bytes, more than a turn can hold "
                       f"({most}: {model.max_seq_len} tokens of this tokenizer's longest "
                       f"token at most); skipped unread, the conversation goes on as it was",
                       err=True)
            refused.append(lines)
            continue
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        # The files go with the first turn the conversation keeps: a turn refused or
        # interrupted before it changes nothing, so neither does it take them.
        shown = len(conversation.messages) == (system is not None)
        try:
            utf8_text(text, f"line {lines}")
            stream = conversation.stream(text, images if shown else None,
                                         sounds if shown else None, **gen)
        except EXPECTED as e:  # that turn is refused, not the chat (a template's refusal too)
            typer.echo(f"{message(e)}; skipped", err=True)
            refused.append(lines)
            continue
        try:
            out.show(stream)
        except KeyboardInterrupt:  # as llama.cpp's interactive mode: ^C stops the reply
            stream.close()
            typer.echo("\n(interrupted: that reply is dropped, the conversation goes on as it "
                       "was; end of input (^D) or ^C at the prompt ends it)", err=True)
        except EXPECTED as e:  # refused at its first piece: the stream dropped the turn
            typer.echo(f"\n{message(e)}; skipped, the conversation goes on as it was", err=True)
            refused.append(lines)
    if refused:
        n = len(refused)
        typer.echo(f"error: {n} turn{'s' * (n != 1)} of this chat {'were' if n != 1 else 'was'} "
                   f"refused (line{'s' * (n != 1)} {', '.join(map(str, refused))} of stdin)",
                   err=True)
        raise typer.Exit(REFUSED)


def _read_line(most: int = MAX_TEXT) -> tuple[str, int]:
    """A line of stdin ("" at its end), its bytes decoded as Python decodes a command line
    (surrogateescape), so bytes that are not text reach the UTF-8 check: a stdin decoding
    strictly (a UTF-8 locale's) would raise in the middle of the chat; and 0. A line of more
    than ``most`` bytes is not kept: read past in blocks of a MiB (never held whole), it
    gives "" and its length in bytes."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:
        line = sys.stdin.readline(most + 1)
        size = len(line)
        while size > most and not line.endswith("\n"):
            line = sys.stdin.readline(2**20)
            size += len(line)
            if not line:
                break
        return ("", size) if size > most else (line, 0)
    line = raw.readline(most + 1)
    size = len(line)
    while size > most and not line.endswith(b"\n"):
        line = raw.readline(2**20)
        size += len(line)
        if not line:
            break
    if size > most:
        return "", size
    return line.decode(sys.stdin.encoding or "utf-8", "surrogateescape"), 0
