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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

TOP_K = 256


class GoldenError(ValueError):
    """A golden that is missing, malformed, or recorded from other config or weights."""


NOT_A_GOLDEN = "not a golden file (an .npz that iron-spec check --record-golden writes)"


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the golden file at ``path`` (a causal or an encoder golden), read with
    ``allow_pickle=False``.

    Raises:
        GoldenError: no file at ``path`` (saying how to record one), or a file that is no
            ``.npz`` of arrays or holds no ``fingerprint`` (``NOT_A_GOLDEN``, naming it).
    """
    path = Path(path)
    if not path.exists():
        raise GoldenError(f"{path} is missing: record it where torch and transformers are "
                          "installed (pip install -e '.[golden]'; iron-spec check ... "
                          "--record-golden)")
    try:
        f = np.load(path, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):  # a lone .npy array
            raise ValueError(f"{type(f).__name__}")
        with f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        # numpy's own words (its allow_pickle advice among them) are no help here.
        raise GoldenError(f"{path}: {NOT_A_GOLDEN}") from None
    if "fingerprint" not in data:
        raise GoldenError(f"{path}: {NOT_A_GOLDEN}: it holds no fingerprint")
    return data


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
    def write(self, path: str | Path) -> None:
        """Write to ``path`` whole: a temporary name, then renamed, so no reader sees half."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.stem}.{os.getpid()}.npz")
        more = {} if self.top_logprobs64 is None else {
            "top_logprobs64": np.asarray(self.top_logprobs64, np.float64),
            "tail64": np.asarray(self.tail64, np.float64)}
        for j, (chosen, logits) in enumerate(self.routing or ()):
            more[f"routing.{j}.experts"] = np.asarray(chosen, np.int16)
            more[f"routing.{j}.logits"] = np.asarray(logits, np.float32)
        np.savez_compressed(partial, fingerprint=self.fingerprint, tokens=self.tokens,
                            prompt_len=self.prompt_len, top_ids=self.top_ids,
                            top_logprobs=self.top_logprobs, tail=self.tail,
                            meta=json.dumps(self.meta, sort_keys=True), **more)
        os.replace(partial, path)

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
    partial = path.with_name(f".{path.stem}.{os.getpid()}.npz")
    np.savez_compressed(partial, **data)
    os.replace(partial, path)
