"""An api pod's start and stop: at start it connects its services to the fleet (Redis, the
event hub, the tenants' limits, the batch driver, the server tools, router mode's router);
on SIGTERM/SIGINT it drains; once stopped it lets go of them. A background task the pod needs
that dies ends the process, for its supervisor to restart it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from sanic import Sanic

from api.batch.driver import BatchDriver
from api.fleet import Fleet
from api.prompt_log import PromptLog
from api.router import ModelRouter
from api.sanic_app import HARD_STOP_MARGIN_S, exit_by_force_after
from api.services import PodServices
from api.tenants.service import TenantService
from api.tools.service import ToolsConfig, ToolsService
from scheduler.contract.errors import Unavailable
from scheduler.supervise import exit_when_done
from scheduler.tenant_limits import TenantLimits
from storage.results import ResultStore

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0
"""Once drained, how long Sanic waits for connections still busy before it drops them."""
EXIT_TASK_DIED = 70


def _exit_for_restart() -> None:
    """A background task the pod needs died: exit non-zero so that a supervisor restarts us."""
    logging.shutdown()
    os._exit(EXIT_TASK_DIED)


class PodLifecycle:
    """The listeners of one pod's app (`add_lifecycle`), over its services."""

    def __init__(self, pod: PodServices, redis_url: str, tools_config: ToolsConfig | None
                 ) -> None:
        self.pod = pod
        self.redis_url = redis_url
        self.tools_config = tools_config
        self.batch_driver: BatchDriver | None = None
        """Runs the fleet's batches (api/batch/), from start to the drain."""
        self.startup_loads: asyncio.Future[None] | None = None
        """Router mode: the models loaded at start (--models-autoload)."""

    async def connect(self, app: Sanic) -> None:
        pod, settings = self.pod, self.pod.settings
        pod.fleet = await Fleet.connect(self.redis_url, float(settings.timeout),
                                        settings.queue_max, settings.n_probs_max,
                                        settings.prefix_affinity,
                                        # one job per tenant: no coalescing
                                        settings.coalesce_embeddings
                                        and not pod.directory.enabled,
                                        max(0, settings.migration_limit),
                                        settings.cold_start_timeout,
                                        PromptLog(Path(settings.log_prompts_dir))
                                        if settings.log_prompts_dir else None)
        pod.fleet.jobs.fair_share = settings.fair_share
        exit_when_done(pod.fleet.hub.reader, "event hub", _exit_for_restart)
        pod.tenants = TenantService(pod.directory, TenantLimits(pod.fleet.redis))
        renewing = asyncio.create_task(pod.tenants.renew_forever())
        exit_when_done(renewing, "tenant holds renewal", _exit_for_restart)
        pod.fleet.jobs.results = ResultStore(pod.store)
        self.batch_driver = BatchDriver(pod.fleet, settings, pod.store, pod.tenants)
        driving = asyncio.create_task(self.batch_driver.run())
        exit_when_done(driving, "batch driver", _exit_for_restart)
        if self.tools_config is not None:
            tools = ToolsService(self.tools_config)
            await tools.start()
            pod.tools = tools
        features = [*(self.tools_config.features() if self.tools_config else []),
                    *(["MCP proxy (experimental)"] if settings.cors_proxy_on() else [])]
        if features:
            log.warning("security: %s enabled - do not expose to untrusted environments",
                        ", ".join(features))
        if settings.router_mode():
            router = await ModelRouter.create(settings, pod.fleet.redis)
            pod.router = router
            relay = asyncio.ensure_future(router.relay(pod.fleet.redis))
            exit_when_done(relay, "model events relay", _exit_for_restart)
            self.startup_loads = asyncio.ensure_future(router.load_on_startup())

    async def drain_on_signal(self, app: Sanic) -> None:
        """SIGTERM/SIGINT (replacing Sanic's handlers, which stop the loop at once): refuse new
        requests (503, so a balancer sends them elsewhere), let the requests that wait for jobs
        finish up to --drain-timeout, then stop. A second signal stops at once. SIGHUP reads
        the --tenants file again."""
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if self.pod.draining:
                app.stop(terminate=False)
                return
            self.pod.draining = True
            exit_by_force_after(self.pod.settings.drain_timeout + HARD_STOP_MARGIN_S)
            app.add_task(self.drain_then_stop(app))

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)

        def on_hangup() -> None:  # the --tenants file again (off the loop: it may be on S3)
            app.add_task(asyncio.to_thread(self.pod.directory.reload))

        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, on_hangup)

    async def drain_then_stop(self, app: Sanic) -> None:
        pod = self.pod
        if self.batch_driver is not None:  # another pod takes its batches over at once
            await self.batch_driver.close()
        if pod.tools is not None:  # MCP calls in flight end now, with an error
            await pod.tools.close()
        jobs = pod.fleet.jobs
        drain_timeout = pod.settings.drain_timeout
        deadline = time.monotonic() + drain_timeout
        log.info("draining: %d open requests have up to %g s", jobs.active, drain_timeout)
        while jobs.active and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if jobs.active:
            log.warning("drain timeout: ending %d open requests", jobs.active)
            jobs.end_all(Unavailable("the server is shutting down"))
            await asyncio.sleep(CLOSE_GRACE_S)  # their error events go out
        app.stop(terminate=False)

    async def disconnect(self, app: Sanic) -> None:
        if self.batch_driver is not None:
            await self.batch_driver.close()
        if self.pod.tools is not None:
            await self.pod.tools.close()
        await self.pod.fleet.close()


def add_lifecycle(app: Sanic, pod: PodServices, redis_url: str,
                  tools_config: ToolsConfig | None) -> None:
    lifecycle = PodLifecycle(pod, redis_url, tools_config)
    app.before_server_start(lifecycle.connect)
    app.after_server_start(lifecycle.drain_on_signal)
    app.after_server_stop(lifecycle.disconnect)
