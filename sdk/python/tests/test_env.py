"""The gym-style environment wrapper."""

from __future__ import annotations

from typing import Dict, Tuple

import pytest

import warren
from conftest import IMAGE

BUGGY = 'add() { echo $(($1 - $2)); }\n'
FIXED = 'add() { echo $(($1 + $2)); }\n'
TESTS = """. /work/calc.sh
p=0; f=0
check() { if [ "$(add $1 $2)" = "$3" ]; then p=$((p+1)); else f=$((f+1)); fi; }
check 1 1 2; check 2 0 2; check 0 0 0; check 5 3 8
echo "$p passed, $f failed"
"""


def _reward() -> warren.CommandReward:
    return warren.CommandReward("sh /work/test.sh", parse=lambda r: warren.parse_pass_ratio(r.text))


async def test_env_reset_step_reward(w: warren.AsyncWarren, labels: Dict[str, str]) -> None:
    env = warren.AsyncSandboxEnv(
        w,
        IMAGE,
        files={"/work/calc.sh": BUGGY, "/work/test.sh": TESTS},
        setup=["mkdir -p /work/logs"],
        reward=_reward(),
        reset_observation=lambda sb: sb.read_text("/work/calc.sh"),
        max_steps=3,
    )
    async with env:
        obs, info = await env.reset(seed=1)
        assert obs == BUGGY and info["seed"] == 1 and info["episode"] == 1
        first = env.sandbox
        assert first is not None

        step = await env.step("ls /work")
        assert step.observation.text.split() == ["calc.sh", "logs", "test.sh"]
        assert step.reward == 0.5 and not step.done  # 2 of 4 tests pass by luck
        assert step.info["step"] == 1 and not step.info["truncated"]
        assert step.info["reward_result"].text == "2 passed, 2 failed\n"

        obs, reward, done, info = await env.step(warren.WriteFile("/work/calc.sh", FIXED))
        assert obs is None and reward == 1.0 and done and info["terminated"]
        with pytest.raises(RuntimeError):
            await env.step("true")

        await env.reset()
        assert env.sandbox is not None and env.sandbox.id != first.id
        with pytest.raises(warren.NotFoundError):
            await first.refresh()  # the previous episode's sandbox is gone
        for _ in range(3):
            r = await env.step(warren.Shell("echo noop", timeout=5))
        assert r.done and r.info["truncated"] and not r.info["terminated"]

        async def custom(sb: warren.AsyncSandbox) -> str:
            await sb.write_file("/work/calc.sh", FIXED)
            return "patched"

        await env.reset()
        out = await env.step([warren.WriteFile("/work/note", "x"), custom])
        assert out.observation == [None, "patched"] and out.reward == 1.0
    assert env.sandbox is None


async def test_env_reward_forms(w: warren.AsyncWarren) -> None:
    async def tuple_reward(sb: warren.AsyncSandbox) -> Tuple[float, bool]:
        return 0.25, True

    async with warren.AsyncSandboxEnv(w, IMAGE, reward=tuple_reward) as env:
        await env.reset()
        assert (await env.step("true"))[1:3] == (0.25, True)
    async with warren.AsyncSandboxEnv(w, IMAGE, reward=warren.CommandReward("test -f /done")) as env:
        await env.reset()
        assert (await env.step("true")).reward == 0.0
        assert (await env.step("touch /done")).reward == 1.0


def test_sync_env_with_plain_functions(sw: warren.Warren) -> None:
    def reward(sb: warren.Sandbox) -> float:
        return float(sb.exec("cat /score").text)

    def observe(sb: warren.Sandbox, action: object, out: object) -> str:
        return sb.read_text("/score")

    with warren.SandboxEnv(sw, IMAGE, files={"/score": "0"}, reward=reward, observe=observe, max_steps=2) as env:
        obs, info = env.reset()
        assert obs is None and info["sandbox_id"]
        s = env.step("echo 0.5 > /score")
        assert s.reward == 0.5 and s.observation == "0.5\n" and not s.done
        s = env.step(lambda sb: sb.write_file("/score", "1"))
        assert s.reward == 1.0 and s.done
        assert env.sandbox is not None
    assert env.sandbox is None
