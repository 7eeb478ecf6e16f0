"""Moved to ``npudist.diagnosis.straggler.skew`` (docs/architecture.md's layout);
this path stays an alias of that module for one release, so scripts that import it keep working
(tests/test_moved_paths.py)."""

import sys

from npudist.diagnosis.straggler import skew as _moved

sys.modules[__name__] = _moved
