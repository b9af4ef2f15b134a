"""The layers a decoder stacks, composed of ``blocks``: attention and MLP, each with its norms
placed before, after or around it, and its residual add.

Not for: the blocks themselves (``blocks``) or the model around the layers (``causal``).
"""

from __future__ import annotations

from .blocks import MLP, Attention, LayerOptions, Linear, Norm
from .graph import Handle, Recorder
from .latent import LatentAttention
from .module import Module, Param

PLACEMENTS = ("pre", "post", "sandwich", "post_residual")
KINDS = ("decoder", "sandwich", "ple")


class DecoderLayer(Module):
    """Attention then MLP, each added to the residual, norms placed by ``o.placement``.

    Param names are transformers': ``pre`` has ``input_layernorm`` and (before the MLP)
    ``post_attention_layernorm`` (LlamaDecoderLayer); ``post`` has ``post_attention_layernorm``
    and ``post_feedforward_layernorm`` on the blocks' outputs (Olmo2DecoderLayer);
    ``sandwich`` has all four of ``input_layernorm``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (Gemma2DecoderLayer);
    ``post_residual`` norms each residual sum, ``n = post_attention_layernorm(x + attn(x))``
    then ``post_feedforward_layernorm(n + mlp(n))``, as OpenAIGPT's ``Block`` (``ln_1``,
    ``ln_2``) and BertLayer.

    Kind ``ple`` is ``sandwich`` followed by the per-layer input gated in
    (``per_layer_input_gate``, ``per_layer_projection``, ``post_per_layer_input_norm``, where
    ``o.per_layer_input`` is set) and the output times ``layer_scalar`` ``(1,)``, as
    Gemma4TextDecoderLayer.

    ``parallel`` (kind ``decoder``, placement ``pre``): ``x + (attn(input_layernorm(x)) +
    mlp(n(x)))``, ``n`` the same ``input_layernorm`` where ``shared_norm`` (PhiDecoderLayer,
    GPTJBlock), else ``post_attention_layernorm`` (GPTNeoXLayer with
    ``use_parallel_residual``). transformers sums in other orders (GPT-NeoX ``m + a + x``,
    Cohere ``x + a + m``): float32 rounding of one add apart.

    ``attention_norm`` false (``pre``, not parallel): no ``input_layernorm``, the attention
    reads ``x`` as it is (ModernBertDecoderLayer's ``attn_norm``, an Identity at layer 0).

    Raises:
        ValueError: an unknown kind or placement, ``per_layer_input`` on another kind,
            ``parallel`` on a layer other than a ``pre`` decoder, or a layer without its
            attention norm other than a ``pre`` decoder that is not parallel.
    """

    def __init__(self, hidden_size: int, o: LayerOptions, max_seq_len: int):
        if o.kind not in KINDS:
            raise ValueError(f"layer kind {o.kind!r} is not one of {', '.join(KINDS)}")
        if o.per_layer_input is not None and o.kind != "ple":
            raise ValueError(f"layer kind {o.kind!r} takes no per-layer input (kind ple does)")
        placement = "sandwich" if o.kind in ("sandwich", "ple") else o.placement
        if placement not in PLACEMENTS:
            raise ValueError(f"norm placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
        if o.parallel and (o.kind != "decoder" or placement != "pre"):
            raise ValueError(f"a parallel layer is a decoder placed pre, not kind {o.kind!r} "
                             f"placed {placement!r}")
        if not o.attention_norm and (placement != "pre" or o.parallel):
            raise ValueError("a layer without its attention norm is a decoder placed pre, not "
                             f"placed {placement!r}{' and parallel' if o.parallel else ''}")
        E, n = hidden_size, o.norm
        held = placement not in ("post", "post_residual") and o.attention_norm
        self.input_layernorm = Norm(E, n) if held else None
        attention = Attention if o.attention.latent is None else LatentAttention
        self.self_attn = attention(E, o.attention, max_seq_len, n)
        shared = o.parallel and o.shared_norm
        self.post_attention_layernorm = None if shared else Norm(E, n)
        self.pre_feedforward_layernorm = Norm(E, n) if placement == "sandwich" else None
        self.mlp = MLP(E, o.mlp)
        self.post_feedforward_layernorm = Norm(E, n) if placement != "pre" else None
        p = o.per_layer_input
        if p is not None:
            self.per_layer_input_gate = Linear(E, p.size)
            self.per_layer_projection = Linear(p.size, E)
            self.post_per_layer_input_norm = Norm(E, n)
        if o.kind == "ple":
            self.layer_scalar = Param(1, gain=True)
        if o.residual_weights:
            if o.parallel or placement == "post_residual":
                raise ValueError("residual weights weigh each block's residual add: not in a "
                                 f"parallel layer nor placed {placement!r}")
            self.input_residual = Param(E, gain=True)
            self.post_attention_residual = Param(E, gain=True)
        self.placement = placement
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes, per_layer: Handle | None = None) -> Handle:
        """The attention then the MLP, each around its norms and added to ``x``; for kind
        ``ple``, then ``per_layer`` ``(n, size)`` gated in and the sum times the scalar."""
        x = self._blocks(rec, x, ropes)
        p = self.options.per_layer_input
        if p is not None:
            g = rec.step("gated_activation", self.per_layer_input_gate(rec, x), per_layer,
                         where=self.path, act=p.act)
            x = self.residual(rec, x, self.post_per_layer_input_norm(
                rec, self.per_layer_projection(rec, g)))
        if self.options.kind == "ple":
            scalar = rec.hold("param", self.where("layer_scalar"), self.layer_scalar.array)
            x = rec.step("mul", x, scalar, where=self.path)
        return x

    def _blocks(self, rec: Recorder, x: Handle, ropes) -> Handle:
        if self.options.parallel:
            h = self.input_layernorm(rec, x)
            a = self.self_attn(rec, h, ropes)
            n2 = self.post_attention_layernorm
            m = self.mlp(rec, h if n2 is None else n2(rec, x))
            return self.residual(rec, x, rec.step("add", a, m, where=self.path))
        if self.placement == "post_residual":
            x = self.post_attention_layernorm(rec, self.residual(rec, x, self.self_attn(rec, x, ropes)))
            return self.post_feedforward_layernorm(rec, self.residual(rec, x, self.mlp(rec, x)))
        pre = self.placement == "pre"
        before_attn = self.input_layernorm
        after_attn = None if pre else self.post_attention_layernorm
        before_mlp = self.post_attention_layernorm if pre else self.pre_feedforward_layernorm
        after_mlp = self.post_feedforward_layernorm
        a = self.self_attn(rec, before_attn(rec, x) if before_attn else x, ropes)
        x = self.residual(rec, x, after_attn(rec, a) if after_attn else a, "input_residual")
        m = self.mlp(rec, before_mlp(rec, x) if before_mlp else x)
        return self.residual(rec, x, after_mlp(rec, m) if after_mlp else m,
                             "post_attention_residual")

    def residual(self, rec: Recorder, x: Handle, y: Handle, weight: str | None = None) -> Handle:
        """``x + scale * y``; where the layer holds residual weights, ``x`` first times the
        param ``weight`` names (``residual_weights``: ``input_residual * residual +
        hidden_states``, DogeDecoderLayer's)."""
        if weight is not None and self.options.residual_weights:
            w = rec.hold("param", self.where(weight), getattr(self, weight).array)
            x = rec.step("mul", x, w, where=self.where(weight))
        return rec.step("add", x, y, where=self.path, scale=self.options.residual_scale)
