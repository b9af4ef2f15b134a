"""The same app as replicas on Ray Serve: ``deployment(config, ...)``.

    from ray import serve
    from iron_spec.cli.server.config import read_config
    from iron_spec.cli.server.ray_serve import deployment

    app = deployment(read_config("serve.yaml"), num_replicas=2, threads=2)
    serve.run(app, route_prefix="/")   # on the cluster ray.init() joined

Each replica is one Ray actor that loads the configuration's models itself and serves
``build_app`` over them (``serve.ingress`` of a builder: the app is made on the replica, not
pickled); Ray Serve's proxy spreads the requests over the replicas. ``threads`` pins each
replica to that many of a node's CPUs (``num_cpus``, and ``OPENBLAS_NUM_THREADS`` for its
kernels); ``autoscaling`` (``min_replicas``, ``max_replicas``, ``target_ongoing_requests``)
lets Ray Serve choose the count instead of ``num_replicas``. Across machines: start Ray on
each (``ray start --head`` on one, ``ray start --address HEAD:6379`` on the others), then
``ray.init(address="auto")`` (or ``RAY_ADDRESS``) before ``serve.run``: the replicas land on
whichever nodes have the CPUs, each loading the models from its own disk (the same paths on
every node, or hub ids).

Every response names the replica that answered (``iron-spec-replica: <pid>@<host>``).
Needs ``pip install 'ray[serve]'``.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .config import ServeConfig, load_models


def build(config: ServeConfig):
    """The app over ``config``'s models, loaded here (on the replica)."""
    from .app import build_app

    served = load_models(config)
    return build_app(served, api_key=config.api_key, engine=config.engine,
                     replica=f"{os.getpid()}@{socket.gethostname()}")


def deployment(config: ServeConfig, *, num_replicas: int | None = 1, threads: int = 1,
               autoscaling: dict[str, Any] | None = None, name: str = "iron-spec"):
    """A bound Ray Serve application serving ``config``'s models on ``num_replicas``
    replicas (or ``autoscaling``'s bounds), each on ``threads`` CPUs.

    Raises:
        ImportError: Ray Serve is not installed.
        ValueError: ``threads`` < 1, or both ``num_replicas`` and ``autoscaling``.
    """
    from ray import serve

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads is {threads!r}: a count >= 1")
    if autoscaling is not None and num_replicas not in (None, 1):
        raise ValueError("give num_replicas or autoscaling, not both")
    config = ServeConfig(config.models, config.host, config.port, config.api_key, threads,
                         dict(config.engine))

    class Replica:
        """One replica: the app is built from the configuration by Ray (``ingress``)."""

    Replica.__name__ = Replica.__qualname__ = name.replace("-", "_")
    options: dict[str, Any] = {
        "name": name,
        "ray_actor_options": {"num_cpus": threads, "runtime_env": {
            "env_vars": {"OPENBLAS_NUM_THREADS": str(threads)}}},
    }
    if autoscaling is not None:
        options["autoscaling_config"] = dict(autoscaling)
    else:
        options["num_replicas"] = num_replicas
    ingress = serve.ingress(lambda: build(config))(Replica)
    return serve.deployment(**options)(ingress).bind()
