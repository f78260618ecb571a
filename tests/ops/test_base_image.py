"""`ops/deploy/images/base.sh` names no mirror of its own: it takes the one this machine's apt sources use for the
suite (deb822 stanzas, then one-line entries), or DEBIAN_MIRROR, or stops with the reason. Driven through
`base.sh --mirror` against apt source trees written here (APT_ETC); the URLs use the reserved `.invalid`
domain, so no test names a real host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BASE_SH = Path(__file__).resolve().parents[2] / "ops" / "deploy" / "images" / "base.sh"


def _mirror(etc: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("DEBIAN_MIRROR", "SUITE")} | {"APT_ETC": str(etc)} | env
    return subprocess.run(["bash", str(BASE_SH), "--mirror"], env=full, capture_output=True, text=True, timeout=30)


def _tree(tmp_path: Path, sources: str = "", lists: str = "") -> Path:
    (tmp_path / "sources.list.d").mkdir(parents=True)
    if sources:
        (tmp_path / "sources.list.d" / "debian.sources").write_text(sources)
    if lists:
        (tmp_path / "sources.list").write_text(lists)
    return tmp_path


def test_the_suites_own_stanza_wins_over_security_and_disabled_ones(tmp_path):
    etc = _tree(
        tmp_path,
        sources=(
            "Types: deb\nURIs: http://security.invalid/debian-security\nSuites: bookworm-security\n\n"
            "Enabled: no\nTypes: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\n\n"
            "Types: deb-src\nURIs: http://src.invalid/debian\nSuites: bookworm\n\n"
            "# a comment\nTypes: deb\nURIs: http://main.invalid/debian\nSuites: bookworm bookworm-updates\n"
            "Components: main\n"
        ),
    )
    done = _mirror(etc)
    assert done.returncode == 0 and done.stdout.strip() == "http://main.invalid/debian", done.stderr
    assert _mirror(etc, SUITE="bookworm-security").stdout.strip() == "http://security.invalid/debian-security"


def test_one_line_entries_with_options_and_an_explicit_mirror(tmp_path):
    etc = _tree(
        tmp_path,
        lists=(
            "# deb http://commented.invalid/debian bookworm main\n"
            "deb-src http://src.invalid/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://line.invalid/debian bookworm main\n"
        ),
    )
    assert _mirror(etc).stdout.strip() == "http://line.invalid/debian"
    assert _mirror(etc, DEBIAN_MIRROR="http://given.invalid/debian").stdout.strip() == "http://given.invalid/debian"


def test_no_source_for_the_suite_stops_with_the_reason(tmp_path):
    etc = _tree(tmp_path, sources="Types: deb\nURIs: http://main.invalid/debian\nSuites: trixie\n")
    done = _mirror(etc)
    assert done.returncode == 1 and done.stdout == ""
    assert "no apt source of this machine serves bookworm; set DEBIAN_MIRROR" in done.stderr
