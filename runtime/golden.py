"""Golden logits: transformers' own model's next-token distributions, recorded once and read
without torch or transformers.

A golden is a small ``.npz``: the token sequence (a prompt, then the reference's own greedy
tokens, teacher-forced), and for each of ``steps`` positions the reference's ``K`` most likely
tokens with their log-probabilities and the log of the probability left in the tail. That is
all KL(reference || ours) and top-1 need; KL is computed over the top ``K`` tokens plus the
tail as one bucket (a lower bound on the full KL, equal to it when ``K`` covers the vocabulary,
as on toy shapes). It is keyed by a fingerprint of the config and the weights, and refused
when either changed.

A golden may also hold transformers' model run in float64, teacher-forced on the very same
tokens: ``top_logprobs64`` ``(steps, K)`` float64, its log-probabilities of the same
``top_ids``, and ``tail64`` ``(steps,)`` the log of what is left. Our float64
``reference()`` is judged against those (``divergence64``): a semantic error too small to
rise above float32's own spread (an RMSNorm epsilon 100x off on order-one activations)
stands far above float64's. A golden without them reads as before.

Files. A golden is read as a regular file only (a FIFO or a device named as one, or lying in
a store, is refused, never opened for a blocking read), each of its arrays bounded before it
is inflated (``MAX_MEMBER``, ``MAX_GOLDEN``) and never a pickle (``read_npz``). It is written
to a temporary name in its folder and renamed under a lock on that folder, the file already
at the path checked again at the rename (``write_npz``): two recordings into one path both
survive or the second is refused, never one lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from .files import FileError, open_regular

TOP_K = 256
#: Bytes one array of a golden may inflate to, and all of them: a causal golden holds a few
#: hundred KB, an encoder's hidden states tens of MB (5 probes x 512 tokens x 4096 hidden,
#: float32 and float64: 126 MB). A member claiming more is refused before it is inflated.
MAX_MEMBER = 2**28
MAX_GOLDEN = 2**30
MAX_MEMBERS = 4096


class GoldenError(ValueError):
    """A golden that is missing, malformed, or recorded from other config or weights."""


class GoldenTaken(GoldenError):
    """``write_npz`` found a golden of other inputs (fingerprint ``held``; None: a file that
    is no golden) at the path, written there since the caller last looked: not replaced."""

    def __init__(self, message: str, held: str | None):
        super().__init__(message)
        self.held = held


NOT_A_GOLDEN = "not a golden file (an .npz that iron-spec check --record-golden writes)"


def _missing(path: Path) -> GoldenError:
    return GoldenError(f"{path} is missing: record it where torch and transformers are "
                       "installed (pip install -e '.[golden]'; iron-spec check ... "
                       "--record-golden)")


def read_npz(path: str | Path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` (only those of ``names`` where given, those it
    holds), as ``np.load(path, allow_pickle=False)`` reads them, but: a regular file only
    (``runtime.files.open_regular``: a FIFO is refused, not waited on), at most
    ``MAX_MEMBERS`` arrays, each inflating to at most ``MAX_MEMBER`` bytes and all to
    ``MAX_GOLDEN`` (the sizes the archive declares, which zipfile holds it to), each array's
    header read and its bytes counted against what the member holds before numpy allocates
    it, no object arrays.

    Raises:
        GoldenError: no file (saying how to record one), or a file that is no such archive,
            or past a bound (naming the file, the array and the bound).
    """
    path = Path(path)
    try:
        f = open_regular(path, "golden file")
    except FileNotFoundError:
        raise _missing(path) from None
    except FileError as e:
        raise GoldenError(f"{e}: {NOT_A_GOLDEN}") from None
    with f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            raise GoldenError(f"{path}: {NOT_A_GOLDEN}") from None
        with archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise GoldenError(f"{path}: {len(infos)} arrays, more than a golden holds "
                                  f"({MAX_MEMBERS}): {NOT_A_GOLDEN}")
            total = sum(i.file_size for i in infos)
            for info in infos:
                if info.file_size > MAX_MEMBER:
                    raise GoldenError(
                        f"{path}: its array {info.filename} inflates to {info.file_size} "
                        f"bytes, more than an array of a golden may ({MAX_MEMBER}, "
                        f"{MAX_MEMBER >> 20} MiB): refused before it is read; {NOT_A_GOLDEN}")
            if total > MAX_GOLDEN:
                raise GoldenError(f"{path}: its arrays inflate to {total} bytes, more than a "
                                  f"golden may ({MAX_GOLDEN >> 20} MiB): refused before they "
                                  f"are read; {NOT_A_GOLDEN}")
            wanted = None if names is None else set(names)
            out = {}
            for info in infos:
                name = info.filename.removesuffix(".npy")
                if wanted is not None and name not in wanted:
                    continue
                try:
                    out[name] = _member(archive, info)
                except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError,
                        NotImplementedError) as e:  # encrypted; a compression zipfile lacks
                    raise GoldenError(f"{path}: its array {info.filename} cannot be read "
                                      f"({' '.join(str(e).split())[:200]}): {NOT_A_GOLDEN}") \
                        from None
    return out


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member of ``archive``: its header read first and its data's size checked
    against the bytes the member declares, then numpy's own reader on it.

    Raises:
        ValueError: not a ``.npy`` of a plain dtype, or claiming more than it holds.
    """
    fmt = np.lib.format
    if not info.filename.endswith(".npy"):
        raise ValueError("not an .npy array")
    with archive.open(info) as m:
        version = fmt.read_magic(m)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(m)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(m)
        else:
            raise ValueError(f".npy format {version}")
        header = m.tell()
    if dtype.hasobject:
        raise ValueError(f"an array of {dtype} (objects: a pickle), not of numbers or text")
    need = math.prod(shape) * dtype.itemsize
    if header + need > info.file_size:
        raise ValueError(f"its header claims {shape} of {dtype}, {need} bytes, more than the "
                         f"{info.file_size - header} it holds")
    with archive.open(info) as m:
        return fmt.read_array(m, allow_pickle=False)


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the golden file at ``path`` (a causal or an encoder golden), read
    through ``read_npz``.

    Raises:
        GoldenError: no file at ``path`` (saying how to record one), a file that is no
            ``.npz`` of arrays or holds no ``fingerprint`` (``NOT_A_GOLDEN``, naming it), or
            past ``read_npz``'s bounds.
    """
    path = Path(path)
    data = read_npz(path)
    if "fingerprint" not in data:
        raise GoldenError(f"{path}: {NOT_A_GOLDEN}: it holds no fingerprint")
    return data


def fingerprint_held(path: str | Path) -> str | None:
    """The fingerprint the golden at ``path`` holds (its one array read); None where the file
    is no golden (not a regular file, no archive, no fingerprint, past the bounds).

    Raises:
        GoldenError: no file at ``path``.
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise _missing(path)
    try:
        held = read_npz(path, ("fingerprint",)).get("fingerprint")
    except GoldenError:
        return None
    return None if held is None or held.dtype.kind not in "US" else str(held)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (``flock`` on the folder itself: no lock file left in a
    store), held by one writer of any process or thread at a time."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_npz(path: str | Path, arrays: Mapping[str, Any], fingerprint: str, *,
              replace: bool = False) -> None:
    """Write ``arrays`` (their ``fingerprint`` among them) to ``path`` as a compressed
    ``.npz``, whole: to a temporary name in its folder (made if absent), then, under the
    folder's lock, renamed over ``path`` only where nothing is there, or a golden of the same
    ``fingerprint`` (the same inputs recorded again), or ``replace`` (the caller's
    ``--overwrite-golden``). The check is made at the rename, not before the seconds a
    recording takes: a golden another process wrote meanwhile is never lost.

    Raises:
        GoldenTaken: ``path`` holds a golden of other inputs, or a file that is no golden,
            and not ``replace``; nothing written.
        GoldenError: ``path``'s folder cannot be made or written (naming it and why).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                       suffix=".partial")
    except OSError as e:
        raise GoldenError(f"{path}: cannot be written ({e.strerror or e}: "
                          f"{e.filename or path.parent})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        with _locked(path.parent):
            if not replace and (path.exists() or path.is_symlink()):
                held = fingerprint_held(path)
                if held != fingerprint:
                    what = (f"a golden of other inputs (fingerprint {held})" if held else
                            "a file that is no golden")
                    raise GoldenTaken(f"{path} holds {what}, written there while this one "
                                      f"(fingerprint {fingerprint}) was made: not replaced",
                                      held)
            os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def config_digest(config_json: Mapping[str, Any]) -> str:
    """A digest of config.json alone (canonical JSON), which a golden's meta records
    (``config``) so a golden of other inputs tells other config from other weights."""
    return hashlib.sha256(json.dumps(config_json, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Inputs:
    """What a golden is read for: the ``fingerprint`` of config.json and the tensors, and
    where known the transformers class config.json's ``architectures`` names first
    (``model``), its ``model_type``, the spec's name, ``config_digest`` (``config``) and the
    vocabulary size: what tells a golden of another model from a stale one of this model."""

    fingerprint: str
    model: str | None = None
    model_type: str | None = None
    spec: str | None = None
    config: str | None = None
    vocab_size: int | None = None


def other_inputs(path: Path, meta: Mapping[str, Any], theirs: str, these: Inputs,
                 largest_id: int | None = None) -> GoldenError:
    """The error for a golden at ``path`` recorded from inputs ``theirs``, read for
    ``these``: a golden of another model where its meta names another model class, model
    type or spec, or it holds ids past this vocabulary (``largest_id``); else one of this
    model recorded from other config or weights (stale, or another checkpoint's)."""
    differs = []
    for key, what in (("model_type", "model type"), ("model", "transformers class"),
                      ("spec", "spec")):
        held, want = meta.get(key), getattr(these, key)
        if held and want and held != want:
            differs.append(f"{what} {held}, not {want}")
    if largest_id is not None and these.vocab_size is not None and largest_id >= these.vocab_size:
        differs.append(f"token id {largest_id}, past this vocabulary of {these.vocab_size}")
    if differs:
        return GoldenError(
            f"{path} is a golden of another model ({'; '.join(differs)}): recorded from inputs "
            f"{theirs}, these are {these.fingerprint}. It cannot judge these inputs, and "
            "re-recording into it would replace that model's golden: give a golden of these "
            "inputs with --golden, or leave --golden out (check finds one by fingerprint, and "
            "--record-golden writes one in a file of its own)")
    named = ", ".join(f"{k} {meta[k]}" for k in ("model", "spec") if meta.get(k))
    if meta.get("config") and these.config:
        which = ("the same config.json, other weights" if meta["config"] == these.config else
                 "another config.json")
    else:
        which = "other config.json or weights"
    return GoldenError(
        f"{path} is a golden of this model ({named or 'its meta names no model'}) recorded "
        f"from {which} (inputs {theirs}, these are {these.fingerprint}): stale if these are "
        "the inputs it was recorded from and they changed since (re-record it where "
        "transformers is installed: iron-spec check ... --record-golden --golden PATH "
        "--overwrite-golden), else another checkpoint's (give that checkpoint, or a golden "
        "of these inputs)")


def fingerprint(config_json: Mapping[str, Any], tensors: Iterable[tuple[str, np.ndarray]]) -> str:
    """A digest of the config (canonical JSON) and every tensor's name, dtype, shape and its
    first and last 4 KiB: what tells one set of weights from another without hashing GBs."""
    h = hashlib.sha256(json.dumps(config_json, sort_keys=True).encode())
    for name, t in sorted(tensors, key=lambda item: item[0]):
        flat = np.ascontiguousarray(t).reshape(-1).view(np.uint8)
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(flat[:4096].tobytes())
        h.update(flat[-4096:].tobytes())
    return h.hexdigest()[:16]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64).reshape(-1)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


@dataclass
class Golden:
    """``tokens`` (int32): the prompt (``prompt_len``) then the reference's greedy tokens.
    Row ``i`` is the reference's distribution after ``tokens[:prompt_len + i]``: ``top_ids``
    ``(steps, K)`` int32, most likely first, ``top_logprobs`` ``(steps, K)`` float32, and
    ``tail`` ``(steps,)`` the log of the probability of every other token."""

    fingerprint: str
    tokens: np.ndarray
    prompt_len: int
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    tail: np.ndarray
    meta: dict
    top_logprobs64: np.ndarray | None = None
    tail64: np.ndarray | None = None
    # A mixture of experts' routing, transformers' on the last step's history (every
    # position): for each router of the model in the order its forward calls them, the
    # experts it chose ``(positions, k)`` (ascending) and its router logits
    # ``(positions, experts)`` as ``output_router_logits`` returns them. None: none recorded.
    routing: list[tuple[np.ndarray, np.ndarray]] | None = None

    def _malformed(self) -> str | None:
        """Why these arrays are no golden (shapes that do not fit each other), or None."""
        ids, lp, tail, tokens = self.top_ids, self.top_logprobs, self.tail, self.tokens
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or ids.dtype.kind not in "iu":
            return "tokens and top_ids must be integer ids, tokens one row"
        if ids.ndim != 2 or lp.shape != ids.shape or tail.shape != ids.shape[:1] or not ids.size:
            return (f"top_ids {ids.shape}, top_logprobs {lp.shape} and tail {tail.shape} must "
                    "be (steps, K), (steps, K) and (steps,), steps and K at least 1")
        # Row i follows tokens[:prompt_len + i]; the last row's greedy token is not kept.
        held = self.prompt_len + ids.shape[0] - 1
        if self.prompt_len < 1 or tokens.size < held:
            return (f"{tokens.size} tokens do not hold a prompt of {self.prompt_len} and "
                    f"{ids.shape[0]} steps")
        if tokens.size > held:
            return (f"{tokens.size} tokens are more than a prompt of {self.prompt_len} and the "
                    f"{ids.shape[0] - 1} greedy tokens its {ids.shape[0]} steps follow ({held}): "
                    "rows cut from it")
        claimed = self.meta.get("steps")
        if claimed is not None and claimed != ids.shape[0]:
            return f"its meta claims {claimed} steps, and it holds {ids.shape[0]} rows"
        if (self.top_logprobs64 is None) != (self.tail64 is None):
            return "top_logprobs64 and tail64 come together"
        if self.top_logprobs64 is not None and (self.top_logprobs64.shape != ids.shape or
                                                self.tail64.shape != ids.shape[:1]):
            return (f"top_logprobs64 {self.top_logprobs64.shape} and tail64 "
                    f"{self.tail64.shape} must be {ids.shape} and {ids.shape[:1]}")
        if (ids < 0).any() or (tokens < 0).any():
            return "a token id below 0"
        for j, (chosen, logits) in enumerate(self.routing or ()):
            if chosen.ndim != 2 or logits.ndim != 2 or chosen.shape[0] != logits.shape[0] \
                    or chosen.shape[0] > tokens.size or chosen.dtype.kind not in "iu" \
                    or (chosen < 0).any() or (chosen >= logits.shape[1]).any():
                return (f"router {j}'s experts {chosen.shape} and logits {logits.shape} are "
                        f"not (positions, k) experts among (positions, experts) logits of at "
                        f"most {tokens.size} positions")
        for name, rows, low in (("top_logprobs", lp, False), ("tail", tail, True),
                                ("top_logprobs64", self.top_logprobs64, False),
                                ("tail64", self.tail64, True)):
            # A log-probability is finite, at most 0 (a tail may be -inf: nothing left).
            if rows is not None and (np.isnan(rows).any() or (rows > 1e-6).any() or
                                     (not low and np.isinf(rows).any())):
                bad = "NaN" if np.isnan(rows).any() else "values that are no log-probability"
                return (f"its {name} hold {bad}: transformers' logits were not finite where it "
                        "was recorded (the weights or transformers' model, not a spec, are at "
                        "fault), and no spec can be judged by it; record it again from finite "
                        "logits")
        return None

    def out_of(self, vocab_size: int) -> None:
        """Refuse a golden whose ids a vocabulary of ``vocab_size`` does not hold.

        Raises:
            GoldenError: naming the largest id.
        """
        top = max(int(self.top_ids.max()), int(self.tokens.max()))
        if top >= vocab_size:
            raise GoldenError(f"the golden holds token id {top}, past this model's vocabulary "
                              f"of {vocab_size}: a golden of another model")

    @property
    def steps(self) -> int:
        return int(self.top_ids.shape[0])

    @property
    def has_float64(self) -> bool:
        """Whether transformers' float64 rows are held (``top_logprobs64``, ``tail64``)."""
        return self.top_logprobs64 is not None

    def with_float64(self, logits: np.ndarray, meta: dict) -> "Golden":
        """This golden with transformers' float64 rows added from its full logits ``(steps,
        vocab)`` on this golden's tokens (row i after ``history(i)``), at this golden's
        ``top_ids``; every float32 array is kept as it is. ``meta`` joins the golden's."""
        rows = np.stack([log_softmax(r) for r in np.asarray(logits, np.float64)])
        if rows.shape[0] != self.steps:
            raise ValueError(f"{rows.shape[0]} float64 rows for a golden of {self.steps} steps")
        top = np.take_along_axis(rows, self.top_ids.astype(np.int64), axis=1)
        rest = 1.0 - np.exp(top).sum(axis=1)
        tail = np.log(np.clip(rest, 1e-300, None))
        # Where the top ids are the whole vocabulary nothing is left: what 1 - sum leaves
        # is rounding, and as a bucket it would weigh in at 1e-13, far above float64's KL.
        tail[(rest <= 1e-15) | (top.shape[1] == rows.shape[1])] = -np.inf
        return dataclasses.replace(self, top_logprobs64=top, tail64=tail,
                                   meta={**self.meta, **meta})

    def first(self, steps: int) -> "Golden":
        """This golden cut to its first ``steps`` rows and the tokens they follow.

        Raises:
            ValueError: ``steps`` not within 1..``self.steps``.
        """
        if not 1 <= steps <= self.steps:
            raise ValueError(f"{steps} steps of a golden of {self.steps}")
        rows = slice(0, steps)
        meta = {**self.meta, "steps": steps}
        f64 = self.meta.get("float64") or {}
        if steps < self.steps and isinstance(f64.get("floor"), dict) and "max" in f64["floor"]:
            # A floor measured over every step: a part's KL mean may exceed the whole's,
            # never its max, so the cut golden's floor mean is the whole's max.
            meta["float64"] = {**f64, "floor": {**f64["floor"], "mean": f64["floor"]["max"]}}
        held = self.prompt_len + steps - 1
        routing = None if self.routing is None else [(c[:held], l[:held]) for c, l in self.routing]
        return dataclasses.replace(
            self, routing=routing,
            tokens=self.tokens[: self.prompt_len + steps - 1], top_ids=self.top_ids[rows],
            top_logprobs=self.top_logprobs[rows], tail=self.tail[rows],
            top_logprobs64=None if self.top_logprobs64 is None else self.top_logprobs64[rows],
            tail64=None if self.tail64 is None else self.tail64[rows], meta=meta)

    def history(self, step: int) -> np.ndarray:
        return self.tokens[: self.prompt_len + step]

    @classmethod
    def from_logits(cls, fp: str, tokens, prompt_len: int, logits: np.ndarray, meta: dict,
                    k: int = TOP_K) -> "Golden":
        """From the reference's full logits ``(steps, vocab)``."""
        rows = [log_softmax(r) for r in np.asarray(logits)]
        k = min(k, rows[0].size)
        ids = np.stack([np.argsort(-r, kind="stable")[:k] for r in rows]).astype(np.int32)
        top = np.stack([r[i] for r, i in zip(rows, ids)])
        rest = 1.0 - np.exp(top).sum(axis=1)
        tail = np.log(np.clip(rest, 1e-300, None))
        tail[rest <= 1e-12] = -np.inf
        return cls(fp, np.asarray(tokens, np.int32), int(prompt_len), ids,
                   top.astype(np.float32), tail, meta)

    def divergence(self, step: int, logits: np.ndarray) -> tuple[float, bool]:
        """KL(reference || ours) at ``step`` over the top tokens and the tail bucket, and
        whether both rank the same token first."""
        return _divergence(self.top_ids[step], self.top_logprobs[step], self.tail[step], logits)

    def gap(self, step: int, logits: np.ndarray) -> float | None:
        """How far (nats) the golden's log-probability of ``logits``' first choice lies below
        its own first at ``step`` (0.0 where they agree); None where that token is not among
        the golden's top ids (it then lies below all of them)."""
        ours = int(np.argmax(logits))
        hit = np.flatnonzero(self.top_ids[step] == ours)
        if not hit.size:
            return None
        lp = np.asarray(self.top_logprobs[step], np.float64)
        return float(lp[0] - lp[hit[0]])

    def divergence64(self, step: int, logits: np.ndarray) -> tuple[float, float]:
        """KL(transformers' float64 || ours) at ``step`` over the top tokens and the tail
        bucket, and the largest |log-probability difference| over the top tokens; for
        ``logits`` ``(vocab,)`` of a float64 run.

        Raises:
            GoldenError: the golden holds no float64 rows.
        """
        if not self.has_float64:
            raise GoldenError("this golden holds no float64 rows: re-record it with "
                              "--record-golden")
        ids = self.top_ids[step]
        kl, _ = _divergence(ids, self.top_logprobs64[step], self.tail64[step], logits)
        ours = log_softmax(logits)
        return kl, float(np.abs(ours[ids] - self.top_logprobs64[step]).max())

    # -- files -----------------------------------------------------------------------------
    def write(self, path: str | Path, replace: bool = False) -> None:
        """Write to ``path`` whole, never over a golden of other inputs unless ``replace``
        (``write_npz``: a temporary name, then renamed under the folder's lock).

        Raises:
            GoldenTaken, GoldenError: as ``write_npz``.
        """
        more = {} if self.top_logprobs64 is None else {
            "top_logprobs64": np.asarray(self.top_logprobs64, np.float64),
            "tail64": np.asarray(self.tail64, np.float64)}
        for j, (chosen, logits) in enumerate(self.routing or ()):
            more[f"routing.{j}.experts"] = np.asarray(chosen, np.int16)
            more[f"routing.{j}.logits"] = np.asarray(logits, np.float32)
        write_npz(path, dict(fingerprint=self.fingerprint, tokens=self.tokens,
                             prompt_len=self.prompt_len, top_ids=self.top_ids,
                             top_logprobs=self.top_logprobs, tail=self.tail,
                             meta=json.dumps(self.meta, sort_keys=True), **more),
                  self.fingerprint, replace=replace)

    @classmethod
    def read(cls, path: str | Path, expected: str | Inputs | None = None) -> "Golden":
        """The golden at ``path``; ``expected``: the inputs it must be recorded from (their
        fingerprint, or ``Inputs`` to say how other ones differ).

        Raises:
            GoldenError: no file (saying how to record one), a file that is no golden, or
                one recorded from other inputs than ``expected`` (``other_inputs``: another
                model's, or a stale one of this model).
        """
        path = Path(path)
        data = load_arrays(path)
        try:
            g = cls(str(data["fingerprint"]), data["tokens"], int(data["prompt_len"]),
                    data["top_ids"], data["top_logprobs"], data["tail"],
                    json.loads(str(data["meta"])),
                    *(data.get(k) for k in ("top_logprobs64", "tail64")))
            routers = sorted({int(k.split(".")[1]) for k in data if k.startswith("routing.")})
            if routers:
                g.routing = [(data[f"routing.{j}.experts"], data[f"routing.{j}.logits"])
                             for j in range(len(routers))]
        except KeyError as e:
            raise GoldenError(f"{path}: {NOT_A_GOLDEN}: it holds no {e.args[0]}") from None
        except (ValueError, TypeError) as e:
            raise GoldenError(f"{path}: {NOT_A_GOLDEN}: {e}") from None
        why = g._malformed()
        if why:
            raise GoldenError(f"{path}: not a golden ({why})")
        these = Inputs(expected) if isinstance(expected, str) else expected
        if these is not None and g.fingerprint != these.fingerprint:
            largest = max(int(g.top_ids.max()), int(g.tokens.max()))
            raise other_inputs(path, g.meta, g.fingerprint, these, largest)
        return g


def _divergence(ids: np.ndarray, logprobs: np.ndarray, tail: float, logits: np.ndarray
                ) -> tuple[float, bool]:
    """KL(p || ours) with p given at ``ids`` (``logprobs``) and as the ``tail`` bucket."""
    ours = log_softmax(logits)
    lp = np.asarray(logprobs, np.float64)
    kl = float(np.sum(np.exp(lp) * (lp - ours[ids])))
    if np.isfinite(tail):
        q_tail = max(1.0 - float(np.exp(ours[ids]).sum()), 1e-300)
        kl += float(np.exp(tail) * (tail - np.log(q_tail)))
    return max(kl, 0.0), int(np.argmax(ours)) == int(ids[0])


def kl_stats(results: list[tuple[float, bool]]) -> dict[str, float]:
    """Mean, p90 and max KL of (kl, top1) results, and the count of top-1 mismatches."""
    kl = np.array([k for k, _ in results], np.float64)
    return {"mean": float(kl.mean()), "p90": float(np.percentile(kl, 90)),
            "max": float(kl.max()), "top1_mismatches": int(sum(not t for _, t in results))}


def teacher_forced(golden: Golden, logits: Callable[[np.ndarray], np.ndarray]
                   ) -> list[tuple[float, bool]]:
    """KL and top-1 of ``logits(history)`` against the golden at each of its steps."""
    return [golden.divergence(i, logits(golden.history(i))) for i in range(golden.steps)]


def add_arrays(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Rewrite the golden at ``path`` with ``arrays`` added and its meta updated by ``meta``;
    every array it held is written back as it was read (a float32 array bit for bit).

    Raises:
        GoldenError: ``path`` is no ``.npz`` golden.
    """
    path = Path(path)
    data = load_arrays(path)
    old = json.loads(str(data["meta"])) if "meta" in data else {}
    data.update(arrays)
    data["meta"] = np.asarray(json.dumps({**old, **meta}, sort_keys=True))
    write_npz(path, data, str(data["fingerprint"]))
