"""The building blocks a model's tree is made of, each recording its steps, one module per
kind: token mixers (``attention``; those carrying a state beside it: ``short_conv``,
``selective_scan`` (Mamba's), ``ssd`` (Mamba2's), ``delta_rule``, over the
``causal_conv`` they share), feed-forward blocks (``mlp``; a mixture of experts beside it), a transformer block several
layers share (``shared``), ``norms``, ``embedding``, ``rope`` tables and ``projections``.

Every block is generic: options (dataclasses) say what it does, never which family it
serves. Semantics follow transformers' ``modeling_llama.py`` (GQA attention, gated MLP)
unless an option says otherwise. Layers, which compose these, are in ``runtime.layers``.
"""
