"""The chart installs the images `make images` labels: its default tag (values.yaml's empty tag, falling
back to Chart.yaml's appVersion in the templates) is pyproject.toml's version, the one images/build.sh
writes into org.opencontainers.image.version and the release workflow pushes as the tag."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "oculis"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_chart_app_version_is_the_images_version() -> None:
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == VERSION


def test_each_image_tag_defaults_to_the_app_version() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "\n".join(p.read_text() for p in (CHART / "templates").glob("*.yaml"))
    for component, image in (("operator", "oculis-operator"), ("router", "oculis-router")):
        img = values[component]["image"]
        assert img["repository"].endswith(f"/{image}")
        assert img["tag"] in ("", VERSION), f"{component}.image.tag {img['tag']!r} is not {VERSION} (pyproject.toml)"
        ref = (f"{{{{ .Values.{component}.image.repository }}}}:"
               f"{{{{ .Values.{component}.image.tag | default .Chart.AppVersion }}}}")
        assert ref in templates, f"{component}'s image is not repository:tag|default appVersion"


def test_the_build_labels_and_the_release_tag_come_from_pyproject() -> None:
    build = (ROOT / "images" / "build.sh").read_text()
    assert 'org.opencontainers.image.version="$VERSION"' in build and '["project"]["version"]' in build
    release = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert '["project"]["version"]' in release and '"$GITHUB_REF_NAME" != "v$version"' in release
