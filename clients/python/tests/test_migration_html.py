"""The HTML migration report in a real browser (Debian's Chromium, headless):
it renders offline, its lock timeline's bars are drawn in the order the locks
were taken, and nothing a candidate wrote runs as script.

The page and its screenshot are kept in target/artifacts/ for CI to attach.
Where Chromium is not installed, the test says so and does not run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "target" / "artifacts"

# The colours of the timeline's bars (see the style in crates/migrate/src/html.rs).
READS_AND_WRITES = (215, 38, 61)
WRITES = (242, 158, 76)

HOSTILE = "</script><img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"

# A SHARE lock on orders (writes wait), then, after a pause, ACCESS EXCLUSIVE
# on customers (reads and writes wait): two bars, the second further right
# and further down.
CANDIDATE = f"""-- {HOSTILE}
BEGIN;
LOCK TABLE orders IN SHARE MODE;
SELECT pg_sleep(0.2);
LOCK TABLE customers IN ACCESS EXCLUSIVE MODE;
COMMIT;
"""

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browser(*args: str, profile: Path) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    # Offline: in a network namespace of its own, with no interface up.
    if os.geteuid() == 0 and shutil.which("unshare"):
        command = ["unshare", "--net", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def first_pixels(image: Image.Image, colour: tuple[int, int, int]) -> tuple[int, int]:
    """The top-left of the topmost run of `colour`: (x, y)."""
    rgb = image.convert("RGB")
    width, height = rgb.size
    pixels = rgb.load()
    for y in range(height):
        xs = [x for x in range(width) if pixels[x, y] == colour]
        if xs:
            return min(xs), y
    raise AssertionError(f"no pixel of colour {colour} in the screenshot")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: the HTML report was not tested in a browser")
def test_the_html_report_renders_offline_in_order_and_runs_nothing_a_candidate_wrote(daemon, tmp_path):
    candidate = tmp_path / "locks_in_turn.sql"
    candidate.write_text(CANDIDATE)
    page = tmp_path / "report.html"
    done = daemon.cli(
        "migrate", "test", "--golden", "shop", "--format", "markdown", "--html", str(page), str(candidate),
        check=False,
    )
    assert done.returncode in (0, 12), f"{done.stdout} {done.stderr}"
    text = page.read_text()
    # Self-contained: no script, nothing fetched.
    assert "<script" not in text and " src=\"" not in text and "<link" not in text, text
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(page, ARTIFACTS / "migration-report.html")

    profile = tmp_path / "profile"
    dom = browser("--dump-dom", page.as_uri(), profile=profile)
    assert dom.returncode == 0, dom.stderr
    # What the candidate wrote stayed text: no element came of it, and no
    # script set the title.
    assert "pwned" not in dom.stdout.split("</title>")[0], dom.stdout[:2000]
    assert "<img" not in dom.stdout, dom.stdout
    assert "&lt;img src=x onerror=" in dom.stdout

    shot = tmp_path / "report.png"
    drawn = browser("--window-size=1400,1600", f"--screenshot={shot}", page.as_uri(), profile=profile)
    assert drawn.returncode == 0 and shot.exists(), drawn.stderr
    shutil.copy(shot, ARTIFACTS / "migration-report.png")
    image = Image.open(shot)
    share = first_pixels(image, WRITES)
    exclusive = first_pixels(image, READS_AND_WRITES)
    # The SHARE lock was taken first: its bar starts further left and its
    # lane is above; the ACCESS EXCLUSIVE bar starts after the pause.
    assert share[0] < exclusive[0], f"SHARE bar at {share}, ACCESS EXCLUSIVE bar at {exclusive}"
    assert share[1] < exclusive[1], f"SHARE bar at {share}, ACCESS EXCLUSIVE bar at {exclusive}"
