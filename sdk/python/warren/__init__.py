"""Warren: sandboxes for agentic RL, from Python.

Async-first (:class:`AsyncWarren`, :class:`AsyncSandbox`) with a synchronous
twin (:class:`Warren`, :class:`Sandbox`) that runs the same code on a
private event loop thread::

    import asyncio, warren

    async def main():
        async with warren.AsyncWarren() as w:
            async with w.create("busybox") as sb:
                r = await sb.exec("echo hello")
                print(r.exit_code, r.text)

    asyncio.run(main())
"""

from ._async import (
    CREATE_NONCE_LABEL,
    AsyncProcess,
    AsyncSandbox,
    AsyncSandboxGroup,
    AsyncWarren,
    Command,
    ExecJob,
    ExecStream,
    ImagePull,
    ProcessAttach,
)
from ._retry import NO_RETRY, RetryPolicy
from ._sync import Process, Sandbox, SandboxGroup, SyncExecStream, SyncImagePull, SyncProcessAttach, Warren
from ._types import (
    ExecEvent,
    DownloadStats,
    ExecResult,
    FileInfo,
    Image,
    Layer,
    LayerStat,
    LayerVerification,
    ProcessEvent,
    ProcessInfo,
    PullEvent,
    Resources,
    NetworkArg,
    NetworkPolicy,
    NetworkRule,
    Rlimit,
    RlimitsArg,
    RunFileResult,
    RunResult,
    SandboxInfo,
    SecurityEvent,
    SandboxState,
    Step,
    StepResult,
    VersionInfo,
)
from .batch import BatchResult, Outcome, gather_bounded, map_bounded
from .env import (
    AsyncSandboxEnv,
    CommandReward,
    Reward,
    ResetResult,
    SandboxEnv,
    Shell,
    StepResult,
    WriteFile,
    parse_pass_ratio,
)
from .errors import (
    AlreadyExistsError,
    BatchError,
    CommandError,
    ConflictError,
    DeadlineExceededError,
    ExhaustedError,
    InternalError,
    InvalidError,
    NotFoundError,
    OutputTruncatedWarning,
    PermissionDeniedError,
    TimeoutError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedError,
    WarrenError,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncWarren",
    "AsyncSandbox",
    "AsyncProcess",
    "AsyncSandboxGroup",
    "ExecStream",
    "ProcessAttach",
    "ImagePull",
    "ExecJob",
    "Command",
    "CREATE_NONCE_LABEL",
    "Warren",
    "Sandbox",
    "Process",
    "SandboxGroup",
    "SyncExecStream",
    "SyncProcessAttach",
    "SyncImagePull",
    "RetryPolicy",
    "NO_RETRY",
    "ExecEvent",
    "ExecResult",
    "FileInfo",
    "DownloadStats",
    "Image",
    "Layer",
    "LayerStat",
    "LayerVerification",
    "PullEvent",
    "ProcessEvent",
    "ProcessInfo",
    "Resources",
    "NetworkArg",
    "NetworkPolicy",
    "NetworkRule",
    "Rlimit",
    "RlimitsArg",
    "SandboxInfo",
    "SecurityEvent",
    "Step",
    "StepResult",
    "RunResult",
    "RunFileResult",
    "SandboxState",
    "VersionInfo",
    "BatchResult",
    "Outcome",
    "gather_bounded",
    "map_bounded",
    "AsyncSandboxEnv",
    "SandboxEnv",
    "CommandReward",
    "Reward",
    "ResetResult",
    "StepResult",
    "Shell",
    "WriteFile",
    "parse_pass_ratio",
    "WarrenError",
    "NotFoundError",
    "InvalidError",
    "ExhaustedError",
    "ConflictError",
    "AlreadyExistsError",
    "UnavailableError",
    "DeadlineExceededError",
    "TimeoutError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "InternalError",
    "UnsupportedError",
    "CommandError",
    "BatchError",
    "OutputTruncatedWarning",
    "__version__",
]
