"""The diagnosis: pure verdicts from what the ranks publish.

Nothing here does I/O or calls a collective; the threads that collect (npudist.comm.hang: the watchdog and
the hang reader; npudist.telemetry.job: the step timer and the straggler reporter) hand it records, and it
answers with verdicts, which those threads print, write and act on:

- ``record``: each rank's progress record and a process group's members, and their parsers;
- ``hang``: which rank a stalled job waits on, and what to do (``judge``, the ``Verdict``);
- ``rank_states``: what a suspect rank is doing (stopped, gone, busy, stuck, starved...), from evidence;
- ``place``: where a rank runs (host, pid, card) and the next commands a verdict suggests;
- ``straggler``: the slow-rank scoring (the detector, its Student-t test, the per-step skew).
"""
