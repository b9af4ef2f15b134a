"""Reading a spec's option sections into the runtime's options, one module per part: a
layer's attention (``attention``), MLP (``mlp``), norms (``norms``) and the layer around them
(``layer``); RoPE tables (``rope``); the embedding's positions (``embedding``, ``positions``)
and the head (``head``); the checkpoint's layout (``checkpoint``); a recurrence schedule
(``recurrence``); an encoder's own parts (``encoder``). ``reading`` reads one option, typed.

A new capability's options land in a module of their own here (token mixers with a
recurrent state, mixtures of experts, towers), read from ``layer`` or ``interpreter``.

Not for: the whole expansion (``interpreter``, ``encoder``), loading (``build``).
"""
