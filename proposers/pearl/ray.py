"""The ``pearl`` draft model in a Ray actor (``placement: "ray"``): on another node or GPU of the Ray cluster.

For cluster deployments (KubeRay, Ray Serve) where the draft model should not
share the target's node or GPU. vLLM's worker joins the Ray cluster it belongs
to (``ray_address``, default ``"auto"``) and creates one actor,
``DraftActor``, placed by Ray according to ``ray_actor_options`` (the
arguments of ``.options()``: ``num_cpus``, ``num_gpus``, ``resources`` such
as ``{"node:10.0.0.5": 0.01}`` to pick a node, ...). The actor runs the same
``DraftWorker`` as the child process (``remote.DraftServer``), so
post-verify goes on in the actor while vLLM verifies.

Everything but the transport is ``remote``'s: the messages (a JSON
header and raw int32 bytes; freespec sends Ray a ``str`` and ``bytes`` and
reads back a ``str``: nothing of freespec's own is pickled; how Ray moves those
between cluster members is Ray's business), and the failure rules. Every wait
is bounded: ``ray.get(..., timeout=step_timeout_s)``; an actor that dies or
times out is killed (``ray.kill``), that step drafts nothing, the error is
logged once and a new actor starts in the background (at most
``max_restarts`` times). The actor is owned by the worker that created it, so
Ray ends it when that worker's process exits (Ray's fate sharing); ``close()``
(also at exit) kills it first.

Ray stays optional: this module imports it only when the placement is used.
"""
from __future__ import annotations

import json
import logging
import socket
from typing import Optional

from freespec.proposers.pearl.remote import DraftError, DraftServer, RemoteDraft

logger = logging.getLogger("freespec")

CONNECT_TIMEOUT_S = 10.0  # ray.init on an address nobody answers at waits for minutes: check the port first
INSTALL_HINT = "pip install 'vllm-freespec[cluster]'"


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ValueError(f'pearl: option \'placement\' is "ray", but Ray is not installed here ({e}); '
                         f"{INSTALL_HINT}") from e
    return ray


def connect(address: str):
    """Join the Ray cluster at ``address`` ("auto": the one this node belongs to); the ``ray`` module.

    A process already connected (a worker of vLLM's Ray executor, a test) keeps its connection.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    target = reachable(address)
    try:
        # configure_logging=False: leave the process's logging (vLLM's) alone.
        ray.init(address=target or address, configure_logging=False, ignore_reinit_error=True)
    except Exception as e:
        raise ValueError(f"pearl: option 'ray_address' ({address!r}): cannot join the Ray cluster: "
                         f"{type(e).__name__}: {e}") from e
    return ray


def reachable(address: str) -> Optional[str]:
    """host:port of the cluster ``address`` names, once something answers there (None: left to ray.init)."""
    target = resolve_address(address)
    if target is not None:
        host, _, port = target.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as e:
            raise ValueError(f"pearl: option 'ray_address' ({address!r}): no Ray cluster answers at {target} "
                             f"({e})") from e
    return target


def resolve_address(address: str) -> Optional[str]:
    """host:port of the cluster ``address`` names (``"auto"``: RAY_ADDRESS, or the cluster started on this node)."""
    if address != "auto":
        return address
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:  # Ray moved it: let ray.init resolve "auto" itself
        return None
    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except ConnectionError as e:
        raise ValueError(f"pearl: option 'ray_address' is \"auto\", but no Ray cluster can be reached from this "
                         f"node ({e}); start one (`ray start --head`) or set 'ray_address' to its host:port") from e


def actor_options(options: Optional[dict], threads: int, device: str) -> dict:
    """``.options()`` of the actor: the user's; by default num_cpus = draft_threads, one GPU for a cuda device."""
    out = dict(options or {})
    out.setdefault("num_cpus", threads)
    if device.startswith("cuda"):
        out.setdefault("num_gpus", 1)
    out["max_restarts"] = 0  # restarts are RemoteDraft's (bounded, logged, counted), not Ray's
    return out


def check_actor_options(options: dict) -> None:
    """Ray's own check of ``.options()`` arguments (names and types), as a ValueError naming the option."""
    ray = import_ray()
    try:
        ray.remote(DraftActor).options(**options)
    except Exception as e:
        raise ValueError(f"option 'ray_actor_options': {e}") from e


class DraftActor:
    """The Ray actor: a ``DraftServer`` behind plain ``str``/``bytes`` methods."""

    def __init__(self) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s pearl-draft[%(process)d] %(levelname)s %(message)s")
        self.server = DraftServer()

    def start(self, spec: str) -> str:
        import ray

        ctx = ray.get_runtime_context()
        return json.dumps(self.server.start(json.loads(spec), ray_node_id=ctx.get_node_id(),
                                            ray_actor_id=ctx.get_actor_id(),
                                            node_ip=ray.util.get_node_ip_address()))

    def call(self, msg: str, payload: Optional[bytes]) -> Optional[str]:
        reply = self.server.handle(json.loads(msg), payload)
        return None if reply is None else json.dumps(reply)

    def close(self) -> None:
        self.server.close()


class RayDraft(RemoteDraft):
    """vLLM's handle on the draft actor: ``RemoteDraft`` over Ray; see the module docstring."""

    kind = "draft actor"

    def __init__(self, spec: dict, *, address: str = "auto", options: Optional[dict] = None,
                 step_timeout_s: float = 30.0, max_restarts: int = 3) -> None:
        self._actor = None
        self._ready_ref = None
        super().__init__(spec, step_timeout_s=step_timeout_s, max_restarts=max_restarts)
        self.ray = connect(address)
        self.options = actor_options(options, int(spec.get("threads", 1)), spec.get("device", "cpu"))
        check_actor_options(self.options)
        self._actor_class = self.ray.remote(DraftActor).options(**self.options)
        self._warn_if_no_node_fits()

    @property
    def pid(self) -> Optional[int]:
        return self.info.get("pid") if self._ready else None

    def _warn_if_no_node_fits(self) -> None:
        need = {"CPU": self.options.get("num_cpus", 0), "GPU": self.options.get("num_gpus", 0),
                **self.options.get("resources", {})}
        need = {name: amount for name, amount in need.items() if amount}
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        if need and not any(all(n.get(name, 0) >= amount for name, amount in need.items()) for n in nodes):
            logger.warning("freespec: pearl: no node of the Ray cluster has %s now (nodes: %s); the draft actor "
                           "waits for one (an autoscaler may add it), at most FREESPEC_PEARL_START_TIMEOUT_S",
                           need, nodes)

    def _take_ready(self, header: dict) -> None:
        super()._take_ready(header)
        info = self.info
        logger.info("freespec: pearl draft runs in Ray actor %s on node %s (%s, pid %s)",
                    info.get("ray_actor_id"), info.get("node_ip"), info.get("host"), info.get("pid"))

    # -- the transport ------------------------------------------------------------
    def _launch(self) -> None:
        self._ready = False
        self._actor = self._actor_class.remote()
        self._ready_ref = self._actor.start.remote(json.dumps(self.spec))

    def _launched(self) -> bool:
        return self._actor is not None

    def _get(self, ref, timeout: float, what: str):
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        try:
            return self.ray.get(ref, timeout=timeout)
        except GetTimeoutError as e:
            raise DraftError(f"pearl: the draft actor did not answer {what} within {timeout:.0f} s") from e
        except RayActorError as e:
            raise DraftError(f"pearl: the draft actor died during {what} ({type(e).__name__})") from e
        except RayError as e:
            raise DraftError(f"pearl: the draft actor failed during {what} ({type(e).__name__}: {e})") from e

    def _poll_ready(self, timeout: float) -> Optional[dict]:
        done, _ = self.ray.wait([self._ready_ref], timeout=timeout)
        if not done:
            return None
        return json.loads(self._get(self._ready_ref, 10.0, "start"))

    def _call(self, msg: dict, payload: Optional[bytes], timeout: float, what: str) -> dict:
        if self._actor is None:
            raise DraftError("pearl: no draft actor")
        return json.loads(self._get(self._actor.call.remote(json.dumps(msg), payload), timeout, what))

    def _tell(self, msg: dict) -> None:
        # No reply awaited: a sync actor runs one caller's calls in order, so it lands before the next step.
        if self._actor is None:
            raise DraftError("pearl: no draft actor")
        self._actor.call.remote(json.dumps(msg), None)

    def _goodbye(self) -> None:
        if self._ready:
            self._get(self._actor.close.remote(), 5.0, "close")

    def _kill(self) -> None:
        actor, self._actor, self._ready_ref, self._ready = self._actor, None, None, False
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception as e:  # Ray already shut down at exit, or the actor is gone
                logger.debug("freespec: pearl: ray.kill of the draft actor: %s", e)

