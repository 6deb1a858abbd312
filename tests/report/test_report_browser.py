"""The report in headless Chromium: every figure decodes (naturalWidth > 0, marked by the
report's own inline script) and the key numbers are on the rendered page."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import unescape

import pytest

import report_synth as rs
from race.cards import fmt_flops

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="needs headless chromium (apt-get install -y chromium)")]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


def test_every_image_loads_and_key_numbers_render(tmp_path, full_report, full_tables):
    proc = chromium(tmp_path, "--virtual-time-budget=10000", "--run-all-compositor-stages-before-draw", "--dump-dom",
                    full_report.html.as_uri())
    dom = proc.stdout
    assert "<img" in dom, proc.stderr[-2000:]
    imgs = re.findall(r"<img\b[^>]*>", dom)
    assert len(imgs) == len(full_report.figures) == 8
    assert all('data-loaded="yes"' in tag for tag in imgs), [t[:120] for t in imgs if 'data-loaded="yes"' not in t]
    assert 'data-images-loaded="8"' in dom
    text = unescape(re.sub(r"<[^>]+>", " ", dom))
    assert fmt_flops(rs.finished_flops(full_tables["runs"])) in text
    assert full_report.confidence in text
    assert full_report.headline.split(":")[0] in text  # "Run <allocation> at <budget>"


def test_screenshot(tmp_path, full_report):
    shot = tmp_path / "report.png"
    chromium(tmp_path, "--window-size=1200,3000", f"--screenshot={shot}", full_report.html.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 1200
    assert len(data) > 50_000  # a page with figures, not a blank one
