"""An encoder's task head: what a ``*ForMaskedLM``, ``*ForSequenceClassification`` or
``*ForTokenClassification`` checkpoint adds on top of its encoder.

Every such head transformers builds is one path through the same four steps on the final
hidden states: the rows it reads (every row; for a text's classes the first row, the mean of
the rows or BertPooler's ``tanh(dense(first row))``), an optional ``dense`` hidden -> hidden
projection, an optional activation, an optional LayerNorm, and ``out``, the projection to the
scores (the vocabulary, tied to the word embeddings where the config says, or the labels):

- BertOnlyMLMHead: dense, ``hidden_act``, LayerNorm, decoder (tied) with ``cls.predictions.bias``;
- RobertaLMHead: dense, ``gelu``, layer_norm, decoder (tied) with ``lm_head.bias``;
- ModernBertPredictionHead + decoder: dense (``classifier_bias``), ``classifier_activation``,
  norm (``norm_bias``), decoder (``decoder_bias``), on the rows (masked LM) or on the pooled
  row (``classifier_pooling``: the first row or the mean) before ``classifier``;
- BertForSequenceClassification: the pooler's output, then ``classifier``;
- RobertaClassificationHead: the first row, dense, ``tanh``, ``out_proj``;
- Bert/RobertaForTokenClassification: ``classifier`` on every row.

Dropout is the identity at inference and is not built.

Not for: reading a spec (``iron_spec.encoder``), pooling an embedding (``encoder``).
"""

from __future__ import annotations

from dataclasses import dataclass

from iron_spec.operators.activation import ACTIVATION_PARAMS, ACTIVATIONS

from .blocks.norms import Norm, NormOptions
from .blocks.projections import Linear
from .graph import Handle, Recorder
from .module import Module

#: The tasks a head serves, as transformers' pipelines name them.
TASKS = ("fill-mask", "text-classification", "token-classification")
#: The rows a text-classification head reads: the first, their mean, or BertPooler's output.
HEAD_POOLS = ("cls", "mean", "pooler")


@dataclass(frozen=True)
class HeadOptions:
    """A task head (module docstring): ``task`` one of ``TASKS``; ``size`` the scores each
    row gives (the vocabulary's, or the labels'); ``pool`` the rows a text-classification
    head reads (one of ``HEAD_POOLS``; None for the per-row tasks); ``dense`` a hidden ->
    hidden projection first (with a bias where ``dense_bias``); ``act`` an activation after
    it (an ``ACTIVATIONS`` name without parameters; None: none); ``norm`` a norm after that
    (the encoder's kind and eps); ``out_bias`` whether ``out`` has a bias; ``tied`` whether
    ``out``'s weight is the word embeddings' (``vocab_size`` rows)."""

    task: str
    size: int
    pool: str | None = None
    dense: bool = False
    dense_bias: bool = True
    act: str | None = None
    norm: bool = False
    out_bias: bool = True
    tied: bool = False

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"head task {self.task!r} is not one of {', '.join(TASKS)}")
        if (self.task == "text-classification") != (self.pool is not None):
            raise ValueError(f"a {self.task} head reads "
                             + ("one pooled row: give pool" if self.pool is None else
                                f"every row, not a pool ({self.pool!r})"))
        if self.pool is not None and self.pool not in HEAD_POOLS:
            raise ValueError(f"head pool {self.pool!r} is not one of {', '.join(HEAD_POOLS)}")
        if self.act is not None and (self.act not in ACTIVATIONS or self.act in ACTIVATION_PARAMS):
            raise ValueError(f"head activation {self.act!r} is not one of "
                             f"{', '.join(a for a in ACTIVATIONS if a not in ACTIVATION_PARAMS)}")
        if self.size < 1:
            raise ValueError(f"a head of {self.size} scores a row")

    @property
    def per_row(self) -> bool:
        """Whether the head scores every row (fill-mask, token classification)."""
        return self.pool is None


class EncoderHead(Module):
    """``dense`` (optional), the activation, ``norm`` (optional) and ``out``: ``x`` ``(n,
    hidden)`` float32 to ``(n, size)`` scores (module docstring)."""

    def __init__(self, hidden_size: int, o: HeadOptions, norm: NormOptions):
        self.dense = Linear(hidden_size, hidden_size, o.dense_bias) if o.dense else None
        self.norm = Norm(hidden_size, norm) if o.norm else None
        self.out = Linear(hidden_size, o.size, o.out_bias)
        self.options = o

    def __call__(self, rec: Recorder, x: Handle) -> Handle:
        if self.dense is not None:
            x = self.dense(rec, x)
        if self.options.act is not None:
            x = rec.step("activation", x, where=self.path, act=self.options.act)
        if self.norm is not None:
            x = self.norm(rec, x)
        return self.out(rec, x)
