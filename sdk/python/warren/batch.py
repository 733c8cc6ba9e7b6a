"""Batch helpers: run many calls with a concurrency bound and collect
per-item outcomes, so that one failure does not sink the batch."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import (
    Awaitable,
    Callable,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from .errors import BatchError

__all__ = ["Outcome", "BatchResult", "gather_bounded", "map_bounded"]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The outcome of one item of a batch: a value or an exception."""

    index: int
    value: Optional[T] = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> T:
        """The value, or raise the item's exception."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class BatchResult(Sequence[Outcome[T]]):
    """The outcomes of a batch, in the order of its items."""

    def __init__(self, outcomes: Sequence[Outcome[T]]) -> None:
        self.outcomes: List[Outcome[T]] = list(outcomes)

    @overload
    def __getitem__(self, i: int) -> Outcome[T]: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Outcome[T]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Outcome[T], Sequence[Outcome[T]]]:
        return self.outcomes[i]

    def __len__(self) -> int:
        return len(self.outcomes)

    def __iter__(self) -> Iterator[Outcome[T]]:
        return iter(self.outcomes)

    def __repr__(self) -> str:
        return f"<BatchResult {len(self.outcomes)} items, {len(self.errors)} failed>"

    @property
    def ok(self) -> bool:
        """True when every item succeeded."""
        return all(o.ok for o in self.outcomes)

    @property
    def values(self) -> List[Optional[T]]:
        """Every item's value, None for failed items."""
        return [o.value for o in self.outcomes]

    @property
    def successes(self) -> List[T]:
        """The values of the items that succeeded."""
        return [o.value for o in self.outcomes if o.ok]  # type: ignore[misc]

    @property
    def errors(self) -> List[Tuple[int, BaseException]]:
        """``(index, exception)`` for every failed item."""
        return [(o.index, o.error) for o in self.outcomes if o.error is not None]

    def raise_for_errors(self) -> "BatchResult[T]":
        """Raise :class:`~warren.BatchError` if any item failed, else return self."""
        errs = self.errors
        if errs:
            first = errs[0][1]
            raise BatchError(
                f"{len(errs)} of {len(self.outcomes)} items failed; first (item {errs[0][0]}): "
                f"{type(first).__name__}: {first}",
                errs,
            ) from first
        return self


async def gather_bounded(
    factories: Iterable[Callable[[], Awaitable[T]]],
    concurrency: int,
) -> BatchResult[T]:
    """Await ``factory()`` for every factory, at most ``concurrency`` at a
    time, and return all outcomes in order. Exceptions are collected per
    item (``Exception`` only: ``KeyboardInterrupt`` and cancellation
    propagate). Cancelling the caller cancels every item in flight and
    waits for them to finish their clean-up."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    items = list(factories)
    results: List[Optional[Outcome[T]]] = [None] * len(items)
    it = iter(enumerate(items))

    async def worker() -> None:
        for i, factory in it:
            try:
                v = await factory()
            except Exception as e:  # noqa: BLE001 - collected per item
                results[i] = Outcome(i, error=e)
            else:
                results[i] = Outcome(i, value=v)

    n = min(concurrency, len(items))
    workers = [asyncio.ensure_future(worker()) for _ in range(n)]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    return BatchResult([r if r is not None else Outcome(i, error=RuntimeError("not run")) for i, r in enumerate(results)])


async def map_bounded(
    fn: Callable[[U], Awaitable[T]],
    items: Iterable[U],
    concurrency: int,
) -> BatchResult[T]:
    """``gather_bounded`` over ``fn(item)`` for every item."""

    def bind(x: U) -> Callable[[], Awaitable[T]]:
        return lambda: fn(x)

    return await gather_bounded([bind(x) for x in items], concurrency)
