"""The Ray Serve deployment (``iron_spec.cli.server.ray_serve``): a local Ray cluster on
127.0.0.1 only, a toy model on two replicas, driven by the real ``openai`` client.

Judged by the library in this process on the same drawn weights: concurrent requests each
equal the single-process answer, a streamed request's pieces join to the same text, and
both replicas answer (each response names its replica). About a minute, most of it Ray's
own start.
"""

from __future__ import annotations

import concurrent.futures as futures

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

import iron_spec  # noqa: E402
from iron_spec.cli.server.config import ModelEntry, ServeConfig  # noqa: E402
from iron_spec.cli.server.ray_serve import deployment  # noqa: E402
from tests.serving import free_port  # noqa: E402


@pytest.fixture(scope="module")
def client():
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ServeConfig([ModelEntry("toy", "llama3", None,
                                         {"random_weights": 0, "toy": True})])
        serve.run(deployment(config, num_replicas=2, threads=1), route_prefix="/")
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                            max_retries=0)
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_as_one_process_does(client):
    toy = iron_spec.load("llama3", random_weights=0, toy=True)
    prompts = [[i + 1, (7 * i) % 200 + 3, 11] for i in range(16)]
    alone = [toy.complete(p, max_new_tokens=12, temperature=0).token_ids for p in prompts]

    def ask(p):
        raw = client.completions.with_raw_response.create(model="toy", prompt=p,
                                                          max_tokens=12, temperature=0)
        return [int(t) for t in raw.parse().choices[0].text.split()], \
            raw.headers["iron-spec-replica"]

    with futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts))
    assert [ids for ids, _ in answers] == alone
    assert len({replica for _, replica in answers}) == 2  # both replicas answered


def test_a_streamed_request_joins_to_the_same_text(client):
    kw = dict(model="toy", prompt=[9, 8, 7, 6], max_tokens=10, temperature=0.7, seed=3)
    whole = client.completions.create(**kw).choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(**kw, stream=True)
              if c.choices]
    assert "".join(pieces) == whole and len(pieces) >= 10
    toy = iron_spec.load("llama3", random_weights=0, toy=True)
    assert [int(t) for t in whole.split()] == \
        toy.complete([9, 8, 7, 6], max_new_tokens=10, temperature=0.7, seed=3).token_ids
