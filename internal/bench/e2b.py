"""Driver of `warren bench e2b` (internal/bench/e2b.go): the same cycle,
create + run `true` + kill, through the official E2B Python SDK against
Warren's E2B door and through Warren's own Python SDK, interleaved round by
round (the order alternating) so that both see the same node. Prints one
JSON object of per-cycle seconds."""

import json
import sys
import time

import warren
from e2b import Sandbox

n, warmup, template, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]


def e2b_cycle():
    s = Sandbox.create(template, timeout=120)
    r = s.commands.run("true")
    assert r.exit_code == 0
    s.kill()


with warren.Warren(addr) as w:

    def warren_cycle():
        sb = w.create(template, timeout_seconds=120)
        try:
            r = sb.exec("true")
            assert r.exit_code == 0
        finally:
            sb.delete()

    out = {"e2b": [], "warren": []}
    for i in range(warmup + n):
        order = [("e2b", e2b_cycle), ("warren", warren_cycle)]
        if i % 2:
            order.reverse()
        for name, fn in order:
            t = time.perf_counter()
            fn()
            if i >= warmup:
                out[name].append(time.perf_counter() - t)
    json.dump(out, sys.stdout)
