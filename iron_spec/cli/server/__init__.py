"""``iron-spec serve``'s server: an OpenAI-compatible ASGI app over loaded models (``app``),
the request fields it reads (``protocol``), its metrics (``metrics``), what it serves
(``config``) and its Ray Serve deployment (``ray_serve``)."""
