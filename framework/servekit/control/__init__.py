"""The control plane: one model set for the whole server, beside the data plane.

The data plane (:mod:`servekit.dataplane.data_plane`) answers requests with what a
process has loaded; the control plane decides what that is, once for the
whole server:

- :mod:`.plan`: the model set as plain data (a *plan*) and the planner that
  reads the folders and keeps the operator's changes;
- :mod:`.owner`: the one owner of the plan, which polls, takes control calls
  and waits until every follower applied a change before it answers;
- :mod:`.transport`: the owner's socket, over which each worker follows the
  plans and sends its control calls;
- :mod:`.triton_load_config` and :mod:`.uploads`: what a Triton load may carry
  (a JSON model configuration, model files).

Protocols call :class:`ControlPlane` (``app.extensions["servekit.control"]``);
it reaches the owner wherever it runs.  See docs/model-control.md.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from servekit import errors
from servekit.control import long_lived, transport, uploads
from servekit.control.owner import APPLY_TIMEOUT, ConfigFolders, LocalLink, Owner
from servekit.control.plan import Planner

__all__ = ["ConfigFolders", "ControlPlane", "Owner", "Planner", "start_owner"]

log = logging.getLogger("servekit.control")


def start_owner(
    folders: dict[str, Path],
    *,
    roots: list[Path],
    batching: Any,
    explicit: bool,
    poll_interval: float,
    memory_budget: int = 0,
    config_folders: ConfigFolders | None = None,
) -> Any:
    """Make this process (the engine's top process, before it forks) the server's owner; returns a closer.

    ``config_folders``: where a TF Serving config reload's models are served from (``None``:
    their base paths; a front door that serves generated folders passes its own).
    """
    planner = Planner(folders, roots=roots, batching=batching, explicit=explicit)
    owner = Owner(planner, poll_interval=poll_interval, memory_budget=memory_budget, config_folders=config_folders)
    owner.start()
    return transport.serve(owner)


class ControlPlane:
    """The control calls of one process, and how its repository follows the model set.

    Three cases, told apart by the environment :func:`start_owner` leaves:

    - a worker of a server: the owner is in the engine's top process; the
      repository follows its plans and calls go over its socket;
    - the top process itself (which loads models once before forking, with
      ``--preload``): it applies the owner's plan directly;
    - a one-process app (tests, no engine): an owner of its own, over this
      repository's planner, with the repository as its only follower.
    """

    def __init__(
        self,
        repository: Any,
        *,
        poll_interval: float = 0.0,
        apply_timeout: float = APPLY_TIMEOUT,
        memory_budget: int = 0,
        request_timeout: float | None = None,
    ):
        self.repository = repository
        self.poll_interval = poll_interval
        self.apply_timeout = apply_timeout
        self.memory_budget = memory_budget
        self.request_timeout = request_timeout or None
        self._own: Owner | None = None
        self._started = False

    def _owner(self) -> Owner | None:
        """The owner in this process; ``None`` when it is another process's."""
        found = transport.local_owner()
        if found is not None:
            return found
        if transport.address() is not None:
            return None
        if self._own is None:
            self._own = Owner(
                self.repository.planner, poll_interval=self.poll_interval, memory_budget=self.memory_budget
            )
            self._own.apply_timeout = self.apply_timeout
            self._own.links.append(LocalLink(self.repository))
        return self._own

    # -- following ------------------------------------------------------------------

    def start(self) -> None:
        """Begin serving: load what the model set says, then follow its changes (once)."""
        if self._started:
            return
        self._started = True
        self.repository.after_change = long_lived.settle
        owner = self._owner()
        if owner is None:
            self.repository.expect_plan()
            transport.follow(self.repository)
        elif owner is self._own:
            threading.Thread(target=self._run_alone, args=(owner,), name="servekit-control", daemon=True).start()

    def _run_alone(self, owner: Owner) -> None:
        try:
            owner.refresh_now()  # its one follower, the repository, applies the plan
        except Exception:
            log.exception("the first load failed")
            self.repository.mark_ready()  # answers (with the errors) rather than waiting for ever
        owner.start()

    def load_now(self) -> None:
        """Load what the model set says in this thread (``--preload``, before the fork)."""
        self.repository.after_change = long_lived.settle
        owner = self._owner()
        if owner is None:
            self.repository.apply(transport.call("plan"))
        elif owner is self._own:
            owner.refresh_now()  # its one follower, the repository, applies the plan
        else:
            self.repository.apply(owner.planner.plan)

    def stop(self) -> None:
        if self._own is not None:
            self._own.stop()

    # -- control calls ----------------------------------------------------------------

    def call(self, op: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """``op`` on the owner, wherever it runs; ``timeout`` bounds the wait for another process's."""
        owner = self._owner()
        if owner is None:
            return transport.call(op, timeout=timeout, **kwargs)
        return owner.call(op, **kwargs)

    def load(self, name: str, config: Any = None, files: dict[str, bytes] | None = None) -> None:
        """Triton's load; answers when every worker serves the model, else raises why not.

        The files' names and sizes are checked here first (:func:`.uploads.check`): a refused
        upload is answered without reaching the owner.
        """
        if files:
            uploads.check(name, files)
        self.call("load", name=name, config=config, files=files)

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Triton's unload; answers when no worker serves the model any more."""
        self.call("unload", name=name, unload_dependents=unload_dependents)

    def replace(self, models: dict[str, tuple[str, dict[str, Any]]]) -> None:
        """Serve exactly these models: name -> (folder, settings over its servekit.yaml)."""
        self.call("replace", models=models)

    def ensure(self, name: str) -> None:
        """Load a model the memory budget unloaded, for a request that waits (``--request-timeout``).

        :raises NotResident: it did not load in time (503 with ``Retry-After``).
        """
        try:
            self.call("ensure", timeout=self.request_timeout, name=name)
        except (errors.Timeout, errors.NotReady) as exc:
            raise errors.NotResident(f"model {name!r} is loading again (memory budget): {exc.message}") from None

    def register_region(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """Triton's system shared-memory register; answers when every worker can read the region."""
        self.call("register_region", name=name, key=key, offset=offset, byte_size=byte_size)

    def unregister_region(self, name: str = "") -> None:
        """Triton's system shared-memory unregister: one region, or every one (no name)."""
        self.call("unregister_region", name=name)

    def reload_config(self, models: list[dict[str, Any]]) -> None:
        """TF Serving's ``HandleReloadConfigRequest``: serve exactly these models."""
        self.call("reload_config", models=models)
