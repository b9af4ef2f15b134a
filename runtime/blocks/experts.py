"""A mixture of experts in place of a layer's MLP (or beside it): its router, its routed
experts, and the shared experts every row runs through.

Semantics are transformers' sparse MoE blocks (Qwen2MoeSparseMoeBlock, DeepseekV3MoE,
MixtralSparseMoeBlock, GptOssMLP, Llama4TextMoe, Gemma4TextDecoderLayer's experts beside its
MLP), each behaviour an option (``RouterOptions``, ``ExpertsOptions``), never a family.

Param names follow transformers 5's modules: the router ``gate.weight`` ``(E, H)`` (its
``gate.bias``, ``gate.e_score_correction_bias``, ``gate.per_expert_scale`` where held); the
experts stacked as transformers 5 holds them (``ExpertsOptions.params``): ``fused``
``experts.gate_up_proj`` ``(E, 2I, H)`` and ``experts.down_proj`` ``(E, H, I)``; ``split``
``experts.gate_proj``, ``experts.up_proj`` ``(E, I, H)`` each; ``per_expert``
``experts.{e}.gate_proj.weight`` ``(I, H)``, ... one Linear per expert, as most checkpoints
store them. Whatever the names, the model holds one stacked array per product (the split
and per-expert params are views of its rows), filled in place as each tensor is read: a
checkpoint's experts are stacked at load one tensor at a time, never the whole model twice.

Not for: the router's and experts' arithmetic (``operators.router``, ``operators.experts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import logging

import numpy as np

from iron_spec.operators.experts import HeldStack
from iron_spec.operators.held import Blocks

from .. import holding
from ..graph import Handle, Recorder
from ..module import Module, Param
from .mlp import MLP, MLPOptions
from .norms import Norm, NormOptions
from .projections import Linear

PARAMS = ("fused", "split", "per_expert")
#: The forms a stack is held in as a file stores it (``weights="stored"``): a safetensors
#: file's bfloat16 or float16 (its bits: the values were read widened, exactly). A mixture's
#: GGUF file no spec reads yet; float32 files stay float32.
STORED_FORMS = ("BF16", "F16")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterOptions:
    """The router (``operators.router``'s attributes, and the params it reads).

    ``top_k``: experts a row runs. ``score``, ``select``, ``weights``, ``groups``,
    ``group_score``, ``normalize``, ``norm_eps``, ``norm_min``, ``norm_p``, ``scale``,
    ``sparsemixer``: the operator's. ``bias``: the router's linear holds a bias
    (``gate.bias``, GptOssTopKRouter's). ``selection_bias``: ``gate.e_score_correction_bias``
    ``(E,)`` added to the selection values alone (DeepseekV3TopkRouter); stored as one row
    ``(1, E)`` where ``selection_bias_row`` (Ernie4_5_MoeStatics'). ``expert_scale``:
    ``gate.per_expert_scale`` ``(E,)`` times each chosen weight (Gemma4TextRouter).
    ``input_norm``: the router reads its input RMS-normed without weight (eps ``eps``), times
    ``gate.input_scale`` ``(H,)`` and times ``input_scale`` (Gemma4TextRouter's ``norm``,
    ``scale`` and ``hidden_size ** -0.5``)."""

    top_k: int
    score: str = "softmax"
    select: str = "scores"
    weights: str = "scores"
    groups: tuple[int, int] | None = None
    group_score: str = "top2"
    normalize: str | None = None
    norm_eps: float = 0.0
    norm_min: float = 0.0
    norm_p: float = 1.0
    scale: float = 1.0
    sparsemixer: float | None = None
    bias: bool = False
    selection_bias: bool = False
    expert_scale: bool = False
    input_norm: bool = False
    input_scale: float = 1.0
    eps: float = 1e-6
    selection_bias_row: bool = False

    def attrs(self) -> dict:
        """The router operator's attributes."""
        return dict(top_k=self.top_k, score=self.score, select=self.select,
                    weights=self.weights, groups=self.groups, group_score=self.group_score,
                    normalize=self.normalize, norm_eps=self.norm_eps, norm_min=self.norm_min,
                    norm_p=self.norm_p, scale=self.scale, sparsemixer=self.sparsemixer)


@dataclass(frozen=True)
class ExpertsOptions:
    """A mixture of experts in a layer.

    ``count`` experts, each an MLP of ``kind`` (``gated``: ``down(act(gate) * up)``;
    ``plain``: ``down(act(up))``) ``intermediate_size`` wide with ``act``, biases where
    ``bias`` (``gate_up_proj_bias``, ``down_proj_bias``: GptOssExperts'); a gated expert's
    first product ``gate_up`` ``halves`` or ``interleaved``; ``limit``, ``alpha``,
    ``up_offset``: GptOssExperts' clamped SwiGLU (``operators.experts``). ``weight_input``:
    a slot's weight times its input, not its output (Llama4TextMoe). ``out_norm``: each
    expert's output RMS-normed times its own row of ``experts.post_expert_norm.weight``
    ``(E, H)`` (ErgoExpertNorm, eps the layer norm's).

    ``params``: how the model names the experts' weights (module docstring); ``flat``: each
    stacked weight stored as ``(E * rows, cols)`` (DbrxExpertGLU's ``w1``, ``v1``, ``w2``).

    ``shared_size``: the shared experts' width (0: none), an MLP of ``shared`` options named
    ``shared_experts`` (DeepseekV3MoE; Qwen2MoeSparseMoeBlock's ``shared_expert`` renamed);
    ``shared_gate``: its output times ``sigmoid(shared_expert_gate(x))`` ``(1, H)``
    (Qwen2MoeSparseMoeBlock); ``shared_norm``: its output normed by
    ``shared_experts.norm`` (ErgoSharedExpert, the layer's norm kind). ``routed_scale``: the
    routed experts' sum times it before the shared output is added. ``output_bias``: a
    ``bias`` ``(H,)`` added to the block's output (JetMoeMoE).
    """

    count: int
    intermediate_size: int
    router: RouterOptions
    kind: str = "gated"
    act: str = "silu"
    bias: bool = False
    gate_up: str = "halves"
    limit: float | None = None
    alpha: float | None = None
    up_offset: float = 0.0
    weight_input: bool = False
    out_norm: bool = False
    params: str = "per_expert"
    flat: bool = False
    shared_size: int = 0
    shared: MLPOptions | None = None
    shared_gate: bool = False
    shared_norm: bool = False
    routed_scale: float = 1.0
    output_bias: bool = False
    beside: bool = False

    def attrs(self, eps: float) -> dict:
        """The experts operator's attributes (``eps``: the output norm's)."""
        return dict(kind=self.kind, act=self.act, gate_up=self.gate_up, limit=self.limit,
                    alpha=self.alpha, up_offset=self.up_offset,
                    weight_input=self.weight_input, norm_eps=eps)


class Router(Module):
    """The router's params (``RouterOptions``) and its step: ``(n, 2, k)`` routing."""

    def __init__(self, hidden_size: int, count: int, o: RouterOptions):
        self.weight = Param(count, hidden_size)
        self.bias = Param(count) if o.bias else None
        self.e_score_correction_bias = Param(count) if o.selection_bias else None
        if o.selection_bias and o.selection_bias_row:
            self.e_score_correction_bias.reshaped = (1, count)
        self.per_expert_scale = Param(count, gain=True) if o.expert_scale else None
        if o.input_norm:
            self.input_scale = Param(hidden_size, gain=True)
            self.ones = np.ones(hidden_size, np.float32)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        o = self.options
        if o.input_norm:
            ones = rec.hold("const", self.where("ones"), self.ones)
            x = rec.step("rms_norm", x, ones, where=self.where("norm"), eps=o.eps,
                         plus_one=False)
            scale = rec.hold("param", self.where("input_scale"), self.input_scale.array)
            x = rec.step("mul", x, scale, where=self.where("input_scale"))
            if o.input_scale != 1.0:
                x = rec.step("mul", x, where=self.where("input_scale"), scale=o.input_scale)
        held = [None if p is None else rec.hold("param", self.where(n), p.array)
                for n, p in (("weight", self.weight), ("bias", self.bias),
                             ("e_score_correction_bias", self.e_score_correction_bias),
                             ("per_expert_scale", self.per_expert_scale))]
        return rec.step("router", x, *held, where=self.path, **o.attrs())


class ExpertLinear(Module):
    """One expert's projection, ``weight`` (and ``bias``) views of rows of the stacked
    arrays (``Experts``): a checkpoint's per-expert tensor fills its expert's rows."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None):
        self.weight = Param(*weight.shape)
        self.weight.array = weight
        self.bias = None
        if bias is not None:
            self.bias = Param(*bias.shape)
            self.bias.array = bias


class Expert(Module):
    """One expert's projections as a checkpoint names them per expert: ``gate_proj``,
    ``up_proj`` and ``down_proj`` (a plain expert: ``up_proj``, ``down_proj``)."""

    def __init__(self, gate_up: np.ndarray, down: np.ndarray, gate_up_bias, down_bias,
                 gated: bool, gate_up_layout: str):
        I = gate_up.shape[0] // 2 if gated else gate_up.shape[0]
        pick = (slice(0, None, 2), slice(1, None, 2)) if gate_up_layout == "interleaved" \
            else (slice(0, I), slice(I, 2 * I))
        if gated:
            self.gate_proj = ExpertLinear(gate_up[pick[0]],
                                          None if gate_up_bias is None else gate_up_bias[pick[0]])
            self.up_proj = ExpertLinear(gate_up[pick[1]],
                                        None if gate_up_bias is None else gate_up_bias[pick[1]])
        else:
            self.up_proj = ExpertLinear(gate_up, gate_up_bias)
        self.down_proj = ExpertLinear(down, down_bias)


class Experts(Module):
    """The routed experts' weights, stacked (module docstring), and their step."""

    def __init__(self, hidden_size: int, o: ExpertsOptions):
        if o.params not in PARAMS:
            raise ValueError(f"experts params {o.params!r} is not one of {', '.join(PARAMS)}")
        E, I, H = o.count, o.intermediate_size, hidden_size
        gated = o.kind == "gated"
        R = 2 * I if gated else I
        self.w_in = np.empty((E, R, H), np.float32)
        self.w_down = np.empty((E, H, I), np.float32)
        self.b_in = np.empty((E, R), np.float32) if o.bias else None
        self.b_down = np.empty((E, H), np.float32) if o.bias else None
        first = "gate_up_proj" if gated else "up_proj"
        self.each: list[Expert] = []
        if o.params == "per_expert":
            self.each = [Expert(self.w_in[e], self.w_down[e],
                                   None if self.b_in is None else self.b_in[e],
                                   None if self.b_down is None else self.b_down[e],
                                   gated, o.gate_up) for e in range(E)]
        elif o.params == "fused":
            self._view(first, self.w_in)
            self._view("down_proj", self.w_down)
            if o.bias:
                self._view(first + "_bias", self.b_in)
                self._view("down_proj_bias", self.b_down)
        else:  # split: gate and up stacked apart, views of the halves
            if gated:
                self._view("gate_proj", self.w_in[:, :I] if o.gate_up == "halves" else self.w_in[:, 0::2])
                self._view("up_proj", self.w_in[:, I:] if o.gate_up == "halves" else self.w_in[:, 1::2])
            else:
                self._view("up_proj", self.w_in)
            self._view("down_proj", self.w_down)
            if o.bias:
                raise ValueError("experts params split hold no biases (fused or per_expert do)")
        if o.flat:
            if o.params == "per_expert":
                raise ValueError("experts stored flat are stacks: params fused or split")
            for name in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
                p = getattr(self, name, None)
                if isinstance(p, Param):
                    p.flat = True
        if o.out_norm:
            self.post_expert_norm = Module()
            self.post_expert_norm.weight = Param(E, H, gain=True)
        self.options = o

    # -- held as stored ---------------------------------------------------------------------
    def stack_params(self) -> list[Param]:
        """The params that are views of the stacks (every expert's matrices), not the
        biases or norms."""
        o = self.options
        if o.params == "per_expert":
            return [lin.weight for e in self.each
                    for lin in (getattr(e, "gate_proj", None), e.up_proj, e.down_proj) if lin]
        return [p for n in ("gate_proj", "up_proj", "gate_up_proj", "down_proj")
                if isinstance(p := getattr(self, n, None), Param)]

    def hold_when_filled(self, weights: str) -> None:
        """Hold the stacks as ``weights`` says (``runtime.holding.WEIGHTS``) as soon as a
        checkpoint's load has filled every one of their tensors (``Param.filled``): one
        layer's experts in float32 at a time, never the model's."""
        form = holding.choice(weights)
        if form == "F32" or self.options.params == "split":
            return
        waiting = {id(p) for p in self.stack_params()}
        seen: list[str] = []

        def filled(param, checkpoint, source):
            t = checkpoint.tensors[source]
            seen.append(getattr(t, "stored", None) or t.dtype)
            waiting.discard(id(param))
            if not waiting:
                for p in self.stack_params():  # no cycle left from the params to the module
                    vars(p).pop("filled", None)
                self.hold(form or _stored_form(seen, self.where()))

        for p in self.stack_params():
            p.filled = filled

    def held_as_stored(self, stored: list[str]) -> str:
        """The form these stacks are held in under ``weights="stored"`` whose tensors a file
        stores as ``stored`` (``stacks_form``; F32 for split params, which stay float32
        views): what ``hold_when_filled`` holds, said from the headers alone (``iron-spec
        show``)."""
        return "F32" if self.options.params == "split" else stacks_form(stored)

    def hold(self, form: str) -> None:
        """The stacks (float32, filled) held in ``form`` (``operators.held``'s names), each
        ``HeldStack`` of ``(E * rows, cols)`` rows, converted a piece at a time
        (``holding.convert``); each expert's params become row views of it (a held form,
        as a projection's), so the float32 stacks are freed. Nothing where ``form`` is
        ``F32``, the stacks are held already, or their params are split views (DBRX's:
        gate and up halves of one stack, kept float32).

        Raises:
            ValueError: rows that are not whole blocks of ``form`` (naming the stack).
        """
        o = self.options
        if form == "F32" or isinstance(self.w_in, HeldStack) or o.params == "split":
            return
        E, R, H = self.w_in.shape
        Ho, I = self.w_down.shape[1:]
        w_in = HeldStack(holding.convert(self.w_in.reshape(E * R, H), form, self.where("w_in")),
                         E)
        w_down = HeldStack(holding.convert(self.w_down.reshape(E * Ho, I), form,
                                           self.where("w_down")), E)
        if o.params == "fused":
            getattr(self, "gate_up_proj" if o.kind == "gated" else "up_proj").array = w_in
            self.down_proj.array = w_down
        else:
            I_ = R // 2 if o.kind == "gated" else R
            for e, expert in enumerate(self.each):
                at = e * R
                if o.kind == "gated" and o.gate_up == "interleaved":
                    gate, up = _rows(w_in.matrix, at, at + R, 2), _rows(w_in.matrix, at + 1, at + R, 2)
                elif o.kind == "gated":
                    gate, up = _rows(w_in.matrix, at, at + I_), _rows(w_in.matrix, at + I_, at + R)
                else:
                    gate, up = None, _rows(w_in.matrix, at, at + R)
                if gate is not None:
                    expert.gate_proj.weight.array = gate
                expert.up_proj.weight.array = up
                expert.down_proj.weight.array = _rows(w_down.matrix, e * Ho, (e + 1) * Ho)
        self.w_in, self.w_down = w_in, w_down

    def children(self):
        """The per-expert modules as ``0``, ``1``, ...: ``mlp.experts.3.gate_proj``, as a
        checkpoint names them (the module's own children besides)."""
        for i, expert in enumerate(self.each):
            yield str(i), expert
        for name, child in super().children():
            if name.split(".")[0] != "each":
                yield name, child

    def _view(self, name: str, array: np.ndarray) -> None:
        p = Param(*array.shape)
        p.array = array
        setattr(self, name, p)

    def __call__(self, rec: Recorder, x: Handle, routing: Handle, eps: float) -> Handle:
        o = self.options
        w_in = rec.hold("param", self.where("w_in"), self.w_in)
        w_down = rec.hold("param", self.where("w_down"), self.w_down)
        b_in = None if self.b_in is None else rec.hold("param", self.where("b_in"), self.b_in)
        b_down = None if self.b_down is None else rec.hold("param", self.where("b_down"),
                                                            self.b_down)
        norm = None if not o.out_norm else rec.hold(
            "param", self.where("post_expert_norm.weight"), self.post_expert_norm.weight.array)
        return rec.step("experts", x, routing, w_in, w_down, b_in, b_down, norm,
                        where=self.path, **o.attrs(eps))


def _rows(matrix, lo: int, hi: int, step: int = 1):
    """Rows ``lo:hi:step`` of a held matrix, a view in its form."""
    if isinstance(matrix, Blocks):
        data = matrix.data[lo:hi:step]
        return Blocks(matrix.form, data, (len(data), matrix.shape[1]), matrix.dequantize)
    return matrix[lo:hi:step]


def stacks_form(stored: list[str]) -> str:
    """The form a mixture's stacks are held in under ``weights="stored"`` whose tensors a
    file stores as ``stored`` (each a ``STORED_FORMS`` name, a dtype or a GGUF block form):
    theirs where every one is stored so and it is one of ``STORED_FORMS``, else F32."""
    forms = set(stored)
    return forms.pop() if len(forms) == 1 and forms <= set(STORED_FORMS) else "F32"


def _stored_form(stored: list[str], where: str) -> str:
    """The form stacks are held in whose tensors a file stores as ``stored``: theirs where
    every one is stored so and it is one of ``STORED_FORMS``, else float32 (said)."""
    form = stacks_form(stored)
    if form == "F32" and set(stored) - {"F32", "F64"}:
        log.info("%s: experts stored as %s are held float32 (held as stored: %s)", where,
                 ", ".join(sorted(set(stored))), ", ".join(STORED_FORMS))
    return form


def hold_experts(model: Module, weights: str, when_filled: bool) -> None:
    """Every mixture's routed experts of ``model`` held as ``weights`` says: as each
    layer's tensors are filled (``when_filled``: before a checkpoint's load), or now (drawn
    weights, filled float32: ``stored`` keeps them so)."""
    todo = [model]
    while todo:
        m = todo.pop()
        if isinstance(m, Experts):
            if when_filled:
                m.hold_when_filled(weights)
            elif holding.choice(weights) is not None:
                m.hold(holding.choice(weights))
        todo += [child for _, child in m.children()]


def expert_stacks(model: Module) -> list:
    """Every mixture's expert stacks (``w_in``, ``w_down``) of ``model``: float32 arrays or
    ``HeldStack``s."""
    out, todo = [], [model]
    while todo:
        m = todo.pop()
        if isinstance(m, Experts):
            out += [m.w_in, m.w_down]
        todo += [child for _, child in m.children()]
    return out


class MoE(Module):
    """A layer's mixture of experts: ``gate`` (``Router``), ``experts`` (``Experts``), and
    where the options hold them ``shared_experts`` (an ``MLP``), ``shared_expert_gate``
    and ``bias``. ``x`` the MLP's input (the normed residual), ``(n, H)``; ``router_input``
    what the router reads where it differs (Gemma 4's: the residual itself)."""

    def __init__(self, hidden_size: int, o: ExpertsOptions, norm: NormOptions):
        self.gate = Router(hidden_size, o.count, o.router)
        self.experts = Experts(hidden_size, o)
        if o.shared_size:
            shared = o.shared or MLPOptions(o.shared_size)
            self.shared_experts = MLP(hidden_size, shared)
            if o.shared_norm:
                self.shared_experts.norm = Norm(hidden_size, norm)
            if o.shared_gate:
                self.shared_expert_gate = Linear(hidden_size, 1)
        if o.output_bias:
            self.bias = Param(hidden_size)
        self.options, self.eps = o, norm.eps

    def __call__(self, rec: Recorder, x: Handle, router_input: Handle | None = None) -> Handle:
        o = self.options
        routing = self.gate(rec, x if router_input is None else router_input)
        y = self.experts(rec, x, routing, self.eps)
        if o.routed_scale != 1.0:
            y = rec.step("mul", y, where=self.where("experts"), scale=o.routed_scale)
        if o.shared_size:
            s = self.shared_experts(rec, x)
            if o.shared_norm:
                s = self.shared_experts.norm(rec, s)
            if o.shared_gate:
                g = rec.step("activation", self.shared_expert_gate(rec, x),
                             where=self.where("shared_expert_gate"), act="sigmoid")
                s = rec.step("mul", s, g, where=self.where("shared_expert_gate"))
            y = rec.step("add", y, s, where=self.path)
        if o.output_bias:
            b = rec.hold("param", self.where("bias"), self.bias.array)
            y = rec.step("add", y, b, where=self.where("bias"))
        return y
