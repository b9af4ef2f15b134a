"""A mixture of experts' experts: each row through the experts its router chose, weighted and
summed, as transformers' ``...Experts.forward`` (the eager loop over the experts hit).

Each expert is a small MLP whose weights are one slice of stacked arrays, transformers 5's
layout: ``w_in`` ``(E, R, H)`` (a gated expert's gate and up rows, ``R = 2I``, as
``gate_up_proj``; a plain or linear expert's ``R = I`` rows) and ``w_down`` ``(E, H_out, I)``
(``down_proj``), optional biases ``b_in`` ``(E, R)`` and ``b_down`` ``(E, H_out)``
(GptOssExperts'). ``kind``:

- ``gated``: ``down(act(gate) * up)``; ``gate_up`` ``halves`` (gate rows then up rows,
  ``chunk(2)``) or ``interleaved`` (gate at even rows, up at odd: GptOssExperts'
  ``gate_up[..., ::2]``). With ``limit``: the gate clamped above at ``limit``, the up half to
  ``[-limit, limit]``; with ``alpha``: ``gate * sigmoid(alpha * gate)`` in place of ``act``;
  ``up_offset`` added to the up half (GptOssExperts._apply_gate's ``(up + 1) * glu``).
- ``plain``: ``down(act(up))`` (ErgoExpertProjections, relu2).
- ``linear``: ``w_in``'s product alone, ``R`` the output width (JetMoeParallelExperts: the
  query and output projections of its mixture of attention heads).

``routing`` is the router's output ``(n, 2, k)`` (``operators.router``): each row's experts
(ascending) and weights. ``x`` is ``(n, H)`` (every slot reads the row) or ``(n, k, H)``
(slot ``j`` reads its own input: JetMoeMoA's ``reduce``). ``slots``: ``sum`` gives ``(n,
H_out)``, each slot's output times its weight, added in the slots' order (ascending experts,
as ``index_add_`` over the experts hit adds them); ``each`` gives ``(n, k, H_out)``, each
slot's output unweighted (JetMoeMoA's ``map``). ``weight_input``: a slot's weight multiplies
its input instead of its output (Llama4TextMoe's ``routed_in * router_scores``).
``out_norm`` ``(E, H_out)``: each slot's output RMS-normed (``norm_eps``) times its expert's
row before it is weighted (ErgoExpertNorm's ``post_expert_norm``).

The kernel reads only the chosen experts' weights: a decode step's row runs its ``k``
experts' products (``operators._cpu``'s ``experts``, on the decode pool, in any weight form
the GEMV reads); a prompt chunk's rows are grouped by expert, one product per expert hit.

Not for: choosing the experts (``router``).
"""

from __future__ import annotations

import numpy as np

from . import formats, held, native
from .activation import act_kernel, act_magnitude, act_reference, act_scratch, check_params
from .base import EPS32, Operator, Tolerance, as64

KINDS = ("gated", "plain", "linear")
GATE_UP = ("halves", "interleaved")
SLOTS = ("sum", "each")


def _halves(h: np.ndarray, gate_up: str) -> tuple[np.ndarray, np.ndarray]:
    if gate_up == "interleaved":
        return h[..., 0::2], h[..., 1::2]
    m = h.shape[-1] // 2
    return h[..., :m], h[..., m:]


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


class HeldStack:
    """A stack of ``E`` expert matrices ``(E, rows, cols)`` held as one matrix ``(E * rows,
    cols)`` in a held form (``operators.held``: float32, bfloat16, float16 or GGML blocks),
    expert ``e`` its rows ``e * rows .. (e + 1) * rows``: what the native step reads as it is
    (``raw``), and what the numpy kernel and the reference widen an expert at a time
    (``stack[e]``: float32 ``(rows, cols)``).

    Raises:
        ValueError: ``matrix`` does not hold ``E`` experts' rows.
    """

    ndim = 3

    def __init__(self, matrix, experts: int):
        if len(matrix) % experts:
            raise ValueError(f"a stack of {experts} experts from {len(matrix)} rows")
        self.matrix, self.shape = matrix, (experts, len(matrix) // experts, matrix.shape[1])
        self.form = held.form(matrix)
        self.dtype = matrix.dtype

    @property
    def nbytes(self) -> int:
        return held.nbytes(self.matrix)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, e) -> np.ndarray:
        e = int(e)
        if not 0 <= e < self.shape[0]:
            raise IndexError(f"expert {e} of {self.shape[0]}")
        rows = self.shape[1]
        return held.widen(self.matrix, e * rows, (e + 1) * rows)

    def raw(self) -> np.ndarray:
        """The bytes the kernels read (``held.raw``), ``(E * rows, ...)``."""
        return held.raw(self.matrix)

    def __repr__(self) -> str:
        return f"HeldStack({self.form}, {self.shape})"


class Experts(Operator):
    """``x``, ``routing``, ``w_in``, ``w_down`` (None for ``linear``), ``b_in``, ``b_down``,
    ``out_norm`` (each None where absent); attributes ``kind``, ``act``, ``gate_up``,
    ``limit``, ``alpha``, ``up_offset``, ``slots``, ``weight_input``, ``norm_eps`` (module
    docstring). Output ``(n, H_out)`` or, slots ``each``, ``(n, k, H_out)``.

    Raises:
        ValueError: an unknown kind, gate_up, slots or activation; shapes that do not meet;
            ``limit``/``alpha`` on an expert other than gated.
    """

    name = "experts"
    groups_rows = True  # the chunk's GEMM per expert hit

    def shape(self, x, routing, w_in, w_down=None, b_in=None, b_down=None, out_norm=None,
              kind="gated", act="silu", gate_up="halves", limit=None, alpha=None,
              up_offset=0.0, slots="sum", weight_input=False, norm_eps=1e-6):
        for what, v, allowed in (("kind", kind, KINDS), ("gate_up", gate_up, GATE_UP),
                                 ("slots", slots, SLOTS)):
            if v not in allowed:
                raise ValueError(f"experts: {what} {v!r} is not one of {', '.join(allowed)}")
        check_params(act, ())
        if len(routing) != 3 or routing[1] != 2:
            raise ValueError(f"experts: routing {routing} is not (n, 2, k)")
        n, _, k = routing
        if len(w_in) != 3:
            raise ValueError(f"experts: w_in {w_in} is not (experts, rows, hidden)")
        E, R, H = w_in
        if x not in ((n, H), (n, k, H)):
            raise ValueError(f"experts: x {x} is neither ({n}, {H}) nor ({n}, {k}, {H})")
        if kind == "gated" and R % 2:
            raise ValueError(f"experts: a gated expert's {R} rows are no gate and up halves")
        inner = R // 2 if kind == "gated" else R
        if kind == "linear":
            if w_down is not None:
                raise ValueError("experts: a linear expert is one product, no w_down")
            out = R
        else:
            if w_down is None or len(w_down) != 3 or w_down[0] != E or w_down[2] != inner:
                raise ValueError(f"experts: w_down {w_down} is not ({E}, out, {inner})")
            out = w_down[1]
        if (limit is not None or alpha is not None) and kind != "gated":
            raise ValueError("experts: limit and alpha clamp a gated expert's halves")
        for what, v, want in (("b_in", b_in, (E, R)), ("b_down", b_down, (E, out)),
                              ("out_norm", out_norm, (E, out))):
            if v is not None and tuple(v) != want:
                raise ValueError(f"experts: {what} {v} is not {want}")
        if b_down is not None and kind == "linear":
            raise ValueError("experts: a linear expert's bias is b_in")
        return (n, out) if slots == "sum" else (n, k, out)

    # -- one expert on its rows -------------------------------------------------------------
    @staticmethod
    def _hidden(h, kind, act, gate_up, limit, alpha, up_offset, activate):
        """The expert's hidden values from its first product ``h``: ``activate(v)`` is the
        activation in the dtype at hand (float64 reference, float32 kernel)."""
        if kind == "linear":
            return h
        if kind == "plain":
            return activate(h)
        g, u = _halves(h, gate_up)
        if limit is not None:
            g = np.minimum(g, limit)
            u = np.clip(u, -limit, limit)
        a = g * _sigmoid(g * alpha) if alpha is not None else activate(g)
        return a * (u + up_offset) if up_offset else a * u

    def _expert(self, xs, e, w_in, w_down, b_in, b_down, out_norm, attrs, activate, dtype,
                x8=None):
        """Expert ``e`` on rows ``xs`` ``(m, H)``: ``(m, H_out)``. ``x8``: None, or how the
        second product's kernel rounds the hidden values (``_hidden_rounding``)."""
        h = xs @ np.asarray(w_in[e], dtype).T
        if b_in is not None:
            h = h + np.asarray(b_in[e], dtype)
        hid = self._hidden(h, attrs["kind"], attrs["act"], attrs["gate_up"], attrs["limit"],
                           attrs["alpha"], attrs["up_offset"], activate)
        if x8 is not None and attrs["kind"] != "linear":
            hid = x8[0](np.asarray(hid, np.float32)).astype(dtype)
        if attrs["kind"] == "linear":
            y = hid
        else:
            y = hid @ np.asarray(w_down[e], dtype).T
            if b_down is not None:
                y = y + np.asarray(b_down[e], dtype)
        if out_norm is not None:
            ms = np.mean(y * y, axis=-1, keepdims=True)
            y = y / np.sqrt(ms + dtype(attrs["norm_eps"])) * np.asarray(out_norm[e], dtype)
        return y

    @staticmethod
    def _attrs(kind="gated", act="silu", gate_up="halves", limit=None, alpha=None,
               up_offset=0.0, slots="sum", weight_input=False, norm_eps=1e-6):
        return dict(kind=kind, act=act, gate_up=gate_up, limit=limit, alpha=alpha,
                    up_offset=up_offset, slots=slots, weight_input=weight_input,
                    norm_eps=norm_eps)

    def _run(self, out, x, routing, w_in, w_down, b_in, b_down, out_norm, attrs, activate,
             dtype, x8=None):
        """Every row through its chosen experts, grouped by expert: ``out`` filled."""
        idx = np.rint(routing[:, 0]).astype(np.int64)
        wts = np.asarray(routing[:, 1], dtype)
        n, k = idx.shape
        each = attrs["slots"] == "each"
        per_slot = x.ndim == 3
        out[...] = 0
        # Experts in ascending order: a row's slots are its experts ascending, so each row's
        # sum adds its slots in order, as transformers' loop over the experts hit does.
        for e in np.unique(idx):
            rows, slots = np.nonzero(idx == e)
            xs = x[rows, slots] if per_slot else x[rows]
            xs = np.asarray(xs, dtype)
            if attrs["weight_input"]:
                xs = xs * wts[rows, slots][:, None]
            y = self._expert(xs, e, w_in, w_down, b_in, b_down, out_norm, attrs, activate, dtype,
                             x8)
            if each:
                out[rows, slots] = y
            elif attrs["weight_input"]:
                out[rows] += y
            else:
                out[rows] += y * wts[rows, slots][:, None]

    def reference(self, x, routing, w_in, w_down=None, b_in=None, b_down=None, out_norm=None,
                  **attrs):
        a = self._attrs(**attrs)
        x = as64(x)
        shape = self.shape(x.shape, routing.shape, w_in.shape,
                           None if w_down is None else w_down.shape, **attrs)
        out = np.zeros(shape, np.float64)
        self._run(out, x, as64(routing), w_in, w_down, b_in, b_down, out_norm, a,
                  lambda v: act_reference(v, a["act"]), np.float64, _hidden_rounding(x, w_down))
        return out

    def reconcile(self, expected, got, inputs, attrs):
        """Where the second product's kernel rounds the hidden values (``_hidden_rounding``:
        8 bits a block), a value at a rounding midpoint rounds either way by the
        kernel's float32 and the reference's float64: each output may move by one rounding
        step of each 32-value block (its largest over 127) times the block's
        largest weight, the experts' weights applied; what ``got`` lies within that of
        ``expected`` is taken as it is."""
        x, routing, w_in, w_down = inputs[:4]
        rounding = _hidden_rounding(x, w_down)
        if rounding is None or np.ndim(x) != 2:
            return expected
        a = self._attrs(**attrs)
        slack = np.zeros(expected.shape, np.float64)
        idx = np.rint(as64(routing)[:, 0]).astype(np.int64)
        wts = np.abs(as64(routing)[:, 1])
        for r in range(idx.shape[0]):
            for e, wt in zip(idx[r], wts[r]):
                # weight_input: the weight scales the expert's input, not its output
                xin, wt = (as64(x[r:r + 1]) * wt, 1.0) if a["weight_input"] else \
                    (as64(x[r:r + 1]), wt)
                h = xin @ np.asarray(w_in[e], np.float64).T
                if inputs[4] is not None:
                    h = h + np.asarray(inputs[4][e], np.float64)
                hid = self._hidden(h, a["kind"], a["act"], a["gate_up"], a["limit"],
                                   a["alpha"], a["up_offset"],
                                   lambda v: act_reference(v, a["act"]))
                step = np.abs(hid).reshape(-1, 32).max(axis=1) * rounding[1]
                w = np.abs(np.asarray(w_down[e], np.float64))
                slack[r] += wt * (w.reshape(w.shape[0], -1, 32).max(axis=2) @ step)
        return expected + np.clip(got - expected, -slack, slack)

    def kernel(self, out, x, routing, w_in, w_down=None, b_in=None, b_down=None,
               out_norm=None, scratch=None, **attrs):
        a = self._attrs(**attrs)
        if not isinstance(w_in, HeldStack) and (
                w_in.dtype != np.float32 or (w_down is not None and w_down.dtype != np.float32)):
            w_in, w_down = self.widen_reduced(2, w_in), \
                None if w_down is None else self.widen_reduced(3, w_down)
        with np.errstate(over="ignore"):
            self._run(out, x, routing, w_in, w_down, b_in, b_down, out_norm, a,
                      lambda v: _act32(v, a["act"]), np.float32)

    def scratch(self, x, routing, w_in, w_down=None, *rest, **attrs):
        # The native step's: each slot's input, first product, hidden values and output.
        k, (E, R, H) = routing[2], w_in
        inner = w_down[2] if w_down is not None else R
        out = w_down[1] if w_down is not None else R
        return k * (H + R + inner + out)

    def lower(self, out, x, routing, w_in, w_down=None, b_in=None, b_down=None,
              out_norm=None, scratch=None, **attrs):
        """Rows through their routed experts as a native step (``_cpu_experts.h``'s
        ``experts_run``): one row (a decode step's) by its k experts' GEMVs, more (a prompt
        chunk's, ``rows`` bounded) by one GEMM per expert hit on its slice, as llama.cpp's
        ``mul_mat_id``; only the experts chosen are read, in the form the stacks are held in
        (a decode form's row groups, or a held form: ``HeldStack``). Linear experts and
        per-slot inputs or outputs stay numpy's."""
        a = self._attrs(**attrs)
        act = _NATIVE_ACTS.get(a["act"])
        if native.LIB is None or x.ndim != 2 or a["slots"] != "sum" \
                or a["kind"] == "linear" or (act is None and a["alpha"] is None):
            return None
        stacked = isinstance(w_in, HeldStack)
        if stacked != isinstance(w_down, HeldStack) or \
                (stacked and w_in.form != w_down.form):
            return None
        if stacked:
            # float32 rows are the decode form float32 (-1: read as an array of floats)
            code = -1 if w_in.form == "F32" else held.code(w_in.matrix)
            w_in_raw, w_down_raw = w_in.raw(), w_down.raw()
        else:
            if w_in.dtype != w_down.dtype or (x.shape[0] > 1 and w_in.dtype != np.float32):
                return None
            code, w_in_raw, w_down_raw = -1, w_in, w_down
        if not native.contiguous(out, x, routing, w_in_raw, w_down_raw, b_in, b_down, out_norm):
            return None
        E, R, H = w_in.shape[0], w_in.shape[1], x.shape[1]
        inner, Hout = (R // 2 if a["kind"] == "gated" else R), out.shape[1]
        flags = (int(a["gate_up"] == "interleaved") | int(a["weight_input"]) << 1
                 | int(a["limit"] is not None) << 2 | int(a["alpha"] is not None) << 3)
        ints = (E, routing.shape[2], R, H, inner, Hout, 0 if a["kind"] == "gated" else 1,
                act if act is not None else 0, flags, x.shape[0], code)
        floats = (a["limit"] or 0.0, a["alpha"] or 0.0, a["up_offset"], a["norm_eps"])
        return native.Step(native.OP_EXPERTS, (out, x, routing, w_in_raw, w_down_raw, scratch,
                                               b_in, b_down, out_norm), ints, floats, rows=9)

    # -- judging -------------------------------------------------------------------------
    def tolerance(self, x, routing, w_in, w_down=None, *rest, **attrs):
        # Two products (H terms, then I), an activation between.
        H, inner = w_in[2], (w_down[2] if w_down is not None else 1)
        return Tolerance(atol=1e-6, rtol=(max(4.0, H / 8) + max(4.0, inner / 8) + 32) * EPS32)

    def scale(self, reference, x, routing, w_in, w_down=None, b_in=None, b_down=None,
              out_norm=None, **attrs):
        """Each output's magnitude: the slots' products taken over absolute values, each
        step's terms kept (the first product's ``|x| |W|``, the activation's own terms)."""
        a = self._attrs(**attrs)
        ax = np.abs(as64(x))
        mag = np.zeros(reference.shape, np.float64)
        idx = np.rint(as64(routing)[:, 0]).astype(np.int64)
        wts = np.abs(as64(routing)[:, 1])
        per_slot = ax.ndim == 3
        for e in np.unique(idx):
            rows, slots = np.nonzero(idx == e)
            xs = ax[rows, slots] if per_slot else ax[rows]
            if a["weight_input"]:
                xs = xs * wts[rows, slots][:, None]
            xe = as64(x)[rows, slots] if per_slot else as64(x)[rows]
            if a["weight_input"]:
                xe = xe * as64(routing)[rows, 1, slots][:, None]
            w = as64(w_in[e])
            h = xe @ w.T + (0 if b_in is None else as64(b_in[e]))
            hm = xs @ np.abs(w).T + (0 if b_in is None else np.abs(as64(b_in[e])))
            if a["kind"] == "linear":
                y = hm
            else:
                if a["kind"] == "plain":
                    hid = np.abs(act_reference(h, a["act"])) + act_magnitude(h, a["act"]) + hm
                else:
                    g, u = _halves(h, a["gate_up"])
                    gm, um = _halves(hm, a["gate_up"])
                    ga = np.abs(g * _sigmoid(g * a["alpha"])) if a["alpha"] is not None \
                        else np.abs(act_reference(g, a["act"]))
                    hid = (ga + np.abs(g) + gm) * (np.abs(u) + abs(a["up_offset"]) + um)
                d = np.abs(as64(w_down[e]))
                y = hid @ d.T + (0 if b_down is None else np.abs(as64(b_down[e])))
            if out_norm is not None:
                y = np.abs(as64(out_norm[e])) * (1 + y / np.maximum(
                    np.sqrt(np.mean(y * y, axis=-1, keepdims=True)), 1e-30))
            if a["slots"] == "each":
                mag[rows, slots] = y
            elif a["weight_input"]:
                mag[rows] += y
            else:
                mag[rows] += y * wts[rows, slots][:, None]
        return mag + np.abs(reference)

    # -- weights in reduced precision ----------------------------------------------------
    def pack(self, index, array, **attrs):
        """A held stack (``HeldStack``) as it is: every kernel here reads it so (never a
        float32 copy); anything else as ``Operator.pack``."""
        if isinstance(array, HeldStack):
            return array
        return super().pack(index, array, **attrs)

    def pack_reduced(self, index, array, dtype, rows=None):
        """A decode step's expert weights (``w_in``, ``w_down``) in a reduced form, each
        expert's matrix grouped as a GEMV reads it (``formats.group_bfloat16``,
        ``formats.group_q8_0``), the experts one after another: uint16 ``(E, R, H)`` or uint8
        ``(E, R, H / 32 * 34)``. None for anything else (biases, norms, a prompt chunk's
        tiles: the chunk's products stay float32).

        Raises:
            ValueError: as ``Linear.pack_reduced``.
        """
        if index not in (2, 3) or isinstance(array, HeldStack) or array.ndim != 3 \
                or dtype == "bfloat16-tiles":
            return None
        if dtype == "bfloat16":
            bits, inexact = formats.bfloat16_exact(array)
            if inexact:
                raise ValueError(f"{inexact} of {bits.size} values do not hold exactly in "
                                 "bfloat16 (--decode-weights bfloat16-rounded rounds them)")
            return np.stack([formats.group_bfloat16(b) for b in bits])
        if dtype == "bfloat16-rounded":
            return np.stack([formats.group_bfloat16(formats.round_bfloat16(a)) for a in array])
        if dtype == "int8":
            return np.stack([formats.group_q8_0(formats.quantize_q8_0(a)) for a in array])
        return None

    def widen_reduced(self, index, packed, shape=None):
        """The float32 values each expert's reduced matrix stands for, ``(E, R, H)``."""
        if packed.dtype == np.uint16:
            return np.stack([formats.widen_bfloat16(formats.ungroup_bfloat16(p)) for p in packed])
        if packed.dtype == np.uint8:
            return np.stack([formats.widen_q8_0(formats.ungroup_q8_0(p)) for p in packed])
        return packed

    def reference_inputs(self, inputs, kernel_inputs):
        """On Q8_0 weights (a decode form's, or a held stack's block form) the GEMV meets x as
        int16 blocks (``formats.x16_values``, ``held.reference_x``): the kernel's own
        products, for the decode step's one row; a chunk's rows meet the GEMM, x as it is. The hidden
        values the second product reads are rounded so too on a held block stack: the
        reference rounds its own (``_expert``'s ``x8``) and ``reconcile`` allows a value at a
        rounding midpoint to round either way."""
        w, x = kernel_inputs[2], inputs[0]
        if isinstance(w, HeldStack):  # as a held projection's x (held.reference_x): one row
            # a decode step's GEMVs, more a chunk's GEMMs (an expert one row chose too)
            if x.ndim == 2 and w.form != "F32":
                return [held.reference_x(x, w.matrix)] + list(inputs[1:])
            return inputs
        if w.dtype == np.uint8 and x.ndim == 2 and x.shape[0] == 1:
            return [formats.x16_values(x)] + list(inputs[1:])
        return inputs


def _hidden_rounding(x, w_down):
    """How the second product's kernel meets the hidden values on a held stack, as
    ``held.reference_x`` says of a projection's x (by the call's rows: a decode step's one row
    or a chunk's GEMMs, whatever each expert's share): ``(round, step)``, ``round`` the values
    it multiplies (float64) and ``step`` one rounding step over a block's largest; None where
    it meets them as they are."""
    if not isinstance(w_down, HeldStack) or np.ndim(x) != 2:
        return None
    one = np.shape(x)[0] == 1
    if (one and held.is_block(w_down.matrix)) or (not one and w_down.form == "Q8_0"):
        return formats.x8_values, 1.0 / formats.X8_MAX
    return None  # bfloat16 stacks: the chunk's GEMM meets x as it is (held.RoundingX aside)


#: The activations the native step runs (_cpu_experts.h's expert_act).
_NATIVE_ACTS = {"silu": native.ACT_SILU, "swish": native.ACT_SILU,
                **{a: native.ACT_GELU_TANH for a in ("gelu_new", "gelu_pytorch_tanh",
                                                     "gelu_python_tanh", "gelu_accurate")},
                "gelu": native.ACT_GELU_ERF, "gelu_python": native.ACT_GELU_ERF,
                "relu": native.ACT_RELU, "quick_gelu": native.ACT_QUICK_GELU,
                "relu2": native.ACT_RELU2, "sigmoid": native.ACT_SIGMOID}


def _act32(v: np.ndarray, act: str) -> np.ndarray:
    """``act`` of float32 ``v`` by the activations' float32 kernels."""
    v = np.ascontiguousarray(v, np.float32)
    out = np.empty_like(v)
    scratch = np.empty(max(1, act_scratch(act) * v.size), np.float32)
    act_kernel(out, v, act, scratch)
    return out
