"""Stop strings as the field's tools end a text, and generation settings as transformers
merges them with generation_config.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iron_spec.runtime.generation import StopText, sampler_for
from iron_spec.runtime.tokenizer import TextStream, Tokenizer

STOPS = np.load(Path(__file__).parents[1] / "operators" / "sampling_golden" / "stop_strings.npz")


def test_text_ends_before_the_stop_string_and_a_partial_match_is_held_back():
    s = StopText(["stop", "\n\n"])
    assert s.push("it will st") == "it will "  # "st" could begin "stop"
    assert s.push("a") == "sta"  # "sta" cannot: shown
    assert s.push("y or st") == "y or "
    assert s.push("op here") == "" and s.stopped == "stop"
    assert s.push("more") == ""  # nothing after the stop


def test_a_held_back_end_is_given_back_when_the_text_ends_there():
    s = StopText(["\n\n"])
    assert s.push("one\n") == "one" and s.flush() == "\n"


def test_the_earliest_stop_string_wins_and_the_longest_at_one_place():
    s = StopText(["b", "abc", "ab"])
    assert s.push("xabcd") == "x" and s.stopped == "abc"


def test_stop_strings_end_at_the_token_transformers_stops_at(smollm2):
    # StopStringCriteria (transformers 5.24, sampling_golden/record.py) on SmolLM2's own
    # tokens: the first token at which it ends generation, for each stop string, or never.
    tok = Tokenizer(smollm2)
    stops = [str(s) for s in STOPS["stops"]]
    texts = sorted({k.split(".")[0] for k in STOPS.files if k.startswith("text")})
    assert texts
    for t in texts:
        ids = STOPS[f"{t}.ids"].tolist()
        for stop, first in zip(stops, STOPS[f"{t}.first"].tolist()):
            pieces, cut = TextStream(tok), StopText([stop])
            shown, at = "", -1
            for n, token in enumerate(ids, 1):
                shown += cut.push(pieces.push(token))
                if cut.stopped is not None:
                    at = n
                    break
            assert at == first, (t, stop)
            if at > 0:  # the text shown is the text before the stop string
                whole = tok.decode(ids[:at])
                assert shown == whole[:whole.index(stop)], (t, stop)
            else:  # all of it, once the end gives back what was held
                assert shown + cut.flush() == tok.decode(ids), (t, stop)


def test_no_settings_follow_generation_config_as_transformers(tmp_path):
    path = tmp_path / "generation_config.json"
    gen = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "min_p": 0.05,
           "repetition_penalty": 1.1}
    s = sampler_for(gen, path)
    # Given nothing: every setting the file's; top_k absent is GenerationConfig's 50.
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty) == \
        (0.6, 50, 0.9, 0.05, 1.1)
    # A setting given wins; temperature 0 is greedy, and the repetition penalty still holds.
    s = sampler_for(gen, path, temperature=0.0)
    assert s.greedy and s.repetition_penalty == 1.1 and s.min_p is None
    # No do_sample: greedy, as transformers' generate.
    assert sampler_for({"temperature": 0.6}, path).greedy
    with pytest.raises(ValueError, match=f"{path}: min_p is 3, not a finite number at least 0 and at most 1"):
        sampler_for({"do_sample": True, "min_p": 3}, path)
    with pytest.raises(ValueError, match="^top_p 0.0 is outside"):
        sampler_for(gen, path, top_p=0.0)
