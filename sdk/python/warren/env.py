"""A gym-style environment around a sandbox, for RL loops.

No dependency on gym/gymnasium: :meth:`AsyncSandboxEnv.reset` returns
``(observation, info)`` and :meth:`AsyncSandboxEnv.step` returns
``(observation, reward, done, info)`` (named tuples). Each episode gets a
fresh sandbox; the reward comes from a function run against the sandbox,
typically a command (run the tests, parse the result)::

    env = AsyncSandboxEnv(
        client, "busybox",
        files={"/work/calc.sh": BUGGY, "/work/test.sh": TESTS},
        reward=CommandReward("sh /work/test.sh", parse=lambda r: parse_pass_ratio(r.text)),
        max_steps=5,
    )
    async with env:
        obs, info = await env.reset()
        obs, reward, done, info = await env.step(WriteFile("/work/calc.sh", FIXED))
"""

from __future__ import annotations

import asyncio
import inspect
import re
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._async import AsyncSandbox, AsyncWarren, Command, _finish_despite_cancel
from ._types import ExecResult

if TYPE_CHECKING:  # pragma: no cover
    from ._sync import Warren

__all__ = [
    "AsyncSandboxEnv",
    "SandboxEnv",
    "Shell",
    "WriteFile",
    "Reward",
    "CommandReward",
    "StepResult",
    "ResetResult",
    "parse_pass_ratio",
]


@dataclass(frozen=True)
class Shell:
    """Action: run a command (a shell string or argv); observation: its ExecResult."""

    command: Command
    timeout: Optional[float] = None
    cwd: Optional[str] = None
    env: Optional[Mapping[str, str]] = None


@dataclass(frozen=True)
class WriteFile:
    """Action: write a file (parents are created); observation: None."""

    path: str
    content: Union[str, bytes]
    mode: Optional[int] = None


@dataclass(frozen=True)
class Reward:
    """What a reward function returns (a bare float, or ``(float, done)``, is fine too)."""

    value: float
    done: bool = False
    info: Dict[str, Any] = field(default_factory=dict)


class StepResult(NamedTuple):
    observation: Any
    reward: float
    done: bool
    info: Dict[str, Any]


class ResetResult(NamedTuple):
    observation: Any
    info: Dict[str, Any]


#: An action: a shell string, :class:`Shell`, :class:`WriteFile`, a list of
#: actions (run in order; the observation is the list of their observations),
#: or an async callable ``fn(sandbox) -> observation``.
Action = Any
RewardLike = Union[float, int, Tuple[float, bool], Reward]
RewardFn = Callable[[AsyncSandbox], Awaitable[RewardLike]]


def parse_pass_ratio(text: str) -> float:
    """The fraction of passed tests in a test runner's summary: it reads the
    last ``N passed`` and ``N failed`` (and ``N error(s)``) counts, as in
    pytest's ``3 passed, 1 failed``. 0.0 when nothing is found."""
    def last(word: str) -> int:
        found = re.findall(r"(\d+)\s+" + word, text)
        return int(found[-1]) if found else 0

    passed = last("passed")
    failed = last("failed") + last(r"errors?\b")
    total = passed + failed
    return passed / total if total else 0.0


class CommandReward:
    """A reward function that runs ``command`` in the sandbox and turns its
    :class:`ExecResult` into a reward with ``parse`` (which may return a
    float, ``(float, done)`` or a :class:`Reward`). Without ``parse`` the
    reward is 1.0 (and the episode done) when the command exits 0, else 0.0.
    A parsed float of at least ``done_at`` ends the episode."""

    def __init__(
        self,
        command: Command,
        parse: Optional[Callable[[ExecResult], RewardLike]] = None,
        *,
        timeout: Optional[float] = None,
        done_at: Optional[float] = 1.0,
        cwd: Optional[str] = None,
    ) -> None:
        self.command = command
        self.parse = parse
        self.timeout = timeout
        self.done_at = done_at
        self.cwd = cwd

    async def __call__(self, sandbox: AsyncSandbox) -> Reward:
        r = await sandbox.exec(self.command, timeout=self.timeout, cwd=self.cwd)
        if self.parse is None:
            return Reward(1.0 if r.ok else 0.0, done=r.ok, info={"reward_result": r})
        rew = _as_reward(self.parse(r), self.done_at)
        return Reward(rew.value, rew.done, dict(rew.info, reward_result=r))


def _as_reward(v: RewardLike, done_at: Optional[float] = None) -> Reward:
    if isinstance(v, Reward):
        return v
    if isinstance(v, tuple):
        value, done = v
        return Reward(float(value), bool(done))
    value = float(v)
    return Reward(value, done=done_at is not None and value >= done_at)


class AsyncSandboxEnv:
    """A gym-style environment: every :meth:`reset` starts an episode in a
    fresh sandbox (the previous one is deleted), :meth:`step` applies an
    action and scores it with ``reward``.

    Args:
        client: the :class:`AsyncWarren` client.
        image: image of the episodes' sandboxes.
        reward: ``async fn(sandbox) -> float | (float, done) | Reward``, e.g.
            a :class:`CommandReward`. Run after every step.
        files: ``{path: content}`` written at every reset (parents created).
        setup: commands run at every reset, after the files; they must succeed.
        setup_fn: ``async fn(sandbox)`` run last at reset.
        reset_observation: ``async fn(sandbox) -> observation`` for reset's
            observation (default None).
        observe: ``async fn(sandbox, action, output) -> observation`` to
            build a step's observation (default: the action's output).
        max_steps: the episode ends (``info["truncated"]``) after this many steps.
        create_kwargs: extra arguments of :meth:`AsyncWarren.create` (labels,
            memory_bytes, timeout_seconds...).
    """

    def __init__(
        self,
        client: AsyncWarren,
        image: str,
        *,
        reward: RewardFn,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        setup: Sequence[Command] = (),
        setup_fn: Optional[Callable[[AsyncSandbox], Awaitable[Any]]] = None,
        reset_observation: Optional[Callable[[AsyncSandbox], Awaitable[Any]]] = None,
        observe: Optional[Callable[[AsyncSandbox, Action, Any], Awaitable[Any]]] = None,
        max_steps: Optional[int] = None,
        create_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.client = client
        self.image = image
        self.reward = reward
        self.files = dict(files or {})
        self.setup = list(setup)
        self.setup_fn = setup_fn
        self.reset_observation = reset_observation
        self.observe = observe
        self.max_steps = max_steps
        self.create_kwargs = dict(create_kwargs or {})
        #: The sandbox of the current episode.
        self.sandbox: Optional[AsyncSandbox] = None
        self.steps = 0
        self.episode = 0
        self._done = False

    async def __aenter__(self) -> "AsyncSandboxEnv":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Delete the current episode's sandbox."""
        sb, self.sandbox = self.sandbox, None
        if sb is not None:
            await _finish_despite_cancel(sb.delete(missing_ok=True), self.client.timeout + 60.0)

    async def reset(self, *, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> ResetResult:
        """Start an episode in a fresh sandbox; returns ``(observation, info)``."""
        await self.close()
        self.steps = 0
        self._done = False
        self.episode += 1
        sb = await self.client.create(self.image, **self.create_kwargs)
        self.sandbox = sb
        for path, content in self.files.items():
            await sb.write_file(path, content, make_parents=True)
        for cmd in self.setup:
            await sb.exec(cmd, check=True)
        if self.setup_fn is not None:
            await self.setup_fn(sb)
        obs = await self.reset_observation(sb) if self.reset_observation is not None else None
        info: Dict[str, Any] = {"sandbox_id": sb.id, "episode": self.episode}
        if seed is not None:
            info["seed"] = seed
        return ResetResult(obs, info)

    async def _act(self, sb: AsyncSandbox, action: Action) -> Any:
        if isinstance(action, str):
            return await sb.exec(action)
        if isinstance(action, Shell):
            return await sb.exec(action.command, timeout=action.timeout, cwd=action.cwd, env=action.env)
        if isinstance(action, WriteFile):
            await sb.write_file(action.path, action.content, mode=action.mode, make_parents=True)
            return None
        if isinstance(action, (list, tuple)):
            return [await self._act(sb, a) for a in action]
        if callable(action):
            out = action(sb)
            return await out if inspect.isawaitable(out) else out
        raise TypeError(f"unsupported action {action!r}: want str, Shell, WriteFile, a list of them or a callable")

    async def step(self, action: Action) -> StepResult:
        """Apply ``action``, score it; returns ``(observation, reward, done, info)``."""
        sb = self.sandbox
        if sb is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over: call reset()")
        out = await self._act(sb, action)
        obs = await self.observe(sb, action, out) if self.observe is not None else out
        rew = _as_reward(await self.reward(sb))
        self.steps += 1
        truncated = self.max_steps is not None and self.steps >= self.max_steps and not rew.done
        self._done = rew.done or truncated
        info: Dict[str, Any] = dict(rew.info)
        info.update(step=self.steps, terminated=rew.done, truncated=truncated, sandbox_id=sb.id)
        return StepResult(obs, rew.value, self._done, info)


class SandboxEnv:
    """The synchronous twin of :class:`AsyncSandboxEnv`, on a :class:`~warren.Warren`
    client. Callables (``reward``, ``setup_fn``, ``observe``, callable
    actions...) may be async functions taking an :class:`AsyncSandbox`, or
    plain functions taking a sync :class:`~warren.Sandbox` (run in a worker
    thread)."""

    def __init__(
        self,
        client: "Warren",
        image: str,
        *,
        reward: Callable[..., Any],
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        setup: Sequence[Command] = (),
        setup_fn: Optional[Callable[..., Any]] = None,
        reset_observation: Optional[Callable[..., Any]] = None,
        observe: Optional[Callable[..., Any]] = None,
        max_steps: Optional[int] = None,
        create_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.client = client
        self.aio = AsyncSandboxEnv(
            client.aio,
            image,
            reward=self._adapt(reward),  # type: ignore[arg-type]
            files=files,
            setup=setup,
            setup_fn=self._adapt(setup_fn),
            reset_observation=self._adapt(reset_observation),
            observe=self._adapt(observe),
            max_steps=max_steps,
            create_kwargs=create_kwargs,
        )

    def _adapt(self, fn: Optional[Callable[..., Any]]) -> Optional[Callable[..., Awaitable[Any]]]:
        if fn is None:
            return None
        if (
            isinstance(fn, CommandReward)
            or inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))  # noqa: B004
        ):
            return fn
        from ._sync import Sandbox

        client = self.client

        async def in_thread(sb: AsyncSandbox, *args: Any) -> Any:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, lambda: fn(Sandbox(client, sb), *args))

        return in_thread

    @property
    def sandbox(self) -> Any:
        from ._sync import Sandbox

        return Sandbox(self.client, self.aio.sandbox) if self.aio.sandbox is not None else None

    @property
    def steps(self) -> int:
        return self.aio.steps

    def reset(self, *, seed: Optional[int] = None, options: Optional[Mapping[str, Any]] = None) -> ResetResult:
        return self.client._run(self.aio.reset(seed=seed, options=options))

    def _adapt_action(self, action: Action) -> Action:
        if isinstance(action, (list, tuple)):
            return [self._adapt_action(a) for a in action]
        if callable(action) and not isinstance(action, (str, Shell, WriteFile)):
            return self._adapt(action)
        return action

    def step(self, action: Action) -> StepResult:
        return self.client._run(self.aio.step(self._adapt_action(action)))

    def close(self) -> None:
        self.client._run(self.aio.close())

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


