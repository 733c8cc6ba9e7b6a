"""The synchronous twin: Warren, Sandbox, Process, SyncExecStream and
SandboxGroup.

Nothing is implemented twice: each sync object wraps its async counterpart
and runs its coroutines on a private event loop in a daemon thread. Ctrl-C
(KeyboardInterrupt) while a call waits cancels the call on that loop, which
closes its HTTP request, so the daemon stops the work (an exec is killed);
``with`` blocks still delete their sandbox."""

from __future__ import annotations

import asyncio
import signal as _signal
import threading
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    BinaryIO,
    Callable,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from ._async import (
    AsyncProcess,
    AsyncSandbox,
    AsyncSandboxGroup,
    AsyncWarren,
    Command,
    Data,
    ExecJob,
    ExecStream,
    DirWatch,
    ImagePull,
    ProcessAttach,
    Names,
    READ_MAX_BYTES,
    PathLike,
    Sink,
    TarSource,
)
from ._archive import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES
from ._retry import RetryPolicy
from ._types import (
    ByLabelEvent,
    ByLabelResult,
    DownloadStats,
    ExecEvent,
    ExecResult,
    FileEvent,
    FileInfo,
    Image,
    Layer,
    LayerStat,
    LayerVerification,
    ProcessEvent,
    PauseResult,
    Screenshot,
    InputEvent,
    HibernateResult,
    ProcessInfo,
    PullEvent,
    Resources,
    ResumeResult,
    NetworkArg,
    RlimitsArg,
    RunResult,
    SandboxInfo,
    SandboxStats,
    SecurityEvent,
    Step,
    NodeStatus,
    VersionInfo,
)
from .batch import BatchResult
from .errors import WarrenError

__all__ = ["Warren", "Sandbox", "Process", "SyncExecStream", "SyncImagePull", "SyncProcessAttach", "SyncDirWatch", "SandboxGroup"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    #: How long a cancelled call may take to wind down (closing its request)
    #: before the interrupt is re-raised in the caller's thread.
    cancel_grace = 5.0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._closed = False
        self.thread = threading.Thread(target=self._main, name="warren-sync-loop", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def run(self, aw: Awaitable[T]) -> T:
        """Run ``aw`` on the loop and return its result (or raise its error)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("the synchronous Warren API cannot be called from its own event loop thread")
        if self._closed:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise RuntimeError("the client is closed")
        done = threading.Event()
        box: List[Tuple[bool, Any]] = []
        holder: List["asyncio.Task[None]"] = []

        async def main() -> None:
            try:
                box.append((True, await aw))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box.append((False, e))
            finally:
                done.set()

        def start() -> None:
            holder.append(self.loop.create_task(main()))

        def cancel() -> None:
            if holder:
                holder[0].cancel()

        self.loop.call_soon_threadsafe(start)
        try:
            # Wake up now and then: a signal handled by another thread (or
            # _thread.interrupt_main) only raises here between waits.
            while not done.wait(0.2):
                pass
        except BaseException:
            # Interrupted (Ctrl-C): cancel the call, give it a moment to
            # close its request, then let the interrupt go on.
            self.loop.call_soon_threadsafe(cancel)
            done.wait(self.cancel_grace)
            raise
        ok, value = box[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, final: Optional[Awaitable[Any]] = None) -> None:
        if self._closed:
            return
        if final is not None:
            try:
                self.run(final)
            except Exception:  # noqa: BLE001
                pass
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


class Warren:
    """The synchronous client. Same arguments and behaviour as
    :class:`~warren.AsyncWarren`, whose implementation it runs on a private
    event loop thread::

        with Warren() as w:
            with w.create("busybox") as sb:
                print(sb.exec("uname -a").text)
    """

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        token: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout: float = 60.0,
        create_timeout: float = 300.0,
        exec_timeout: float = 600.0,
        deadline_margin: float = 15.0,
        transfer_timeout: float = 600.0,
        max_connections: int = 512,
        retry: Optional[RetryPolicy] = None,
        on_truncation: str = "warn",
        user_agent: str = "warren-python",
        ssl: Any = None,
    ) -> None:
        self.aio = AsyncWarren(
            addr,
            token=token,
            labels=labels,
            timeout=timeout,
            create_timeout=create_timeout,
            exec_timeout=exec_timeout,
            deadline_margin=deadline_margin,
            transfer_timeout=transfer_timeout,
            max_connections=max_connections,
            retry=retry,
            on_truncation=on_truncation,
            user_agent=user_agent,
            ssl=ssl,
        )
        self._runner = _LoopThread()

    def _run(self, aw: Awaitable[T]) -> T:
        return self._runner.run(aw)

    @property
    def addr(self) -> str:
        return self.aio.addr

    def __enter__(self) -> "Warren":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool and stop the loop thread."""
        if not self._runner.closed:
            self._runner.close(self.aio.close())

    def __repr__(self) -> str:
        return f"<Warren {self.addr}>"

    # -- sandboxes -------------------------------------------------------

    def create(
        self,
        image: str,
        *,
        id: Optional[str] = None,
        backend: Optional[str] = None,
        resources: Optional[Resources] = None,
        cpu_millis: int = 0,
        memory_bytes: int = 0,
        pids_max: int = 0,
        disk_bytes: int = 0,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        hostname: Optional[str] = None,
        layers: Optional[Sequence[str]] = None,
        user: Optional[str] = None,
        keep_etc: bool = False,
        allow_setuid: bool = False,
        user_namespace: Optional[bool] = None,
        rlimits: Optional[RlimitsArg] = None,
        network: Optional[NetworkArg] = None,
        harness: bool = False,
        max_children: int = 0,
        call_timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> "Sandbox":
        """Create a sandbox (see :meth:`AsyncWarren.create`). Use the result in
        a ``with`` block to delete it at the end."""
        ctx = self.aio.create(
            image,
            id=id,
            backend=backend,
            resources=resources,
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            pids_max=pids_max,
            disk_bytes=disk_bytes,
            env=env,
            workdir=workdir,
            labels=labels,
            timeout_seconds=timeout_seconds,
            hostname=hostname,
            layers=layers,
            user=user,
            keep_etc=keep_etc,
            allow_setuid=allow_setuid,
            user_namespace=user_namespace,
            rlimits=rlimits,
            network=network,
            harness=harness,
            max_children=max_children,
            call_timeout=call_timeout,
            qos=qos,
            qos_cpus=qos_cpus,
        )
        return Sandbox(self, self._run(_await(ctx)))

    def get(self, id: str, *, timeout: Optional[float] = None) -> "Sandbox":
        return Sandbox(self, self._run(self.aio.get(id, timeout=timeout)))

    def sandbox(self, id: str) -> "Sandbox":
        return Sandbox(self, self.aio.sandbox(id))

    def list(
        self,
        labels: Optional[Mapping[str, str]] = None,
        *,
        page_size: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> List["Sandbox"]:
        """The sandboxes carrying all of ``labels``, oldest first, paging
        through ``page_size`` at a time (see :meth:`AsyncWarren.list`)."""
        return [Sandbox(self, a) for a in self._run(self.aio.list(labels, page_size=page_size, timeout=timeout))]

    def delete(self, id: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.delete(id, missing_ok=missing_ok, timeout=timeout))

    def delete_all(
        self, labels: Mapping[str, str], *, concurrency: int = 32, allow_all: bool = False, timeout: Optional[float] = None
    ) -> List[str]:
        return self._run(self.aio.delete_all(labels, concurrency=concurrency, allow_all=allow_all, timeout=timeout))

    def extend_timeout(self, id: str, seconds: float, *, timeout: Optional[float] = None) -> SandboxInfo:
        return self._run(self.aio.extend_timeout(id, seconds, timeout=timeout))

    def update_sandbox(
        self,
        id: str,
        *,
        cpu_millis: Optional[int] = None,
        memory_bytes: Optional[int] = None,
        pids_max: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        set_labels: Optional[Mapping[str, str]] = None,
        remove_labels: Optional[Sequence[str]] = None,
        network: Optional[NetworkArg] = None,
        timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> SandboxInfo:
        """See :meth:`AsyncWarren.update_sandbox` (all or nothing)."""
        return self._run(
            self.aio.update_sandbox(
                id,
                cpu_millis=cpu_millis,
                memory_bytes=memory_bytes,
                pids_max=pids_max,
                timeout_seconds=timeout_seconds,
                set_labels=set_labels,
                remove_labels=remove_labels,
                network=network,
                timeout=timeout,
                qos=qos,
                qos_cpus=qos_cpus,
            )
        )

    def commit_sandbox(
        self, id: str, name: str, *, keep_setuid: bool = False, timeout: Optional[float] = None
    ) -> Layer:
        """Make sandbox ``id``'s writable layer the named layer ``name`` (see :meth:`Sandbox.commit`)."""
        return self._run(self.aio.commit_sandbox(id, name, keep_setuid=keep_setuid, timeout=timeout))

    # -- pause and resume ------------------------------------------------

    def pause(self, id: str, *, reclaim: bool = False, timeout: Optional[float] = None) -> PauseResult:
        """Freeze sandbox ``id`` in place (see :meth:`AsyncWarren.pause`)."""
        return self._run(self.aio.pause(id, reclaim=reclaim, timeout=timeout))

    def screenshot(self, id: str, *, timeout: Optional[float] = None) -> Screenshot:
        """Sandbox ``id``'s screen as a PNG (see :meth:`AsyncWarren.screenshot`)."""
        return self._run(self.aio.screenshot(id, timeout=timeout))

    def send_input(
        self, id: str, events: Sequence[InputEvent] = (), *, text: str = "", timeout: Optional[float] = None
    ) -> None:
        """Keys and pointer events to sandbox ``id``'s screen (see :meth:`AsyncWarren.send_input`)."""
        return self._run(self.aio.send_input(id, events, text=text, timeout=timeout))

    def resume(self, id: str, *, lazy_pages: Optional[bool] = None, timeout: Optional[float] = None) -> ResumeResult:
        """Thaw paused sandbox ``id``, or restore hibernated sandbox ``id``."""
        return self._run(self.aio.resume(id, lazy_pages=lazy_pages, timeout=timeout))

    def restore(self, id: str, *, timeout: Optional[float] = None) -> ResumeResult:
        """Restore hibernated sandbox ``id`` here, from another node if need be (see :meth:`AsyncWarren.restore`)."""
        return self._run(self.aio.restore(id, timeout=timeout))

    def hibernate(self, id: str, *, timeout: Optional[float] = None) -> HibernateResult:
        """Checkpoint sandbox ``id`` to disk (see :meth:`AsyncWarren.hibernate`)."""
        return self._run(self.aio.hibernate(id, timeout=timeout))

    def fork(
        self,
        id: str,
        n: int = 1,
        *,
        labels: Optional[Mapping[str, str]] = None,
        lifetime: Optional[float] = None,
        lazy_pages: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> List["Sandbox"]:
        """``n`` copies of sandbox ``id`` (see :meth:`AsyncWarren.fork`)."""
        forks = self._run(self.aio.fork(id, n, labels=labels, lifetime=lifetime, lazy_pages=lazy_pages, timeout=timeout))
        return [Sandbox(self, f) for f in forks]

    def hibernate_by_label(
        self,
        labels: Mapping[str, str],
        *,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Hibernate every RUNNING or PAUSED sandbox matching ``labels``."""
        return self._run(self.aio.hibernate_by_label(labels, parallelism=parallelism, progress=progress, timeout=timeout))

    def pause_by_label(
        self,
        labels: Mapping[str, str],
        *,
        reclaim: bool = False,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Pause every RUNNING sandbox matching ``labels``, with progress
        (see :meth:`AsyncWarren.pause_by_label`)."""
        return self._run(
            self.aio.pause_by_label(labels, reclaim=reclaim, parallelism=parallelism, progress=progress, timeout=timeout)
        )

    def resume_by_label(
        self,
        labels: Mapping[str, str],
        *,
        parallelism: int = 0,
        progress: Optional[Callable[[ByLabelEvent], Any]] = None,
        timeout: Optional[float] = None,
    ) -> ByLabelResult:
        """Resume every PAUSED or HIBERNATED sandbox matching ``labels``."""
        return self._run(self.aio.resume_by_label(labels, parallelism=parallelism, progress=progress, timeout=timeout))

    # -- images ----------------------------------------------------------

    def list_images(self, *, timeout: Optional[float] = None) -> List[Image]:
        return self._run(self.aio.list_images(timeout=timeout))

    def get_image(self, name: str, *, timeout: Optional[float] = None) -> Image:
        return self._run(self.aio.get_image(name, timeout=timeout))

    def import_image(self, name: str, path: str, *, timeout: Optional[float] = None) -> Image:
        return self._run(self.aio.import_image(name, path, timeout=timeout))

    def upload_image(self, name: str, source: TarSource, *, timeout: Optional[float] = None) -> Image:
        return self._run(self.aio.upload_image(name, source, timeout=timeout))

    def remove_image(self, name: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.remove_image(name, missing_ok=missing_ok, timeout=timeout))

    def pull_image(
        self,
        ref: str,
        name: Optional[str] = None,
        *,
        platform: Optional[str] = None,
        progress: Optional[Callable[[PullEvent], object]] = None,
        timeout: Optional[float] = None,
    ) -> Image:
        """Pull an OCI or Docker image (see :meth:`AsyncWarren.pull_image`)
        and return it. ``progress`` is called with every :class:`PullEvent`,
        in the calling thread; :meth:`pull_image_stream` iterates over them
        instead."""
        with self.pull_image_stream(ref, name, platform=platform, timeout=timeout) as st:
            for ev in st:
                if progress is not None:
                    progress(ev)
            return st.wait()

    def pull_image_stream(
        self,
        ref: str,
        name: Optional[str] = None,
        *,
        platform: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "SyncImagePull":
        """Pull an image and iterate over its :class:`PullEvent` objects (the
        last carries the image, also in ``.image`` afterwards); use it in a
        ``with`` block, which stops the pull when left early."""
        return SyncImagePull(self, self.aio.pull_image(ref, name, platform=platform, timeout=timeout))

    # -- named layers ----------------------------------------------------

    def build_layer(
        self,
        name: str,
        source: Optional[TarSource] = None,
        *,
        path: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Layer:
        """Make a directory tree or tarball the named layer ``name`` (see
        :meth:`AsyncWarren.build_layer`): ``source`` is uploaded, ``path``
        is read by the daemon."""
        return self._run(self.aio.build_layer(name, source, path=path, timeout=timeout))

    def list_layers(self, *, timeout: Optional[float] = None) -> List[Layer]:
        return self._run(self.aio.list_layers(timeout=timeout))

    def remove_layer(self, name: str, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.remove_layer(name, missing_ok=missing_ok, timeout=timeout))

    # -- image store -----------------------------------------------------

    def image_stats(self, names: Names = None, *, timeout: Optional[float] = None) -> List[LayerStat]:
        return self._run(self.aio.image_stats(names, timeout=timeout))

    def verify_image(self, names: Names = None, *, timeout: Optional[float] = None) -> List[LayerVerification]:
        return self._run(self.aio.verify_image(names, timeout=timeout))

    # -- system ----------------------------------------------------------

    def run(
        self,
        image: str,
        command: Any = None,
        *,
        steps: Optional[Sequence[Step]] = None,
        backend: str = "fncall",
        gpus: int = 0,
        shared_gpu: bool = False,
        timeout: Optional[float] = None,
        **step_options: Any,
    ) -> RunResult:
        """See :meth:`AsyncWarren.run`."""
        return self._run(
            self.aio.run(
                image, command, steps=steps, backend=backend, gpus=gpus, shared_gpu=shared_gpu, timeout=timeout, **step_options
            )
        )

    def run_batch(
        self,
        image: str,
        jobs: Sequence[Any],
        *,
        parallelism: int = 0,
        backend: str = "fncall",
        gpus: int = 0,
        shared_gpu: bool = False,
        timeout: Optional[float] = None,
    ) -> List[Tuple[int, Union[RunResult, WarrenError]]]:
        """See :meth:`AsyncWarren.run_batch`: the items in completion order."""

        async def collect() -> List[Tuple[int, Union[RunResult, WarrenError]]]:
            return [
                item
                async for item in self.aio.run_batch(
                    image, jobs, parallelism=parallelism, backend=backend, gpus=gpus, shared_gpu=shared_gpu, timeout=timeout
                )
            ]

        return self._run(collect())

    def version(self, *, timeout: Optional[float] = None) -> VersionInfo:
        return self._run(self.aio.version(timeout=timeout))

    def nodes(self, *, timeout: Optional[float] = None) -> List[NodeStatus]:
        """The cluster's nodes through a gateway, or the one node (see :meth:`AsyncWarren.nodes`)."""
        return self._run(self.aio.nodes(timeout=timeout))

    def health(self, *, timeout: Optional[float] = None) -> bool:
        return self._run(self.aio.health(timeout=timeout))

    def metrics(self, *, timeout: Optional[float] = None) -> str:
        return self._run(self.aio.metrics(timeout=timeout))

    # -- batches ---------------------------------------------------------

    def create_many(
        self,
        n: int,
        image: str,
        *,
        concurrency: int = 16,
        strict: bool = False,
        ids: Optional[Sequence[str]] = None,
        **create_kwargs: Any,
    ) -> "SandboxGroup":
        """Create ``n`` sandboxes concurrently (see :meth:`AsyncWarren.create_many`)."""
        ctx = self.aio.create_many(n, image, concurrency=concurrency, strict=strict, ids=ids, **create_kwargs)
        return SandboxGroup(self, self._run(_await(ctx)))

    def batch_create(self, n: int, image: str, *, strict: bool = False, **create_kwargs: Any) -> "SandboxGroup":
        """Create ``n`` sandboxes from one template in one ``BatchCreate``
        call (see :meth:`AsyncWarren.batch_create`: partial failures are in
        ``group.errors``; not retried once sent, and a call that fails
        without an answer deletes what it may have made)."""
        ctx = self.aio.batch_create(n, image, strict=strict, **create_kwargs)
        return SandboxGroup(self, self._run(_await(ctx)))

    def exec_many(
        self,
        jobs: Iterable[Union[ExecJob, Tuple[Union["Sandbox", AsyncSandbox, str], Command]]],
        *,
        concurrency: Optional[int] = None,
        **exec_kwargs: Any,
    ) -> BatchResult[ExecResult]:
        """Run many commands concurrently (see :meth:`AsyncWarren.exec_many`)."""
        return self._run(self.aio.exec_many(jobs, concurrency=concurrency, **exec_kwargs))


async def _await(aw: Awaitable[T]) -> T:
    return await aw


def _iterate(client: Warren, agen: AsyncIterator[T]) -> Iterator[T]:
    """A synchronous generator over an async one, each step run on the
    client's loop; closing it (or dropping it) closes the async one."""
    try:
        while True:
            try:
                item = client._run(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            client._run(agen.aclose())  # type: ignore[attr-defined]
        except RuntimeError:
            pass  # the client is closed


class Sandbox:
    """The synchronous handle on a sandbox (see :class:`AsyncSandbox`). In a
    ``with`` block it is deleted at the end, also on exceptions and Ctrl-C."""

    def __init__(self, client: Warren, aio: AsyncSandbox) -> None:
        self.client = client
        self.aio = aio

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def info(self) -> SandboxInfo:
        return self.aio.info

    @property
    def layers(self) -> Tuple[str, ...]:
        """The named layers on the sandbox's image, bottom first (from ``info``)."""
        return self.aio.layers

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state.name.lower()}>"

    def _run(self, aw: Awaitable[T]) -> T:
        return self.client._run(aw)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        self._run(self.aio.__aexit__(et, e, tb))

    def refresh(self, *, timeout: Optional[float] = None) -> SandboxInfo:
        return self._run(self.aio.refresh(timeout=timeout))

    def delete(self, *, missing_ok: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.delete(missing_ok=missing_ok, timeout=timeout))

    def extend_timeout(self, seconds: float, *, timeout: Optional[float] = None) -> SandboxInfo:
        return self._run(self.aio.extend_timeout(seconds, timeout=timeout))

    def update(
        self,
        *,
        cpu_millis: Optional[int] = None,
        memory_bytes: Optional[int] = None,
        pids_max: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        set_labels: Optional[Mapping[str, str]] = None,
        remove_labels: Optional[Sequence[str]] = None,
        network: Optional[NetworkArg] = None,
        timeout: Optional[float] = None,
        qos: Optional[str] = None,
        qos_cpus: Optional[Sequence[int]] = None,
    ) -> SandboxInfo:
        """See :meth:`AsyncSandbox.update` (all or nothing)."""
        return self._run(
            self.aio.update(
                cpu_millis=cpu_millis,
                memory_bytes=memory_bytes,
                pids_max=pids_max,
                timeout_seconds=timeout_seconds,
                set_labels=set_labels,
                remove_labels=remove_labels,
                network=network,
                timeout=timeout,
                qos=qos,
                qos_cpus=qos_cpus,
            )
        )

    def screenshot(self, *, timeout: Optional[float] = None) -> Screenshot:
        """The sandbox's screen as a PNG (see :meth:`AsyncWarren.screenshot`)."""
        return self._run(self.aio.screenshot(timeout=timeout))

    def send_input(self, events: Sequence[InputEvent] = (), *, text: str = "", timeout: Optional[float] = None) -> None:
        """Keys and pointer events to the sandbox's screen (see :meth:`AsyncWarren.send_input`)."""
        return self._run(self.aio.send_input(events, text=text, timeout=timeout))

    def pause(self, *, reclaim: bool = False, timeout: Optional[float] = None) -> PauseResult:
        """Freeze the sandbox in place (see :meth:`AsyncWarren.pause`)."""
        return self._run(self.aio.pause(reclaim=reclaim, timeout=timeout))

    def resume(self, *, lazy_pages: Optional[bool] = None, timeout: Optional[float] = None) -> ResumeResult:
        """Thaw the paused sandbox, or restore the hibernated one."""
        return self._run(self.aio.resume(lazy_pages=lazy_pages, timeout=timeout))

    def hibernate(self, *, timeout: Optional[float] = None) -> HibernateResult:
        """Checkpoint the sandbox to disk (see :meth:`AsyncWarren.hibernate`)."""
        return self._run(self.aio.hibernate(timeout=timeout))

    def fork(
        self,
        n: int = 1,
        *,
        labels: Optional[Mapping[str, str]] = None,
        lifetime: Optional[float] = None,
        lazy_pages: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> List["Sandbox"]:
        """``n`` copies of the sandbox (see :meth:`AsyncWarren.fork`)."""
        forks = self._run(self.aio.fork(n, labels=labels, lifetime=lifetime, lazy_pages=lazy_pages, timeout=timeout))
        return [Sandbox(self.client, f) for f in forks]

    def commit(self, name: str, *, keep_setuid: bool = False, timeout: Optional[float] = None) -> Layer:
        """Make the sandbox's writable layer the named layer ``name`` (see
        :meth:`AsyncSandbox.commit`: setuid bits and file capabilities are
        stripped unless ``keep_setuid``). Not retried once sent."""
        return self._run(self.aio.commit(name, keep_setuid=keep_setuid, timeout=timeout))

    def exec(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        check: bool = False,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> ExecResult:
        """Run a command to completion (see :meth:`AsyncSandbox.exec`)."""
        return self._run(
            self.aio.exec(
                command,
                env=env,
                cwd=cwd,
                user=user,
                stdin=stdin,
                timeout=timeout,
                output_limit=output_limit,
                idempotency_key=idempotency_key,
                check=check,
                pty=pty,
                rows=rows,
                cols=cols,
            )
        )

    def exec_stream(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> "SyncExecStream":
        """Run a command and iterate over its output events (see
        :meth:`AsyncSandbox.exec_stream`); use it in a ``with`` block."""
        st = self.aio.exec_stream(
            command,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin,
            timeout=timeout,
            output_limit=output_limit,
            idempotency_key=idempotency_key,
            pty=pty,
            rows=rows,
            cols=cols,
        )
        return SyncExecStream(self.client, st)

    def start(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        stdin: Optional[Data] = None,
        timeout: Optional[float] = None,
        output_limit: Optional[int] = None,
        call_timeout: Optional[float] = None,
        pty: bool = False,
        rows: Optional[int] = None,
        cols: Optional[int] = None,
    ) -> "Process":
        """Start a background process (see :meth:`AsyncSandbox.start`)."""
        p = self._run(
            self.aio.start(
                command,
                env=env,
                cwd=cwd,
                user=user,
                stdin=stdin,
                timeout=timeout,
                output_limit=output_limit,
                call_timeout=call_timeout,
                pty=pty,
                rows=rows,
                cols=cols,
            )
        )
        return Process(self, p)

    def processes(self, *, timeout: Optional[float] = None) -> List["Process"]:
        return [Process(self, p) for p in self._run(self.aio.processes(timeout=timeout))]

    def process(self, process_id: str) -> "Process":
        return Process(self, self.aio.process(process_id))

    def trajectory(self, session_id: Optional[str] = None, *, timeout: Optional[float] = None) -> List[Any]:
        """The sandbox's trajectory log (see :meth:`AsyncSandbox.trajectory`)."""
        return self._run(self.aio.trajectory(session_id, timeout=timeout))

    def events(self, *, timeout: Optional[float] = None) -> List[SecurityEvent]:
        """The sandbox's security events, oldest first (see :meth:`AsyncSandbox.events`)."""
        return self._run(self.aio.events(timeout=timeout))

    def read_file(
        self,
        path: str,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = READ_MAX_BYTES,
        timeout: Optional[float] = None,
    ) -> bytes:
        """Read a file into memory, at most ``max_bytes`` (see :meth:`AsyncSandbox.read_file`)."""
        return self._run(self.aio.read_file(path, offset=offset, length=length, max_bytes=max_bytes, timeout=timeout))

    def iter_file(
        self,
        path: str,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = None,
        chunk_size: int = 8 << 20,
        timeout: Optional[float] = None,
    ) -> Iterator[bytes]:
        """A file's content in chunks (see :meth:`AsyncSandbox.iter_file`)."""
        return _iterate(
            self.client,
            self.aio.iter_file(
                path, offset=offset, length=length, max_bytes=max_bytes, chunk_size=chunk_size, timeout=timeout
            ),
        )

    def read_file_to(
        self,
        path: str,
        dest: Sink,
        *,
        offset: int = 0,
        length: Optional[int] = None,
        max_bytes: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> int:
        """Stream a file into a local path or file object (see :meth:`AsyncSandbox.read_file_to`)."""
        return self._run(
            self.aio.read_file_to(path, dest, offset=offset, length=length, max_bytes=max_bytes, timeout=timeout)
        )

    def read_text(self, path: str, *, encoding: str = "utf-8", timeout: Optional[float] = None) -> str:
        return self._run(self.aio.read_text(path, encoding=encoding, timeout=timeout))

    def write_file(
        self,
        path: str,
        data: Data,
        *,
        mode: Optional[int] = None,
        append: bool = False,
        make_parents: bool = False,
        timeout: Optional[float] = None,
    ) -> None:
        self._run(self.aio.write_file(path, data, mode=mode, append=append, make_parents=make_parents, timeout=timeout))

    def list_files(self, path: str, *, page_size: Optional[int] = None, timeout: Optional[float] = None) -> List[FileInfo]:
        return self._run(self.aio.list_files(path, page_size=page_size, timeout=timeout))

    def iter_files(
        self, path: str, *, page_size: Optional[int] = None, timeout: Optional[float] = None
    ) -> Iterator[FileInfo]:
        """A directory's entries, one page at a time (see :meth:`AsyncSandbox.iter_files`)."""
        return _iterate(self.client, self.aio.iter_files(path, page_size=page_size, timeout=timeout))

    def list_files_page(
        self, path: str, *, page_token: str = "", page_size: Optional[int] = None, timeout: Optional[float] = None
    ) -> Tuple[List[FileInfo], str]:
        return self._run(self.aio.list_files_page(path, page_token=page_token, page_size=page_size, timeout=timeout))

    def stat(self, path: str, *, timeout: Optional[float] = None) -> FileInfo:
        return self._run(self.aio.stat(path, timeout=timeout))

    def exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        return self._run(self.aio.exists(path, timeout=timeout))

    def watch_dir(self, path: str, *, recursive: bool = False, timeout: float = 86400.0) -> "SyncDirWatch":
        """Follow a directory's changes (see :meth:`AsyncSandbox.watch_dir`):
        an iterator of :class:`FileEvent`, set when returned; use it in a
        ``with`` block."""
        w = SyncDirWatch(self.client, self.aio.watch_dir(path, recursive=recursive, timeout=timeout))
        self._run(w.aio.start())
        return w

    def stats(self, *, timeout: Optional[float] = None) -> SandboxStats:
        return self._run(self.aio.stats(timeout=timeout))

    def mkdir(self, path: str, *, mode: Optional[int] = None, parents: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.mkdir(path, mode=mode, parents=parents, timeout=timeout))

    def remove(
        self, path: str, *, recursive: bool = False, missing_ok: bool = False, timeout: Optional[float] = None
    ) -> None:
        self._run(self.aio.remove(path, recursive=recursive, missing_ok=missing_ok, timeout=timeout))

    def upload(self, local_path: PathLike, remote_dir: str, *, timeout: Optional[float] = None) -> None:
        self._run(self.aio.upload(local_path, remote_dir, timeout=timeout))

    def upload_tar(
        self, tar: Union[bytes, bytearray, memoryview, BinaryIO], remote_dir: str, *, timeout: Optional[float] = None
    ) -> None:
        self._run(self.aio.upload_tar(tar, remote_dir, timeout=timeout))

    def download_tar(
        self, remote_path: str, *, max_bytes: Optional[int] = READ_MAX_BYTES, sparse: bool = False,
        timeout: Optional[float] = None,
    ) -> bytes:
        return self._run(self.aio.download_tar(remote_path, max_bytes=max_bytes, sparse=sparse, timeout=timeout))

    def download_tar_to(
        self, remote_path: str, dest: Sink, *, max_bytes: Optional[int] = None, sparse: bool = False,
        timeout: Optional[float] = None,
    ) -> int:
        return self._run(
            self.aio.download_tar_to(remote_path, dest, max_bytes=max_bytes, sparse=sparse, timeout=timeout)
        )

    def download(
        self,
        remote_path: str,
        local_dir: PathLike,
        *,
        max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
        max_entries: Optional[int] = DEFAULT_MAX_ENTRIES,
        preserve: bool = False,
        symlinks_as_is: bool = False,
        xattr_allow: Sequence[str] = (),
        timeout: Optional[float] = None,
    ) -> DownloadStats:
        """Copy a sandbox tree into a local directory, treating it as
        hostile (see :meth:`AsyncSandbox.download`)."""
        return self._run(
            self.aio.download(
                remote_path,
                local_dir,
                max_bytes=max_bytes,
                max_entries=max_entries,
                preserve=preserve,
                symlinks_as_is=symlinks_as_is,
                xattr_allow=xattr_allow,
                timeout=timeout,
            )
        )


E_co = TypeVar("E_co", covariant=True)
R_co = TypeVar("R_co", covariant=True)
E = TypeVar("E")
R = TypeVar("R")
S = TypeVar("S", bound="_SyncEvents[Any, Any]")


class _AsyncEvents(Protocol[E_co, R_co]):
    """What a streaming call of the async core offers (ExecStream, ImagePull)."""

    def __anext__(self) -> Awaitable[E_co]: ...

    def aclose(self) -> Awaitable[None]: ...

    def wait(self) -> Awaitable[R_co]: ...


class _SyncEvents(Generic[E, R]):
    """A synchronous iterator over the events of an async streaming call,
    run on the client's private loop; closing it stops the call."""

    def __init__(self, client: Warren, aio: _AsyncEvents[E, R]) -> None:
        self.client = client
        self._events = aio

    def __iter__(self: S) -> S:
        return self

    def __next__(self) -> E:
        try:
            return self.client._run(self._events.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """Stop the call if it still runs."""
        self.client._run(self._events.aclose())

    def wait(self) -> R:
        """Consume the rest of the events and return the final result."""
        return self.client._run(self._events.wait())

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SyncExecStream(_SyncEvents[ExecEvent, ExecResult]):
    """The synchronous streaming exec: an iterator of :class:`ExecEvent`
    (see :class:`ExecStream`). Closing it stops the command if it still runs."""

    def __init__(self, client: Warren, aio: ExecStream) -> None:
        super().__init__(client, aio)
        self.aio = aio

    @property
    def result(self) -> Optional[ExecResult]:
        return self.aio.result

    @property
    def process_id(self) -> Optional[str]:
        return self.aio.process_id

    def resize(self, rows: int, cols: int, *, timeout: Optional[float] = None) -> None:
        """Set the terminal size of the running command (see :meth:`ExecStream.resize`)."""
        self.client._run(self.aio.resize(rows, cols, timeout=timeout))


class SyncImagePull(_SyncEvents[PullEvent, Image]):
    """The synchronous image pull: an iterator of :class:`PullEvent` (see
    :class:`ImagePull`); ``wait()`` returns the image."""

    def __init__(self, client: Warren, aio: ImagePull) -> None:
        super().__init__(client, aio)
        self.aio = aio

    @property
    def ref(self) -> str:
        return self.aio.ref

    @property
    def image(self) -> Optional[Image]:
        """The image, once the pull finished."""
        return self.aio.image

    @property
    def restarts(self) -> int:
        """How many times a broken stream was started over."""
        return self.aio.restarts


class Process:
    """The synchronous handle on a background process (see :class:`AsyncProcess`)."""

    def __init__(self, sandbox: Sandbox, aio: AsyncProcess) -> None:
        self.sandbox = sandbox
        self.aio = aio

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def pid(self) -> int:
        return self.aio.pid

    @property
    def info(self) -> ProcessInfo:
        return self.aio.info

    def __repr__(self) -> str:
        return f"<Process {self.sandbox.id}/{self.id} pid={self.pid}>"

    def _run(self, aw: Awaitable[T]) -> T:
        return self.sandbox.client._run(aw)

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        return self._run(self.aio.wait(timeout))

    def signal(self, sig: int = _signal.SIGTERM, *, group: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.signal(sig, group=group, timeout=timeout))

    def kill(self, *, timeout: Optional[float] = None) -> None:
        self._run(self.aio.kill(timeout=timeout))

    def write_stdin(self, data: Data, *, close: bool = False, timeout: Optional[float] = None) -> None:
        self._run(self.aio.write_stdin(data, close=close, timeout=timeout))

    def close_stdin(self, *, timeout: Optional[float] = None) -> None:
        self._run(self.aio.close_stdin(timeout=timeout))

    def refresh(self, *, timeout: Optional[float] = None) -> ProcessInfo:
        return self._run(self.aio.refresh(timeout=timeout))

    def attach(self, stdout_offset: int = 0, stderr_offset: int = 0, *, timeout: float = 86400.0) -> "SyncProcessAttach":
        """Follow the output (see :meth:`AsyncProcess.attach`): an iterator of
        :class:`ProcessEvent`; use it in a ``with`` block."""
        return SyncProcessAttach(self.sandbox.client, self.aio.attach(stdout_offset, stderr_offset, timeout=timeout))

    def resize(self, rows: int, cols: int, *, timeout: Optional[float] = None) -> None:
        self._run(self.aio.resize(rows, cols, timeout=timeout))


class SyncProcessAttach(_SyncEvents[ProcessEvent, ExecResult]):
    """The synchronous attach: an iterator of :class:`ProcessEvent` (see
    :class:`ProcessAttach`); closing it detaches."""

    def __init__(self, client: Warren, aio: ProcessAttach) -> None:
        super().__init__(client, aio)
        self.aio = aio

    @property
    def result(self) -> Optional[ExecResult]:
        return self.aio.result


class SyncDirWatch(_SyncEvents[FileEvent, None]):
    """The synchronous directory watch: an iterator of :class:`FileEvent`
    (see :class:`DirWatch`); closing it ends the watch."""

    def __init__(self, client: Warren, aio: DirWatch) -> None:
        super().__init__(client, aio)
        self.aio = aio


class SandboxGroup(Sequence[Sandbox]):
    """The synchronous group of sandboxes (see :class:`AsyncSandboxGroup`)."""

    def __init__(self, client: Warren, aio: AsyncSandboxGroup) -> None:
        self.client = client
        self.aio = aio
        self.sandboxes: List[Sandbox] = [Sandbox(client, a) for a in aio.sandboxes]

    @property
    def errors(self) -> List[Tuple[int, BaseException]]:
        return self.aio.errors

    @overload
    def __getitem__(self, i: int) -> Sandbox: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Sandbox]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Sandbox, Sequence[Sandbox]]:
        return self.sandboxes[i]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __repr__(self) -> str:
        return f"<SandboxGroup {len(self.sandboxes)} sandboxes, {len(self.errors)} failed>"

    def exec(self, command: Command, *, concurrency: Optional[int] = None, **exec_kwargs: Any) -> BatchResult[ExecResult]:
        return self.client._run(self.aio.exec(command, concurrency=concurrency, **exec_kwargs))

    def delete(self, *, concurrency: int = 32) -> BatchResult[None]:
        return self.client._run(self.aio.delete(concurrency=concurrency))

    def __enter__(self) -> "SandboxGroup":
        return self

    def __exit__(self, et: Any, e: Any, tb: Any) -> None:
        self.client._run(self.aio.__aexit__(et, e, tb))
