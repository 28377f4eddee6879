"""Render a kustomize base offline: the subset this project uses (``resources`` and ``namespace``).

    python tools/render_kustomize.py deploy/k8s/gateway > rendered.yaml

``kubectl kustomize`` gives the same output for these bases; this exists because no kustomize binary
installs from the package registries here. Any other kustomization field is refused, not ignored.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "namespace", "resources"}


def render(base: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{base}/kustomization.yaml: unsupported fields {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        for doc in yaml.safe_load_all((base / resource).read_text()):
            if doc is None:
                continue
            if "namespace" in kustomization:
                doc.setdefault("metadata", {})["namespace"] = kustomization["namespace"]
            docs.append(doc)
    return docs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(yaml.safe_dump_all(render(Path(sys.argv[1])), sort_keys=False), end="")
