"""Reproduce tests/schemas/crds/*.json from a project's released CRD YAML.

    python tests/schemas/extract_crd_schema.py CRD.yaml OUT.json --repository R --ref TAG --path P

Keeps the served version's ``openAPIV3Schema`` exactly, minus every ``description`` (documentation only:
about two thirds of the bytes), and records where it came from and the sha256 of the file it was read from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import yaml


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def extract(crd_text: str, source: dict[str, str]) -> dict:
    crd = yaml.safe_load(crd_text)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version["name"],
            "source": {**source, "sha256": hashlib.sha256(crd_text.encode()).hexdigest()},
            "openAPIV3Schema": strip_descriptions(version["schema"]["openAPIV3Schema"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("crd")
    p.add_argument("out")
    p.add_argument("--repository", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--path", required=True)
    a = p.parse_args()
    doc = extract(Path(a.crd).read_text(), {"repository": a.repository, "ref": a.ref, "path": a.path})
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
