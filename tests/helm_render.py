#!/usr/bin/env python3
"""Helm, for tests/tests/deploy.rs: the chart rendered, linted and read by Helm's own Go code
(helm-python-sdk's libhelm_c, which `cargo xtask setup` installs in the test tools' virtual
environment), without a helm binary or a cluster.

  helm_render.py render CHART NAMESPACE [--values FILE|JSON]... [--release-service CLI]
      The rendered objects, hooks included, as a JSON object: "objects" (a list, in template
      order), "yaml" (every manifest, for a schema validator) and "notes" (NOTES.txt). Values
      files and JSON objects are merged in order, as `helm install -f A -f B` merges them.
      --release-service CLI renders what a tool that names itself CLI gets (Helm's engine says
      "Helm"; linkerd install-cni says "CLI"): the chart's copy is rendered with its
      `.Release.Service` replaced. A template's `fail` or a value the schema refuses exits 1
      with Helm's message on stderr.
  helm_render.py lint CHART
      `helm lint --strict`: every finding on stdout; exits 1 if any is a warning or an error.
  helm_render.py values CHART
      The chart's defaults ("values") and its values.schema.json ("schema"), as JSON.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import yaml

RELEASE = "linkerd2-cni"


def merged(base: dict, override: dict) -> dict:
    """`override` over `base`, maps merged key by key, as Helm merges values files."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def values_of(sources: list[str]) -> dict:
    values: dict = {}
    for source in sources:
        text = source if source.lstrip().startswith("{") else Path(source).read_text()
        values = merged(values, helm.values_from_yaml(text) or {})
    return values


def render(chart: Path, namespace: str, sources: list[str], service: str | None) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        if service is not None:
            copy = Path(scratch) / chart.name
            shutil.copytree(chart, copy)
            for template in (copy / "templates").iterdir():
                text = template.read_text()
                template.write_text(text.replace(".Release.Service", json.dumps(service)))
            chart = copy
        with helm.Chart.load(chart) as loaded:
            manifests = loaded.render(values_of(sources), name=RELEASE, namespace=namespace)
    objects, documents, notes = [], [], ""
    for path, manifest in manifests.items():
        if path.endswith("NOTES.txt"):
            notes = manifest
            continue
        for document in yaml.safe_load_all(manifest):
            if document is not None:
                objects.append(document)
        if manifest.strip():
            documents.append(f"# Source: {path}\n{manifest.strip()}\n")
    return {"objects": objects, "yaml": "---\n".join(documents), "notes": notes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render_args = commands.add_parser("render")
    render_args.add_argument("chart", type=Path)
    render_args.add_argument("namespace")
    render_args.add_argument("--values", action="append", default=[])
    render_args.add_argument("--release-service")
    commands.add_parser("lint").add_argument("chart", type=Path)
    commands.add_parser("values").add_argument("chart", type=Path)
    args = parser.parse_args()

    if args.command == "render":
        try:
            out = render(args.chart, args.namespace, args.values, args.release_service)
        except helm.HelmError as e:
            print(e, file=sys.stderr)
            return 1
        json.dump(out, sys.stdout)
        return 0
    if args.command == "lint":
        report = helm.lint(args.chart, strict=True)
        for message in report["messages"]:
            print(f"{message['severity']} {message['path']}: {message['error']}")
        failed = report["errors"] or any(m["severity"] >= 2 for m in report["messages"])
        return 1 if failed else 0
    with helm.Chart.load(args.chart) as loaded:
        json.dump({"values": loaded.values, "schema": loaded.schema}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
