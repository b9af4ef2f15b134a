"""The operators a compiled plan runs: one contract, one module per family.

Each operator states its output shape from input shapes and attributes, computes
``reference(...)`` in float64 numpy (the truth), bounds how far a kernel may stray from it
(``tolerance``), and runs a CPU ``kernel`` that writes into a given output buffer. Operators
know nothing of models: no layer, no checkpoint, no spec.
"""

from . import blas_env  # noqa: F401  (first: before numpy loads OpenBLAS)
from .activation import GatedActivation, Activation
from .altup import AddToStreams, AltUpCorrect, AltUpPredict, MatchRMS, StackStreams
from .attention import Attention, KVWrite
from .base import Operator, PerCall, Tolerance
from .causal_conv import CausalConv
from .delta_rule import GatedDeltaRule
from .differential import DifferentialAttention
from .disentangled import DisentangledAttention
from .dynamic_mask import DynamicMask
from .elementwise import Add, Affine, Clamp, Clip, Columns, JoinHeads, Mul, TakeRow
from .embedding import Embedding
from .experts import Experts
from .fourier import FourierMix
from .gated_norm import GatedRMSNorm
from .grouped import GroupedLinear
from .global_attention import GlobalWindowAttention
from .landmark import LandmarkAttention
from .local_attention import LocalAttention
from .lsh_expectation import LshExpectationAttention
from .layernorm import LayerNorm
from .linear import Linear
from .norm import RMSNorm
from .positions import AddRows, SegmentRows, sinusoidal_table
from .pooling import L2Normalize, MeanRows, Tanh
from .router import Router
from .rope import Rope, RopeSections, rope_inv_freq, rope_switch, rope_table, rope_tables
from .sampling import Sampler
from .selective_scan import SelectiveScan
from .self_attention import SelfAttention
from .softcap import Softcap
from .conv import Conv1d, Conv2d
from .soft_tokens import AveragePool, CallRows, GatherRows, PairMean, PixelShuffle, PlaceRows, \
    PrependRow, ReachAttention, RowRange
from .span_conv import DepthwiseConv, DynamicConv
from .ssd import SSD
from .sparsity import GaussianTopK, std_multiplier
from .token_dropout import TokenDropoutRescale
from .trigram import Trigram

OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (
        Embedding(), Linear(), RMSNorm(), Rope(), Attention(), KVWrite(),
        Activation(), GatedActivation(), Add(), Mul(), TakeRow(), Columns(), Softcap(),
        LayerNorm(), SelfAttention(), MeanRows(), L2Normalize(), Tanh(),
        AddRows(), SegmentRows(), Clamp(), Clip(), TokenDropoutRescale(), JoinHeads(), DifferentialAttention(),
        DisentangledAttention(),
        DynamicMask(),
        GaussianTopK(), FourierMix(), Affine(), Trigram(), DepthwiseConv(), DynamicConv(),
        LandmarkAttention(), LocalAttention(), LshExpectationAttention(), GlobalWindowAttention(),
        GroupedLinear(),
        StackStreams(), MatchRMS(), AltUpPredict(), AltUpCorrect(), AddToStreams(),
        AveragePool(), PlaceRows(), PrependRow(), ReachAttention(), RowRange(), Conv1d(), Conv2d(),
        CallRows(), PairMean(), PixelShuffle(), GatherRows(), RopeSections(),
        Router(), Experts(),
        CausalConv(), SelectiveScan(), SSD(), GatedDeltaRule(), GatedRMSNorm(),
    )
}

__all__ = [
    "OPERATORS", "Operator", "AveragePool", "PlaceRows", "PrependRow", "ReachAttention",
    "RowRange", "Conv1d", "Conv2d", "CallRows", "PairMean", "PerCall", "Tolerance", "Embedding", "Linear", "RMSNorm",
    "Rope", "rope_inv_freq", "rope_switch", "rope_table", "rope_tables", "Attention", "KVWrite", "Activation",
    "GatedActivation", "Add", "Mul", "TakeRow", "Columns", "Softcap", "Sampler",
    "LayerNorm", "SelfAttention", "MeanRows", "L2Normalize", "Tanh", "AddRows", "SegmentRows", "Clamp",
    "Clip", "sinusoidal_table", "TokenDropoutRescale", "JoinHeads", "DifferentialAttention",
    "DisentangledAttention", "FourierMix", "Affine", "Trigram", "DepthwiseConv",
    "DynamicConv", "LandmarkAttention", "LocalAttention", "LshExpectationAttention",
    "GlobalWindowAttention", "GroupedLinear",
    "DynamicMask",
    "GaussianTopK", "std_multiplier",
    "StackStreams", "MatchRMS", "AltUpPredict", "AltUpCorrect", "AddToStreams",
    "Router", "Experts",
    "CausalConv", "SelectiveScan", "SSD", "GatedDeltaRule", "GatedRMSNorm",
]
