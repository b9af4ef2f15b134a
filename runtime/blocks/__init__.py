"""The building blocks a model's tree is made of, each recording its steps, one module per
kind: token mixers (``attention``; short convolutions, SSMs and the gated delta rule each a
module beside it), feed-forward blocks (``mlp``; a mixture of experts beside it), ``norms``,
``embedding``, ``rope`` tables and ``projections``.

Every block is generic: options (dataclasses) say what it does, never which family it
serves. Semantics follow transformers' ``modeling_llama.py`` (GQA attention, gated MLP)
unless an option says otherwise. Layers, which compose these, are in ``runtime.layers``.
"""
