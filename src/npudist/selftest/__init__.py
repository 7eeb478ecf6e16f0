"""`npudist test`: does this machine's set-up run a distributed job? A short job under `npudist launch` runs
one of each collective through npudist.comm with a result check, a DDP step and a checkpoint round trip, and
the parent prints one verdict line per check."""

from npudist.selftest.records import CHECKS, Verdict, verdicts

__all__ = ["CHECKS", "Verdict", "verdicts"]
