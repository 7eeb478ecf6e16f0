"""How findings are printed: one line each (``file:line:col: RULE message``), a table, JSON or CSV.

Pure: rows in, text out. The long explanation of a rule is printed once, after its first line, so 30
findings of four rules take about 38 lines, not a table of hundreds.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

FORMATS = ("line", "table", "json", "csv")
COLUMNS = ("path", "line", "column", "rule", "severity", "fixable", "code", "detail", "breaks", "replacement")


def line(row: dict[str, Any]) -> str:
    fix = " [fix]" if row["fixable"] else ""
    detail = f" ({row['detail']})" if row["detail"] else ""
    return f"{row['path']}:{row['line']}:{row['column']}: {row['rule']} {row['severity']}{fix}: {row['code']}{detail}"


def as_lines(rows: Sequence[dict[str, Any]]) -> str:
    out, explained = [], set()
    for r in rows:
        out.append(line(r))
        if r["rule"] not in explained:
            explained.add(r["rule"])
            out.append(f"    {r['rule']}: {r['breaks']}\n    use instead: {r['replacement']}")
    return "\n".join(out) + ("\n" if out else "")


def as_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def as_json(rows: Sequence[dict[str, Any]], skipped: Sequence[dict[str, str]], counts: dict[str, int],
            exit_code: int, transfer_to_npu: Sequence[str]) -> str:
    return json.dumps({"findings": list(rows), "skipped": list(skipped), "counts": counts, "exit_code": exit_code,
                       "transfer_to_npu": list(transfer_to_npu)}, indent=2) + "\n"
