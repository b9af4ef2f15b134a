"""The layers a decoder stacks, composed of ``blocks``: attention and MLP, each with its norms
placed before, after or around it, and its residual add.

Not for: the blocks themselves (``blocks``) or the model around the layers (``causal``).
"""

from __future__ import annotations

from .blocks import MLP, Attention, LayerOptions, RMSNorm
from .graph import Handle, Recorder
from .module import Module

PLACEMENTS = ("pre", "post", "sandwich")


class DecoderLayer(Module):
    """Attention then MLP, each added to the residual, norms placed by ``o.placement``.

    Param names are transformers': ``pre`` has ``input_layernorm`` and (before the MLP)
    ``post_attention_layernorm`` (LlamaDecoderLayer); ``post`` has ``post_attention_layernorm``
    and ``post_feedforward_layernorm`` on the blocks' outputs (Olmo2DecoderLayer);
    ``sandwich`` has all four of ``input_layernorm``, ``post_attention_layernorm``,
    ``pre_feedforward_layernorm`` and ``post_feedforward_layernorm`` (Gemma2DecoderLayer).

    Raises:
        ValueError: an unknown kind or placement.
    """

    def __init__(self, hidden_size: int, o: LayerOptions, max_seq_len: int):
        if o.kind not in ("decoder", "sandwich"):
            raise ValueError(f"layer kind {o.kind!r} is not decoder or sandwich")
        placement = "sandwich" if o.kind == "sandwich" else o.placement
        if placement not in PLACEMENTS:
            raise ValueError(f"norm placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
        E, n = hidden_size, o.norm
        self.input_layernorm = RMSNorm(E, n) if placement != "post" else None
        self.self_attn = Attention(E, o.attention, max_seq_len, n)
        self.post_attention_layernorm = RMSNorm(E, n)
        self.pre_feedforward_layernorm = RMSNorm(E, n) if placement == "sandwich" else None
        self.mlp = MLP(E, o.mlp)
        self.post_feedforward_layernorm = RMSNorm(E, n) if placement != "pre" else None
        self.placement = placement
        self.options = o

    def __call__(self, rec: Recorder, x: Handle, ropes) -> Handle:
        """The attention then the MLP, each around its norms and added to ``x``."""
        pre = self.placement == "pre"
        before_attn = self.input_layernorm
        after_attn = None if pre else self.post_attention_layernorm
        before_mlp = self.post_attention_layernorm if pre else self.pre_feedforward_layernorm
        after_mlp = self.post_feedforward_layernorm
        a = self.self_attn(rec, before_attn(rec, x) if before_attn else x, ropes)
        x = self.residual(rec, x, after_attn(rec, a) if after_attn else a)
        m = self.mlp(rec, before_mlp(rec, x) if before_mlp else x)
        return self.residual(rec, x, after_mlp(rec, m) if after_mlp else m)

    def residual(self, rec: Recorder, x: Handle, y: Handle) -> Handle:
        return rec.step("add", x, y, where=self.path, scale=self.options.residual_scale)
