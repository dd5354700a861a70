"""Ray Train: the ``ScalingConfig`` that puts a ``TorchTrainer``'s workers on the chosen pool.

One worker per ``gpus_per_worker`` GPUs (default one, as DDP/FSDP run one process per GPU), ``use_gpu``,
and the pool's GPU type as ``accelerator_type`` (Ray adds a sliver of the ``accelerator_type:<TYPE>``
resource to every worker) or, with ``use_label_selector``, as a ``ray.io/accelerator-type`` label
selector (Ray Train v2). Inside a job submitted by :func:`.submit.submit_job`, the decision arrives in
environment variables and :func:`scaling_config_from_env` reads it.

:func:`scaling_config_kwargs` is pure; building the object needs ``ray[train]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from scheduler.integrations.ray.connection import RayIntegrationError
from scheduler.integrations.ray.discovery import ACCELERATOR_LABEL, ray_accelerator_type
from scheduler.integrations.ray.submit import ENV_ACCELERATOR_TYPE, ENV_NUM_GPUS, ENV_PIN
from scheduler.placement import Decision


def _kwargs(gpus: int, accelerator_type: str, gpus_per_worker: int, use_label_selector: bool) -> dict[str, Any]:
    if gpus_per_worker <= 0 or gpus % gpus_per_worker:
        raise ValueError(f"gpus_per_worker must divide the decision's {gpus} GPUs; got {gpus_per_worker}")
    kwargs: dict[str, Any] = {
        "num_workers": gpus // gpus_per_worker,
        "use_gpu": True,
        "resources_per_worker": {"GPU": gpus_per_worker},
    }
    if use_label_selector:
        kwargs["label_selector"] = {ACCELERATOR_LABEL: accelerator_type}
    else:
        kwargs["accelerator_type"] = accelerator_type
    return kwargs


def scaling_config_kwargs(decision: Decision, accelerator_type: str | None = None, gpus_per_worker: int = 1,
                          use_label_selector: bool = False) -> dict[str, Any]:
    """Arguments of ``ray.train.ScalingConfig`` for a placed decision. ``accelerator_type`` is the Ray type
    of the chosen pool (from discovery); by default it is derived from the pool's catalog GPU."""
    c = decision.chosen
    if c is None or c.gpus is None:
        raise ValueError("the decision is unschedulable; there is no pool to scale onto")
    return _kwargs(c.gpus, accelerator_type or ray_accelerator_type(c.pool.gpu), gpus_per_worker,
                   use_label_selector)


def _build(kwargs: dict[str, Any]) -> Any:
    try:
        from ray.train import ScalingConfig
    except ImportError as exc:
        raise RayIntegrationError(f"Ray Train is not installed ({exc}); install `ray[train]` next to "
                                  "`vramfit[ray]`") from None
    return ScalingConfig(**kwargs)


def scaling_config_for(decision: Decision, accelerator_type: str | None = None, gpus_per_worker: int = 1,
                       use_label_selector: bool = False) -> Any:
    """A ``ray.train.ScalingConfig`` that lands a ``TorchTrainer`` on the decision's pool."""
    return _build(scaling_config_kwargs(decision, accelerator_type, gpus_per_worker, use_label_selector))


def scaling_config_kwargs_from_env(env: Mapping[str, str] | None = None, gpus_per_worker: int = 1,
                                   use_label_selector: bool | None = None) -> dict[str, Any]:
    """``ScalingConfig`` arguments from the ``VRAMFIT_*`` variables a vramfit submission sets; pure. The workers
    are steered as the driver was pinned (``VRAMFIT_PIN``): by the ``ray.io/accelerator-type`` label on a pool
    whose nodes carry only the label, else by the ``accelerator_type`` resource; ``use_label_selector`` overrides."""
    env = os.environ if env is None else env
    if use_label_selector is None:
        use_label_selector = env.get(ENV_PIN) == "label"
    missing = [k for k in (ENV_NUM_GPUS, ENV_ACCELERATOR_TYPE) if not env.get(k)]
    if missing:
        raise RayIntegrationError(f"{' and '.join(missing)} not set: this job was not submitted by vramfit "
                                  "(`vramfit ray submit`)")
    try:
        gpus = int(env[ENV_NUM_GPUS])
    except ValueError:
        raise RayIntegrationError(f"{ENV_NUM_GPUS} must be an integer; got {env[ENV_NUM_GPUS]!r}") from None
    return _kwargs(gpus, env[ENV_ACCELERATOR_TYPE], gpus_per_worker, use_label_selector)


def scaling_config_from_env(env: Mapping[str, str] | None = None, gpus_per_worker: int = 1,
                            use_label_selector: bool | None = None) -> Any:
    """Inside a job submitted by vramfit: the ``ScalingConfig`` for the pool it was placed on."""
    return _build(scaling_config_kwargs_from_env(env, gpus_per_worker, use_label_selector))
