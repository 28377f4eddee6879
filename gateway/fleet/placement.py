"""Placements that cannot work, found from the config alone: the routing filter's own memory and context
test (``routing.estimator.fit_problem``) run for every backend and its model before any request.

A backend whose model does not fit beside even the smallest request is an error: every request for it
would be refused ``nothing_fits``. One whose model fits, but not beside a request of the model's whole
context, is a warning: longer requests go elsewhere (or are refused), and engines such as vLLM refuse
to start when one whole-context request's KV cache does not fit.
"""

from __future__ import annotations

from gateway.config import BackendConfig, LoadedConfig
from gateway.fleet.catalog import model_specs, profile
from routing.catalog import MEMORY_HEADROOM
from routing.estimator import fit_problem, kv_capacity_tokens, memory_need
from routing.types import BackendProfile, BackendState, ModelSpec


def _hardware(p: BackendProfile, cfg: BackendConfig) -> str:
    if p.gpu.name == "CPU":
        unset = "" if cfg.memory_gb is not None else " (gpu: CPU and no memory_gb: set: the default)"
        return f"the CPU host has {p.memory_gb:g} GB{unset}"
    return f"{p.gpu_count}× {p.gpu.name} has {p.memory_gb:g} GB"


def _numbers(model: ModelSpec, p: BackendProfile, cfg: BackendConfig, tokens: int) -> str:
    need, have = memory_need(model, p, tokens)
    kv = need - model.weight_bytes
    return (
        f"model {model.name} needs {model.weight_bytes / 1e9:.1f} GB of weights + {kv / 1e9:.1f} GB KV for one "
        f"{tokens}-token request; {_hardware(p, cfg)} ({have / 1e9:.1f} GB usable at {MEMORY_HEADROOM:.0%} of memory)"
    )


def placement_problems(loaded: LoadedConfig) -> tuple[list[str], list[str]]:
    """(errors, warnings) as ``FILE:LINE: backends[i]: message`` lines (``...: warning: message``)."""
    specs = model_specs(loaded, loaded.ggufs)
    errors: list[str] = []
    warnings: list[str] = []
    for i, b in enumerate(loaded.config.backends):
        if loaded.model(b.model).kind != "generate":
            continue  # an embedding request holds no KV cache beyond its own pass
        model, p = specs[b.model], profile(b, loaded)
        state = BackendState(p)
        where = loaded.where("backends", i)
        context = min(model.context, p.context or model.context)
        if fit_problem(model, state, 1, 1) is not None:  # the smallest request: one prompt token, one answer token
            if context < 2:
                errors.append(f"{where}: backend {b.name}: model {b.model}'s context of {context} tokens leaves "
                              "no room for a prompt and an answer (every request gets nothing_fits)")  # fmt: skip
                continue
            errors.append(f"{where}: backend {b.name}: {_numbers(model, p, b, context)}: it can never serve the "
                          "model (every request gets nothing_fits)")  # fmt: skip
        elif fit_problem(model, state, context - 1, 1) is not None:
            room = int(kv_capacity_tokens(model, p))
            warnings.append(
                f"{where}: warning: backend {b.name}: {_numbers(model, p, b, context)}: requests over {room} tokens "
                f"(prompt + answer) do not fit there, and engines such as vLLM refuse to start (set "
                f"models[].context to at most {room}, or give the backend more memory)"
            )
    return errors, warnings
