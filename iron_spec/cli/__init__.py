"""The ``iron-spec`` commands: the typer app (``app``), what every command shares
(``command``), and one module per command (``run``, ``lint``, ``show``, ``check``,
``bench``, ``embed``, ``list``); a server command lands here as its own module.

Not for: what the commands compute beyond their output (``iron_spec.library``,
``iron_spec.spec``). Nothing below imports from here.
"""
