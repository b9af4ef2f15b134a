"""Towers: the encoders whose rows come from a front end (an image's patches, audio's log-mel
frames) and whose output is soft tokens in a text model's space, placed at the text's
placeholder tokens (the seeds' ``Tower``, ``ImagePatches``, ``LogMel`` and ``Multimodal``).

- ``images``: an image file or array to the pixel values transformers' image processors give
  (Pillow's resize, as their PIL backend), and those pixels to a tower's patch rows.
- ``audio``: a sound file or samples to the log-mel features transformers'
  WhisperFeatureExtractor gives (the seeds' ``LogMel``).
- ``tower``: a vision tower's module tree (patch embedding as a GEMM, positions, the encoder
  layers of ``runtime.encoder``, pooling, projector) and its compiled version.
- ``audio_tower``: an audio tower's (Conv1d front, positions, encoder layers on the sound's
  rows, pair pooling, projector).
- ``axial``: an axial-RoPE vision tower (Gemma 4's: patches at their (x, y) places, sandwich-
  normed layers, pooling by position), a version per patch grid; ``aspect_images``: its front
  end (an image resized keeping its aspect ratio within a patch budget).
- ``semicausal_log_mel``: Gemma 4's audio front end (Gemma4AudioFeatureExtractor's log-mel);
  ``conformer``: its audio tower (Gemma4AudioModel's conformer), a version per sound's frames.
- ``multimodal``: a causal text model with its towers; the prompt chunk that takes soft
  tokens at placeholder rows, and a session's placement (a tower runs once per image).

Not for: reading a spec's ``towers:`` section (``iron_spec.spec.options.towers``).
"""
