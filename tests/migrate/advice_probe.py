"""Runs under `npudist launch` for test_advice.py: every rule's example (its "use instead" as code), one
JSON line naming the ones that raised. A child, because the examples start a process group."""

from __future__ import annotations

import json
import os
import textwrap

import torch
import torch.distributed as dist

import npudist
from npudist.migrate.rules import RULES

ctx = npudist.init()
failed: dict[str, str] = {}
for rule in RULES.values():
    env = {"torch": torch, "dist": dist, "os": os, "npudist": npudist, "ctx": ctx,
           "model": torch.nn.Linear(4, 2).to(ctx.device), "x": torch.randn(4, 4).to(ctx.device)}
    try:
        exec(compile(textwrap.dedent(rule.example), f"<{rule.id}>", "exec"), env)
    except Exception as exc:  # the report names it; the test fails on it
        failed[rule.id] = f"{type(exc).__name__}: {exc}"[:300]
print("RESULT " + json.dumps({"device": str(ctx.device), "ran": sorted(RULES), "failed": failed}))
npudist.shutdown()
