"""A ``towers`` entry of ``kind: conformer``: Gemma 4's audio tower
(``runtime.towers.conformer``) and its ``semicausal_log_mel`` front end
(``runtime.towers.semicausal_log_mel``).

Its layers' heads, head_dim and activation are read from the entry's ``layer`` as any
tower's (``encoder.expand_encoder``: attention heads, ``mlp.act``); beside it, ``conformer``:

- ``channels``: the subsampling's two Conv2d blocks' channels (``subsampling_conv_channels``);
- ``eps``: the subsampling's LayerNorms', the light convolution's RMSNorms' and the
  embedder's (``rms_norm_eps``; the layers' other norms keep Gemma4RMSNorm's 1e-6);
- ``conv_kernel``: the light convolution's depthwise taps (``conv_kernel_size``);
- ``residual_weight``: the feed-forwards' output scale;
- ``chunk``, ``left``, ``right``: the attention's chunk and context (``attention_chunk_size``,
  ``attention_context_left``, ``attention_context_right``); ``logit_cap``: its softcap;
  ``masked_logit``: the logit of a key outside the window (``attention_invalid_logits_value``:
  far enough below 0 that its softmax weight is 0 in float32, else refused);
- ``clip``: the clamp of the blocks' values (``gradient_clipping``); ``clipped``: the
  projections' clips (``use_clipped_linears``);
- ``output``: the width before the embedder (``output_proj_dims``).

Not for: vision towers (``towers``, ``axial_towers``), building the tree (``spec.towers``).
"""

from __future__ import annotations

from typing import Any, Mapping

from iron_spec.operators.activation import ACTIVATIONS
from iron_spec.runtime.towers.conformer import ConformerOptions
from iron_spec.runtime.towers.semicausal_log_mel import SemicausalLogMel

from ..config import Resolved
from .reading import _flag_option, _number, _option, _whole

#: A masked key's logit at or below this weighs exactly 0 in a float32 softmax beside a
#: logit of at most the softcap (exp underflows past -104).
MASKED_AT_MOST = -1.0e4


def options(entry, r: Resolved, encoder, text_hidden: int, mels: int) -> ConformerOptions:
    """The options of a ``conformer`` tower over its resolved fields ``r``, its encoder
    options ``encoder`` (``runtime.encoder_options.EncoderOptions``: heads, head_dim, act)
    and the front end's ``mels``.

    Raises:
        SpecError: at the option's line, a size that is no whole number from 1 (the
            context's from 0), channels that are not two, a scale, cap or clip that is no
            number above 0, a masked logit that would weigh in the softmax, an activation
            not built, or layers of differing shapes.
    """
    v, c = entry.view, ("conformer",)

    def whole(key: str, least: int = 1) -> int:
        value = _whole(v, c + (key,), _option(v, r, c + (key,), None))
        if value is None or value < least:
            raise v.error(c + (key,), f"conformer.{key} is {value!r}, not a whole number "
                                      f"from {least}")
        return value

    def positive(key: str) -> float:
        value = _number(v, c + (key,), _option(v, r, c + (key,), None))
        if value is None or value <= 0:
            raise v.error(c + (key,), f"conformer.{key} is {value!r}, not a number above 0")
        return value

    channels = _option(v, r, c + ("channels",), None)
    if not isinstance(channels, (list, tuple)) or len(channels) != 2 or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in channels):
        raise v.error(c + ("channels",), f"conformer.channels is {channels!r}: the two "
                                         "subsampling convolutions' channels, whole numbers")
    masked = _number(v, c + ("masked_logit",), _option(v, r, c + ("masked_logit",), -1e9))
    if masked > MASKED_AT_MOST:
        raise v.error(c + ("masked_logit",), f"conformer.masked_logit is {masked}: a key "
                      f"outside the window would weigh in the softmax (served at most "
                      f"{MASKED_AT_MOST:g}, where its weight is 0 in float32)")
    layers = encoder.layers
    first = layers[0]
    if any((lo.heads, lo.head_dim, lo.act) != (first.heads, first.head_dim, first.act)
           for lo in layers):
        raise v.error(("layer",), "a conformer tower's layers share one shape")
    if first.act not in ACTIVATIONS:
        raise v.error(("layer", "mlp", "act"), f"act {first.act!r} is not one of "
                                               f"{', '.join(ACTIVATIONS)}")
    return ConformerOptions(
        hidden_size=encoder.hidden_size, layers=len(layers), heads=first.heads,
        head_dim=first.head_dim, act=first.act, eps=positive("eps"),
        channels=(int(channels[0]), int(channels[1])), mels=mels,
        conv_kernel=whole("conv_kernel"), residual_weight=positive("residual_weight"),
        chunk=whole("chunk"), left=whole("left", 0), right=whole("right", 0),
        logit_cap=positive("logit_cap"), clip=positive("clip"),
        clipped=_flag_option(v, r, c + ("clipped",), False), output=whole("output"),
        text_hidden=text_hidden)


def audio_front(entry, settings: Mapping[str, Any], source: str, front_settings
                ) -> SemicausalLogMel:
    """The ``semicausal_log_mel`` front end on ``settings`` (preprocessor_config.json's, or
    processor_config.json's ``feature_extractor``) over ``front.defaults``, each key read,
    ignored or refused (``front_settings``: ``towers._front_settings``).

    Raises:
        SpecError: at ``front``, an unread or refused key, or settings the front end refuses.
    """
    known = {"feature_size", "sampling_rate", "padding_value", "frame_length_ms",
             "hop_length_ms", "min_frequency", "max_frequency", "preemphasis",
             "preemphasis_htk_flavor", "fft_overdrive", "dither", "input_scale_factor",
             "mel_floor", "per_bin_mean", "per_bin_stddev", "max_length", "pad_to_multiple_of"}
    merged = front_settings(entry, settings, source, known)
    try:
        return SemicausalLogMel(**{k: tuple(x) if isinstance(x, list) else x
                                   for k, x in merged.items()})
    except (TypeError, ValueError) as e:
        raise entry.view.error(("front",), f"{source}: {e}") from None
